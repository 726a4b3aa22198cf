"""The embedded local stack: a private PostgreSQL cluster, a single-node Kafka broker (KRaft),
Spark's connector jars and Airflow's home, all under the state directory.

Run it as ``python -m tidemark_workshop.stack up|down|status|logs|env|run|ui`` (the Makefile does).
"""
