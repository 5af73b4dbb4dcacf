"""Example applications, each importable by reference for the CLI and Spark executors:

- ``domain_examples.bank:app``: accounts, deposits, withdrawals, audits, closing;
- ``domain_examples.orders:app``: orders placed, paid, shipped and cancelled;
- ``domain_examples.loyalty:app``: point-of-sale purchases per store, points per customer.

Only the domain layer: nothing here imports Spark, Kafka or Cassandra.
"""
