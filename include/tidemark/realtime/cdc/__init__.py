"""Change data capture: a table's own changes, read from the source's WAL by Debezium's PostgreSQL
connector on a Kafka Connect worker.

- ``connector``: the connector's configuration, made from the pipeline's spec (no secret in it).
- ``connect``: Kafka Connect's REST API (create or update, state, restart, pause, resume, stop).
- ``source``: the source side: the publication and the replication role a DBA grants (the SQL to
  run, and the check that it was run), and the slot's retained WAL.
- ``handoff``: the pipeline's slot created with an exported snapshot, which the first batch's reads
  import: the batch and the stream split the table's history at the slot's consistent point.
- ``changes``: Debezium's records, read without trust, grouped by source transaction.
- ``tables``: the real-time table and its serving view (deleted keys hidden), freshness.
- ``apply``: ``ChangeWriter``, the standing sink's part: whole source transactions, once, in commit order.
- ``compact``: what a committed batch corrects in the real-time table.
- ``layer``: ``Changes``, all of the above behind the speed layer's interface (``tidemark.realtime``).

What the supervisor does about a connector each cycle is ``tidemark.streams.capture``.
"""
