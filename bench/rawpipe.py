"""Baseline (a): the raw transactional consume -> produce pipe, in Python, with confluent-kafka.

One read_committed consumer, one transactional producer, `send_offsets_to_transaction`,
and the worker's own client settings, batch size and commit interval
(`sluicegate.engine.runtime.Worker`). Nothing is decoded: this is the cost of
exactly-once transport alone. Runs until SIGTERM or SIGINT.

By default each input record is copied unchanged to one output topic. With
`--output TOPIC:SIZE` given several times, each input writes one record to every such
topic, its value SIZE bytes long (the input's bytes, repeated or cut) and its key the
input's: the same records, by count and size, that an admission writes. With `--floor`,
each input is admitted by `bench.floor.Floor` instead: the least work any Python
passthrough does, writing the worker's own three records (the outputs are its topics);
with `--bound` as well, by `bench.floor.Bound` (the floor less building and encoding).

    python -m bench.rawpipe --bootstrap HOST:PORT --input T --output T --group G
    python -m bench.rawpipe ... --output sg.admitted:172 --output sg.ledger:150 ...
    python -m bench.rawpipe ... --floor NAMESPACE --state-dir DIR [--bound]
"""

from __future__ import annotations

import argparse
import signal
import time
import uuid
from pathlib import Path
from types import FrameType

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from bench.floor import Bound, Floor, sized
from sluicegate.config import Settings
from sluicegate.engine.runtime import producer_tuning


def run(bootstrap: str, input_topic: str, outputs: list[tuple[str, int | None]],
        group: str, floor: Floor | None = None) -> int:
    settings = Settings(bootstrap=bootstrap)
    stop = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    # The same client settings as the worker's (runtime.Worker.__init__).
    producer = Producer(settings.client_config(**{
        "transactional.id": f"{group}-{uuid.uuid4().hex[:12]}",
        **producer_tuning(settings),
    }))
    consumer = Consumer(settings.client_config(**{
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "fetch.wait.max.ms": 20,
    }))
    producer.init_transactions(30.0)
    consumer.subscribe([input_topic])
    max_records = settings.commit_max_records
    interval_s = settings.commit_interval_ms / 1000
    progress: dict[int, int] = {}
    in_txn = False
    started = 0.0
    records = 0
    processed = 0

    def commit() -> None:
        nonlocal in_txn
        if producer.flush(30.0):
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "undelivered at commit"))
        offsets = [TopicPartition(input_topic, p, o) for p, o in progress.items()]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30.0)
        producer.commit_transaction(30.0)
        if floor is not None:
            floor.commit()
        progress.clear()
        in_txn = False

    try:
        while not stop:
            # As the worker's loop (Worker.run_once): wait for one, take what is fetched.
            first = consumer.poll(0.05)
            messages = [] if first is None else [
                first, *consumer.consume(max_records - 1, timeout=0)]
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                if not in_txn:
                    producer.begin_transaction()
                    in_txn = True
                    started = time.monotonic()
                    records = 0
                key, value = msg.key(), msg.value() or b""
                if floor is not None:
                    admission = floor.admit(value, msg.partition() or 0)
                    for topic, out_key, out, partition in admission:
                        while True:
                            try:
                                producer.produce(topic, out, out_key, partition)
                                break
                            except BufferError:
                                producer.poll(0.05)
                for topic, size in outputs:
                    out = value if size is None else sized(value, size)
                    while True:
                        try:
                            producer.produce(topic, out, key)
                            break
                        except BufferError:
                            producer.poll(0.05)
                progress[msg.partition()] = msg.offset() + 1  # type: ignore[operator,index]
                records += 1
                processed += 1
            if in_txn and (records >= max_records or time.monotonic() - started >= interval_s):
                commit()
        if in_txn:
            commit()
    finally:
        consumer.close()
        producer.flush(5.0)
        if floor is not None:
            floor.close()
    return processed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", action="append", default=[],
                        help="TOPIC (a copy of the input) or TOPIC:SIZE; repeatable")
    parser.add_argument("--group", required=True)
    parser.add_argument("--floor", metavar="NAMESPACE", default=None,
                        help="admit each input as bench.floor does, to that namespace's "
                             "topics (bench.apps' workflow)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="--floor's RocksDB store")
    parser.add_argument("--bound", action="store_true",
                        help="with --floor: make the records' bytes at no cost (bench.floor)")
    args = parser.parse_args()
    outputs = [(topic, int(size) if size else None)
               for topic, _, size in (o.partition(":") for o in args.output)]
    floor = None
    if args.floor is not None:
        if args.state_dir is None:
            parser.error("--floor needs --state-dir")
        from bench.apps import WORKFLOW, app
        floor = (Bound if args.bound else Floor)(
            app, WORKFLOW, Settings(bootstrap=args.bootstrap, namespace=args.floor),
            args.state_dir)
    elif not outputs:
        parser.error("give --output, or --floor")
    processed = run(args.bootstrap, args.input, outputs, args.group, floor)
    print(f"rawpipe: {processed} records piped")


if __name__ == "__main__":
    main()
