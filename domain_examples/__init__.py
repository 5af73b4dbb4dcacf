"""Example applications, each importable by reference for the CLI and Spark executors:

- ``domain_examples.bank:app``: accounts, deposits, withdrawals, audits, closing;
- ``domain_examples.orders:app``: orders placed, paid, shipped and cancelled;
- ``domain_examples.loyalty:app``: point-of-sale purchases per store, points per customer;
- ``domain_examples.ticketing:app``: ticket orders carrying the customer's name and e-mail as
  personal data (encrypted per customer, forgotten with ``cqrs forget``).

Only the domain layer: nothing here imports Spark, Kafka or Cassandra.
"""
