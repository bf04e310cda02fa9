"""Baseline (c): the same pipe as a faust-streaming agent, exactly-once.

Runs in a virtualenv of its own (faust pins aiokafka; it is never installed into the
project's), so this module imports nothing from sluicegate. Configured by environment:
BENCH_BOOTSTRAP, BENCH_INPUT, BENCH_OUTPUT, BENCH_APP_ID (also the consumer group),
BENCH_DATADIR, BENCH_PARTITIONS, BENCH_COMMIT_INTERVAL_MS, BENCH_COMPRESSION.

    BENCH_...=... /path/to/faust-venv/bin/python -m bench.faust_pipe
"""

from __future__ import annotations

import os
from typing import Any

import faust

_env = os.environ

app = faust.App(
    _env.get("BENCH_APP_ID", "bench-faust"),
    broker=f"kafka://{_env.get('BENCH_BOOTSTRAP', '127.0.0.1:9092')}",
    processing_guarantee="exactly_once",
    # The worker's commit interval and linger; faust has no commit-every-N records.
    broker_commit_interval=int(_env.get("BENCH_COMMIT_INTERVAL_MS", "100")) / 1000,
    producer_linger_ms=5,
    producer_compression_type=_env.get("BENCH_COMPRESSION") or None,
    topic_partitions=int(_env.get("BENCH_PARTITIONS", "6")),
    topic_allow_declare=False,
    datadir=_env.get("BENCH_DATADIR", "/tmp/bench-faust"),
    web_enabled=False,
    consumer_auto_offset_reset="earliest",
)

source = app.topic(_env.get("BENCH_INPUT", "in"), key_serializer="raw", value_serializer="raw")
sink = app.topic(_env.get("BENCH_OUTPUT", "out"), key_serializer="raw", value_serializer="raw")


@app.agent(source)
async def pipe(stream: Any) -> None:
    async for event in stream.events():
        await sink.send(key=event.key, value=event.value)


if __name__ == "__main__":
    import sys

    sys.argv = ["faust", "worker", "--loglevel", _env.get("BENCH_LOGLEVEL", "warn"),
                "--without-web"]
    app.main()
