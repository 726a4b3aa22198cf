-- Tidemark scale-out mode: one Postgres cluster, three databases.
-- Runs once, on first start with an empty data volume, as the POSTGRES_USER
-- (tidemark), which therefore owns all three.
CREATE DATABASE tidemark_source;
CREATE DATABASE tidemark_warehouse;
CREATE DATABASE airflow;
