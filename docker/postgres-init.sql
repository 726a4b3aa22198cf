-- Tidemark scale-out mode: one Postgres cluster, three databases.
-- Runs once, on first start with an empty data volume, as the POSTGRES_USER
-- (tidemark), which therefore owns all three; psql runs it with ON_ERROR_STOP.
CREATE DATABASE tidemark_source;
CREATE DATABASE tidemark_warehouse;
CREATE DATABASE airflow;

-- The role the source connection (tidemark_source) logs in as, as in the local stack
-- (tidemark_workshop/stack/postgres.py, create_source_reader): SELECT on the tables of the
-- owner role, today's and future ones, and pg_read_all_stats (to see the open transactions
-- that hold a window back), nothing more. A table created by another role needs its own
-- GRANT SELECT ON <table> TO tidemark_reader.
-- Its password comes from the container's environment (compose requires it), never from here.
\getenv reader_password TIDEMARK_SOURCE_PASSWORD
\if :{?reader_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'TIDEMARK_SOURCE_PASSWORD is not set: the read-only source role needs a password'; END $$;
\endif
CREATE ROLE tidemark_reader LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'reader_password';
\unset reader_password
GRANT pg_read_all_stats TO tidemark_reader;
GRANT CONNECT ON DATABASE tidemark_source TO tidemark_reader;

-- The replication role Debezium reads the source's WAL as (change data capture), as in the local
-- stack (create_cdc_role): LOGIN REPLICATION and nothing more. Each CDC pipeline's publication and
-- SELECT on its table are granted apart by the table's owner (tidemark.realtime.cdc.source.grant_sql).
\getenv cdc_password TIDEMARK_CDC_PASSWORD
\if :{?cdc_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'TIDEMARK_CDC_PASSWORD is not set: the replication role needs a password'; END $$;
\endif
CREATE ROLE tidemark_cdc LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'cdc_password';
\unset cdc_password
GRANT CONNECT ON DATABASE tidemark_source TO tidemark_cdc;

-- Default privileges and grants are per database: set them inside the source database.
\connect tidemark_source
ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER GRANT USAGE ON SCHEMAS TO tidemark_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE CURRENT_USER GRANT SELECT ON TABLES TO tidemark_reader;
GRANT USAGE ON SCHEMA public TO tidemark_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO tidemark_reader;
