-- ksqlDB over the admissions ledger, topic sg.ledger (`sluicegate ledger ksql --namespace NS`
-- prints this file for another namespace's topic). docs/ledger-sql.md, "ksqlDB".
--
-- Needs a schema registry: every sluicegate process runs with SLUICEGATE_SCHEMA_REGISTRY_URL
-- set, and ksqlDB's ksql.schema.registry.url names the same registry. sluicegate then
-- writes each ledger record as 00, the 4-byte id of its schema in that registry, and the
-- Avro body: what VALUE_FORMAT 'AVRO' reads, fetching the writer schema by that id. Run
-- `sluicegate topics create` with the registry configured before these statements: it
-- registers LedgerRecord under the subject sg.ledger-value, so ksqlDB finds the topic's
-- schema there instead of registering one of its own. Records written before the registry
-- was configured (C3 01 framing) are skipped by ksqlDB, with a line in its processing log;
-- `sluicegate ledger` reads both.
--
-- Written for ksqlDB 0.29 and checked against io.sluicegate.LedgerRecord.avsc by
-- tests/unit/test_ksql_definitions.py; ksqlDB itself is not run in sluicegate's CI.
-- Lines under `--   ` (three spaces) are the queries to ask: pull queries, which a
-- script run by RUN SCRIPT may not contain.

SET 'auto.offset.reset' = 'earliest';

-- One row per decision. The record key is the request id, plain UTF-8: KEY_FORMAT 'KAFKA'.
-- The value columns are declared rather than inferred from sg.ledger-value: ksqlDB refuses
-- a key column and a value column of the same name, and the value's request_id is the key
-- itself, so it is left out; a declared list is also what the test checks against the
-- schema. Columns are matched to Avro fields by name, case aside; timestamp-millis fields
-- read as TIMESTAMP. `KEY` and `POSITION` are quoted: KEY is a ksqlDB keyword.
CREATE STREAM IF NOT EXISTS sg_ledger (
    request_id STRING KEY,
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
    payload BYTES,
    control STRING
) WITH (
    KAFKA_TOPIC = 'sg.ledger',
    KEY_FORMAT = 'KAFKA',
    VALUE_FORMAT = 'AVRO',
    TIMESTAMP = 'decided_at_ms'
);

-- "Twenty edits, one run: did that work, or did I lose nineteen?" ------------------------
-- Per run that starts were collapsed into: how many collapsed (rows `collapsed`), how
-- many its `admitted` row says it folded, and the difference. lost = 0: nothing lost;
-- lost NULL: the run is not admitted yet (MAX skips the NULLs of the collapsed rows).
CREATE TABLE IF NOT EXISTS sg_ledger_lost AS
    SELECT execution_id,
           LATEST_BY_OFFSET(workflow) AS workflow,
           SUM(CASE WHEN outcome = 'collapsed' THEN 1 ELSE 0 END) AS collapsed,
           MAX(CASE WHEN outcome = 'admitted' THEN folded ELSE CAST(NULL AS BIGINT) END)
               AS folded,
           SUM(CASE WHEN outcome = 'collapsed' THEN 1 ELSE 0 END)
               - MAX(CASE WHEN outcome = 'admitted' THEN folded ELSE CAST(NULL AS BIGINT) END)
               AS lost
    FROM sg_ledger
    WHERE execution_id IS NOT NULL AND (outcome = 'collapsed' OR outcome = 'admitted')
    GROUP BY execution_id
    EMIT CHANGES;

-- Ask it: one run (a key lookup), or every run of a workflow (a table scan, which needs
-- ksql.query.pull.table.scan.enabled=true):
--   SELECT execution_id, workflow, collapsed, folded, lost
--     FROM sg_ledger_lost WHERE execution_id = 'E';
--   SELECT execution_id, collapsed, folded, lost
--     FROM sg_ledger_lost WHERE workflow = 'tourNarration';

-- "Nothing has run for an hour. Stuck, or quiet?" -----------------------------------------
-- The latest decision of every request is its current state (a request's rows share a
-- partition, so offset order is decision order). LATEST_BY_OFFSET(x, FALSE) keeps the
-- latest row's NULLs: without it a field would come from an older row of the request.
CREATE TABLE IF NOT EXISTS sg_ledger_latest AS
    SELECT request_id,
           LATEST_BY_OFFSET(workflow, FALSE) AS workflow,
           LATEST_BY_OFFSET(outcome, FALSE) AS outcome,
           LATEST_BY_OFFSET(`KEY`, FALSE) AS control_key,
           LATEST_BY_OFFSET(stage, FALSE) AS stage,
           LATEST_BY_OFFSET(reason, FALSE) AS reason,
           LATEST_BY_OFFSET(deferral, FALSE) AS deferral,
           LATEST_BY_OFFSET(execution_id, FALSE) AS execution_id,
           LATEST_BY_OFFSET(retry_after_ms, FALSE) AS retry_after_ms,
           LATEST_BY_OFFSET(UNIX_TIMESTAMP(due_at_ms), FALSE) AS due_at_ms,
           LATEST_BY_OFFSET(UNIX_TIMESTAMP(decided_at_ms), FALSE) AS decided_at_ms,
           -- When its wait began: for a debounce, the burst's first start.
           LATEST_BY_OFFSET(UNIX_TIMESTAMP(decided_at_ms) - waited_ms, FALSE)
               AS waiting_since_ms
    FROM sg_ledger
    GROUP BY request_id
    EMIT CHANGES;

-- Starts still waiting, per workflow and control key (a start parked without a key counts
-- under ''). ksqlDB cannot take MIN over a table, so the age is asked of sg_ledger_latest.
CREATE TABLE IF NOT EXISTS sg_ledger_waiting AS
    SELECT workflow, COALESCE(control_key, '') AS control_key, COUNT(*) AS queued
    FROM sg_ledger_latest
    WHERE outcome = 'queued'
    GROUP BY workflow, COALESCE(control_key, '')
    EMIT CHANGES;

-- The last start each workflow received: quiet (nothing queued, starts long ago) or
-- stuck (queued starts waiting). `run:` rows are about runs, not starts.
CREATE TABLE IF NOT EXISTS sg_ledger_last_start AS
    SELECT workflow, MAX(UNIX_TIMESTAMP(requested_at_ms)) AS last_start_ms,
           COUNT(*) AS decisions
    FROM sg_ledger
    WHERE NOT (request_id LIKE 'run:%')
    GROUP BY workflow
    EMIT CHANGES;

-- Ask it: `waiting=` of every queued start, with what parked it; then how
-- many wait per key, and each workflow's last start (table scans):
--   SELECT workflow, control_key, request_id, deferral, due_at_ms,
--          UNIX_TIMESTAMP() - waiting_since_ms AS waiting_ms
--     FROM sg_ledger_latest WHERE outcome = 'queued';
--   SELECT workflow, control_key, queued FROM sg_ledger_waiting;
--   SELECT workflow, last_start_ms, UNIX_TIMESTAMP() - last_start_ms AS quiet_for_ms
--     FROM sg_ledger_last_start;

-- "Why did my run not start?" -------------------------------------------------------------
-- The request's latest decision: its outcome and the reason, in words. By request id (a
-- key lookup), or the requests whose latest decision was on a control key (a table scan):
--   SELECT request_id, workflow, outcome, reason, stage, control_key, deferral, due_at_ms,
--          retry_after_ms, execution_id
--     FROM sg_ledger_latest WHERE request_id = 'R';
--   SELECT request_id, outcome, reason, decided_at_ms
--     FROM sg_ledger_latest WHERE control_key = 'K';
