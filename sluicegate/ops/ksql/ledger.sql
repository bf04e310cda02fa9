-- ksqlDB over the admissions ledger (topic sg.ledger; replace `sg.` by your namespace).
--
-- PRECONDITION: ksqlDB's AVRO format reads Confluent framing (byte 00, a 4-byte schema
-- id, the Avro body) and fetches the writer schema from a Schema Registry. sluicegate
-- writes Avro single-object framing (C3 01 + fingerprint) by default, which ksqlDB
-- cannot read. These statements work once the ledger is written with a Confluent
-- framing (sluicegate.schemas.codec.Framing); docs/ledger-sql.md lists the options.
-- Not run against a live ksqlDB in sluicegate's CI.

SET 'auto.offset.reset' = 'earliest';

-- One row per decision. The record key is the request id (plain UTF-8: KEY_FORMAT KAFKA).
-- Columns are LedgerRecord's fields (io.sluicegate.LedgerRecord.avsc), in order; the
-- timestamp-millis fields read as TIMESTAMP. `key` and `position` are quoted: KEY is a
-- ksqlDB keyword.
CREATE STREAM IF NOT EXISTS sg_ledger (
    request_key STRING KEY,
    request_id STRING,
    workflow STRING,
    outcome STRING,
    requested_at_ms TIMESTAMP,
    decided_at_ms TIMESTAMP,
    waited_ms BIGINT,
    folded BIGINT,
    `KEY` STRING,
    stage STRING,
    reason STRING,
    execution_id STRING,
    retry_after_ms BIGINT,
    deferral STRING,
    due_at_ms TIMESTAMP,
    `POSITION` BIGINT,
    declaration_version STRING,
    payload BYTES
) WITH (
    KAFKA_TOPIC = 'sg.ledger',
    KEY_FORMAT = 'KAFKA',
    VALUE_FORMAT = 'AVRO',
    VALUE_AVRO_SCHEMA_FULL_NAME = 'io.sluicegate.LedgerRecord',
    TIMESTAMP = 'decided_at_ms'
);

-- "Twenty edits, one run: did I lose nineteen?" ------------------------------------------
-- Collapsed starts per run that absorbed them, and what the admitted run says it folded.
CREATE TABLE IF NOT EXISTS sg_ledger_collapsed AS
    SELECT execution_id, LATEST_BY_OFFSET(workflow) AS workflow,
           LATEST_BY_OFFSET(`KEY`) AS debounce_key, COUNT(*) AS collapsed
    FROM sg_ledger WHERE outcome = 'collapsed' AND execution_id IS NOT NULL
    GROUP BY execution_id EMIT CHANGES;

CREATE TABLE IF NOT EXISTS sg_ledger_admitted AS
    SELECT execution_id, LATEST_BY_OFFSET(folded) AS folded,
           LATEST_BY_OFFSET(decided_at_ms) AS admitted_at
    FROM sg_ledger WHERE outcome = 'admitted' AND execution_id IS NOT NULL
    GROUP BY execution_id EMIT CHANGES;

CREATE TABLE IF NOT EXISTS sg_ledger_lost AS
    SELECT c.execution_id AS run, c.workflow AS workflow, c.debounce_key AS debounce_key,
           c.collapsed AS collapsed, a.folded AS folded, c.collapsed - a.folded AS lost
    FROM sg_ledger_collapsed c LEFT JOIN sg_ledger_admitted a
      ON c.execution_id = a.execution_id
    EMIT CHANGES;

-- Ask it (pull query): lost = 0 means every collapsed start is in the run; lost NULL
-- means the run has not been admitted yet.
-- SELECT * FROM sg_ledger_lost WHERE workflow = 'tourNarration';

-- "Nothing has run for an hour: stuck, or quiet?" ------------------------------------------
-- The latest decision of every request: its current state.
CREATE TABLE IF NOT EXISTS sg_ledger_latest AS
    SELECT request_id,
           LATEST_BY_OFFSET(workflow) AS workflow,
           LATEST_BY_OFFSET(outcome) AS outcome,
           LATEST_BY_OFFSET(`KEY`) AS control_key,
           LATEST_BY_OFFSET(deferral) AS deferral,
           LATEST_BY_OFFSET(reason) AS reason,
           LATEST_BY_OFFSET(stage) AS stage,
           LATEST_BY_OFFSET(execution_id) AS execution_id,
           LATEST_BY_OFFSET(retry_after_ms) AS retry_after_ms,
           -- When the start's group began waiting (a debounce burst's first start).
           LATEST_BY_OFFSET(UNIX_TIMESTAMP(decided_at_ms) - waited_ms) AS waiting_since_ms,
           LATEST_BY_OFFSET(decided_at_ms) AS decided_at
    FROM sg_ledger GROUP BY request_id EMIT CHANGES;

-- Starts still waiting, per workflow and key. ksqlDB cannot take MIN over a table (it
-- cannot retract), so the count is a table and the age a pull query:
CREATE TABLE IF NOT EXISTS sg_ledger_waiting AS
    SELECT workflow, control_key, COUNT(*) AS queued
    FROM sg_ledger_latest WHERE outcome = 'queued'
    GROUP BY workflow, control_key EMIT CHANGES;

-- Ask it: `waiting=` of every queued start (the largest per key is the key's), then the
-- last start per workflow to tell quiet from stuck (needs table scans enabled:
-- ksql.query.pull.table.scan.enabled=true).
-- SELECT workflow, control_key, request_id,
--        UNIX_TIMESTAMP() - waiting_since_ms AS waiting_ms
--   FROM sg_ledger_latest WHERE outcome = 'queued';
-- SELECT * FROM sg_ledger_waiting;
CREATE TABLE IF NOT EXISTS sg_ledger_last_start AS
    SELECT workflow, MAX(UNIX_TIMESTAMP(requested_at_ms)) AS last_start_ms, COUNT(*) AS starts
    FROM sg_ledger WHERE NOT (request_id LIKE 'run:%')
    GROUP BY workflow EMIT CHANGES;
-- SELECT * FROM sg_ledger_last_start;

-- "Why did my run not start?" ------------------------------------------------------------
-- By request id (a key lookup on the table):
-- SELECT outcome, reason, stage, control_key, deferral, retry_after_ms, execution_id
--   FROM sg_ledger_latest WHERE request_id = 'R';
-- By control key (a table scan):
-- SELECT request_id, outcome, reason, decided_at
--   FROM sg_ledger_latest WHERE control_key = 'K';
