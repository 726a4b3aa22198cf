"""The nightly batch path: its sequence (``sequence``: the steps' names, as the DAG and the local runner
follow them), the orchestrator's steps (``steps``: plan, begin, end, abort), the extract (``extract/``),
the stage a batch is applied from (``stage``) and repair batches (``repair``)."""
