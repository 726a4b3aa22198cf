"""The two-phase batch sink: stage records, apply a batch only when it is complete and verified.

``BatchSink.apply`` takes one micro-batch of records read from the pipeline topic (a pyarrow
table, as the Spark sink job hands it over) and, in ONE PostgreSQL transaction:

1. checks the sink still holds the newest fencing token (a zombie sink can never commit);
2. handles BEGIN and ABORT in offset order. Control messages are trusted only as far as the
   ledger confirms them: a BEGIN must name an attempt the orchestrator opened for a batch it
   planned, with the planned window; anything else goes to the dead-letter topic;
3. validates every data record of an open attempt (``tidemark.protocol.records``: encoding, shape, key,
   lossless fit to the target's columns, inside the batch's window) and stages the good ones
   (COPY into the attempt's own table, plus running per-partition counts and checksums); bad
   records, records of unknown batches and late records of committed ones are dead letters.
   Under protocol version 2 the Spark tasks staged the good records already (``tidemark.batch.stage``):
   the sink accepts their loads and totals here, and the apply reads only accepted loads;
4. applies the real-time records (the speed layer's, ``tidemark.realtime``: the events of the spec's
   ``stream``, or the source's changes of its ``cdc``) as they arrive, to the real-time table, with
   their source position and micro-batch, one row per primary key; events the committed watermark
   covers are in the batch target already and are skipped;
5. records END messages; for every attempt whose END has arrived on all partitions, compares
   per-partition row counts and checksums with what was staged, then either applies the batch
   (merge into the target, ledger, watermark, and the real-time rows inside its window removed:
   the batch is their truth now) or refuses it: with expected and actual numbers, or with the
   count and first reasons of its dead letters;
6. writes the dead letters to ``sink_rejects`` with their original bytes, stores the next offset
   of every partition it read, and records the micro-batch id under the fencing token; after the
   commit, the dead-letter outbox publishes them (``tidemark.sink.dead_letters``: exactly once, however
   the job dies).

Records below the stored offsets, and a micro-batch id already recorded under this token (Spark
replays a micro-batch whose commit it did not see), are skipped: a replay changes nothing.

A crash anywhere rolls the whole micro-batch back, and the next start resumes from the stored
offsets, so every record has exactly one effect. No reader sees part of a batch: the target is
only touched by step 5, inside the same transaction as the ledger row that says "committed".

Where each part lives: ``apply`` (``BatchSink``, which sequences the steps above), ``intake`` (steps 2
and 3: control messages, records), ``verify`` (step 5's END and checks: apply only what the ledger says
the batch is, or refuse), ``commit`` (step 5's apply: the merge, the ledger, the watermark, the speed
layer's compaction), ``target`` (the target's columns and record rules), ``report``
(``MicroBatchReport``, ``Rejects``: every dead letter, and the two errors), ``stages`` (the stage
tables), ``controls`` (what the ledger says of a control message), ``merge`` (the SQL that writes a
verified batch). Step 4 is the speed layer's (``tidemark.realtime``). The totals check is
``tidemark.protocol.totals.staged_mismatch``; the executors' staging is ``tidemark.batch.stage``.
"""

from __future__ import annotations

from tidemark.batch.stage import STAGE_SCHEMA, stage_table  # noqa: F401
from tidemark.sink.apply import BatchSink  # noqa: F401
from tidemark.sink.report import FencedError, MicroBatchReport, SinkError  # noqa: F401
