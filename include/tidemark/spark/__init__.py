"""Tidemark's Spark jobs from both ends: ``jobs`` (the batch's steps and each job's command line and
settings, as the orchestrator and the local runner submit them) and ``entry`` (what every entry
script in ``spark_jobs/`` needs once it runs: arguments, secrets, a session, a database connection,
and how it exits)."""
