"""Tidemark's workshop: what builds and exercises Tidemark on one machine, never what a deployment runs.

The local stack (``tidemark_workshop.stack``: PostgreSQL, Kafka, Spark and Airflow under one
state directory), its settings, the demo core-banking source (``bank``) and its simulator
(``bank_traffic``), the demo (``demo``) and the batch harness the tests and benchmarks drive
(``stack.batchrun``). It imports the product package ``tidemark``; ``tidemark`` never imports it.
"""
