"""The speed layer: payment events (``events``) and the source database's own changes captured by
Debezium (``cdc/``), applied to real-time tables and served beside the batch tables."""
