"""Tests on the local cluster (`cqrs dev up --cluster`), which their conftest starts once for
all of them and stops as soon as they finished (a package: its ``__init__`` makes the
``package`` scope end here, before ``tests/reliability/test_model.py`` runs on the single stack).
"""
