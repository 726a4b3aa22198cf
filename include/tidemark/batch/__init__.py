"""The nightly batch path: the orchestrator's steps (``steps``: plan, begin, end, abort), the extract
(``extract/``), the stage a batch is applied from (``stage``) and repair batches (``repair``)."""
