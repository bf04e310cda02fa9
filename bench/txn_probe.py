"""What one transaction costs the client the worker uses, by the partitions it writes.

`python -m bench.txn_probe [--partitions 1,6,18,36] [--transactions 60]`: a transactional
confluent-kafka producer with the worker's settings (`producer_tuning`) writes
`--records` records per transaction, spread evenly over `--partitions` partitions of six
topics, then flushes and commits; one transaction after another, `--spread-ms` apart
(the records produced evenly over that time, as a worker's cycle at steady arrivals
produces them), for each count of partitions in turn. It prints, per count, the flush's
and the commit's milliseconds (p50 / p99) and how often the transaction's first
AddPartitionsToTxn was refused because the previous transaction's markers were still
being written (`CONCURRENT_TRANSACTIONS`, which librdkafka retries about every 20 ms; read
from its `eos` debug lines).

A worker's cycle commits one such transaction, and every partition it wrote that cycle is
one of them: the admitted starts', the ledger's and the runs table's, the stage topics'
and each stateful stage's changelog (bench.gate's scenarios write 15-40 per cycle). This
is the floor under a cycle's commit that no work in the worker can lower
(docs/benchmarks.md, "The latency bounds"). The broker is `SLUICEGATE_BOOTSTRAP`, or a
local one started on free ports and stopped at the end.
"""

from __future__ import annotations

import argparse
import logging
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.passthrough import broker, percentiles
from sluicegate.config import Settings
from sluicegate.engine.runtime import producer_tuning

TOPICS = 6  # partitions are spread over this many topics of this many partitions each
REFUSED = "another concurrent operation on the same transaction"


class Refusals(logging.Handler):
    """Counts librdkafka's debug lines saying an AddPartitionsToTxn was refused."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if REFUSED in record.getMessage():
            self.count += 1


def probe(settings: Settings, topics: list[str], partitions: int, records: int,
          transactions: int, spread_s: float) -> dict[str, float]:
    refusals = Refusals()
    logger = logging.getLogger(f"bench.txn_probe.{partitions}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(refusals)
    targets = [(topics[i % TOPICS], i // TOPICS) for i in range(partitions)]
    producer = Producer(settings.client_config(**{
        **producer_tuning(settings), "logger": logger, "debug": "eos",
        "transactional.id": f"{settings.namespace}probe-{partitions}"}))
    producer.init_transactions(30)
    value = b"x" * 200
    flushes: list[float] = []
    commits: list[float] = []
    refused_in: list[int] = []
    for n in range(transactions + 2):  # the first two: connections, metadata
        producer.begin_transaction()
        before = refusals.count
        started = time.monotonic()
        for i in range(records):
            topic, partition = targets[i % partitions]
            producer.produce(topic, value, str(i).encode(), partition)
            if spread_s:
                pause = started + spread_s * (i + 1) / records - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
        t0 = time.monotonic()
        producer.flush(30)
        t1 = time.monotonic()
        producer.commit_transaction(30)
        t2 = time.monotonic()
        if n >= 2:
            flushes.append((t1 - t0) * 1000)
            commits.append((t2 - t1) * 1000)
            refused_in.append(refusals.count - before)
    producer.flush(10)
    flush, commit = percentiles(flushes), percentiles(commits)
    return {
        "flush_p50": flush["p50"], "flush_p99": flush["p99"],
        "commit_p50": commit["p50"], "commit_p99": commit["p99"],
        "refused_share": sum(1 for r in refused_in if r) / len(refused_in),
        "refusals_max": max(refused_in),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1,6,18,36",
                        help="partitions written per transaction, comma-separated")
    parser.add_argument("--records", type=int, default=600, help="records per transaction")
    parser.add_argument("--transactions", type=int, default=60)
    parser.add_argument("--spread-ms", type=float, default=100.0,
                        help="produce each transaction's records over this long (0: at once)")
    args = parser.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    if max(counts) > TOPICS * 6:
        parser.error(f"at most {TOPICS * 6} partitions per transaction")
    with broker() as bootstrap:
        settings = Settings(bootstrap=bootstrap, namespace=f"probe{int(time.time())}.",
                            partitions=6)
        topics = [f"{settings.namespace}t{i}" for i in range(TOPICS)]
        admin = AdminClient(settings.client_config())
        for future in admin.create_topics([NewTopic(t, 6, 1) for t in topics]).values():
            future.result(30)
        try:
            print(f"{args.records} records per transaction over {args.spread_ms:.0f} ms, "
                  f"{args.transactions} transactions per row")
            print("| partitions per transaction | flush ms p50 / p99 | commit ms p50 / p99 "
                  "| transactions refused at first (CONCURRENT_TRANSACTIONS) | most refusals "
                  "in one |")
            print("| ---: | --- | --- | ---: | ---: |")
            for partitions in counts:
                r = probe(settings, topics, partitions, args.records, args.transactions,
                          args.spread_ms / 1000)
                print(f"| {partitions} | {r['flush_p50']:.1f} / {r['flush_p99']:.1f} | "
                      f"{r['commit_p50']:.1f} / {r['commit_p99']:.1f} | "
                      f"{r['refused_share']:.0%} | {r['refusals_max']:.0f} |", flush=True)
        finally:
            for future in admin.delete_topics(topics, operation_timeout=30).values():
                future.result(30)


if __name__ == "__main__":
    main()
