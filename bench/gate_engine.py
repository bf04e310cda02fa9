"""The engine `bench.gate` runs beside a worker whose runs hold something until they end
(concurrency slots, singleton holds): every admitted run is reported at once.

Raw confluent-kafka, not the SDK's `sluicegate.client.Engine`: the SDK takes one record
per `poll()` and one `produce` + `poll(0)` per report, Python work per record that would
make this process, which shares the broker's CPU, the slowest part of the loop. This one
consumes the admitted topic read_committed in batches and writes the same `RunEvent`
records the SDK writes (same topic, key, encoding and producer settings).

- `--mode runs`: each admitted run is reported `started`, then `completed`.
- `--mode steps`: a fresh run is reported `started`, `suspended` (a steps-mode slot goes
  back) and `resumed` (the run waits for a slot again); its re-admission (`kind=resume`)
  is then reported `completed`.

    python -m bench.gate_engine --bootstrap HOST:PORT --namespace NS. --group G --mode runs

Runs until SIGTERM or SIGINT; prints how many admitted records it reported.

`--report FILE`: at the end, the most runs each stage's slots (concurrency, singleton) had
in flight on one key, as JSON. Every admitted record holds its slots from its CreateTime
(the worker's clock, after its decision) and the one report that gives them back
(`completed`, or `suspended` in steps mode) is written at once, stamped before it is
produced. Whatever worker took the decision, at an instant T it had admitted at least the
runs stamped up to T and read at most the reports stamped up to T, so (held up to T) -
(given back up to T) is a lower bound of what it had in flight: above the limit is a
limit broken, never a clock's artefact (one machine, one clock; ms rounding counted in
the worker's favour).
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedKind, AdmittedStart, RunEvent, RunEventKind
from sluicegate.topology.topics import Topics

STARTED, SUSPENDED, RESUMED, COMPLETED = (RunEventKind.started, RunEventKind.suspended,
                                          RunEventKind.resumed, RunEventKind.completed)


def reports(admitted: AdmittedStart, mode: str) -> tuple[RunEventKind, ...]:
    if mode == "steps":
        if admitted.kind is AdmittedKind.resume:
            return (COMPLETED,)
        return (STARTED, SUSPENDED, RESUMED)
    return (STARTED, COMPLETED)


class InFlight:
    """Per slot (stage, key): the CreateTimes of the admitted records holding it and the
    times of the reports giving it back (see the module's docstring)."""

    def __init__(self) -> None:
        self.held: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        self.freed: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        self.seen: set[tuple[str, AdmittedKind]] = set()

    def add(self, admitted: AdmittedStart, created_ms: int, freed_ms: int) -> None:
        if (admitted.execution_id, admitted.kind) in self.seen:
            return  # delivered again: it holds nothing more
        self.seen.add((admitted.execution_id, admitted.kind))
        for slot in admitted.slots:
            self.held[slot.stage, slot.key].append(created_ms)
            self.freed[slot.stage, slot.key].append(freed_ms)

    def most(self) -> dict[str, dict[str, int | str]]:
        """stage -> the most runs one key had in flight, and that key."""
        out: dict[str, dict[str, int | str]] = {}
        for (stage, key), held in self.held.items():
            freed = sorted(self.freed[stage, key])
            given_back = 0
            most = 0
            for n, at in enumerate(sorted(held), 1):
                while given_back < len(freed) and freed[given_back] <= at:
                    given_back += 1
                most = max(most, n - given_back)
            if most > int(out.get(stage, {}).get("max", -1)):
                out[stage] = {"max": most, "key": key}
        return out


def run(settings: Settings, group: str, mode: str, in_flight: InFlight) -> int:
    stop = False

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    topics = Topics(settings)
    # The SDK engine's settings (sluicegate.client.engine.Engine).
    consumer = Consumer(settings.client_config(**{
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": True,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",
        "fetch.wait.max.ms": 20,
        "session.timeout.ms": 10000,
    }))
    producer = Producer(settings.client_config(**{
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "linger.ms": 2,
    }))
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    consumer.subscribe([topics.admitted])
    handled = 0
    try:
        while not stop:
            for msg in consumer.consume(1000, timeout=0.05):
                if msg.error() is not None or msg.value() is None:
                    continue
                admitted = codec.decode(AdmittedStart, msg.value())
                key = admitted.execution_id.encode()
                now = int(time.time() * 1000)
                if admitted.slots:
                    in_flight.add(admitted, msg.timestamp()[1], now)
                for kind in reports(admitted, mode):
                    value = codec.encode(RunEvent(execution_id=admitted.execution_id,
                                                  workflow=admitted.workflow, kind=kind,
                                                  at_ms=now))
                    while True:
                        try:
                            producer.produce(topics.run_events, value, key,
                                             on_delivery=delivered)
                            break
                        except BufferError:
                            producer.poll(0.05)
                handled += 1
            producer.poll(0)
            if errors:
                raise KafkaException(errors[0])
    finally:
        producer.flush(10.0)
        consumer.close()
    return handled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--mode", choices=("runs", "steps"), default="runs")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE",
                        help="write the most runs in flight per stage's key here (JSON)")
    args = parser.parse_args()
    settings = Settings(bootstrap=args.bootstrap, namespace=args.namespace)
    in_flight = InFlight()
    handled = run(settings, args.group, args.mode, in_flight)
    most = in_flight.most()
    if args.report is not None:
        args.report.write_text(json.dumps(most))
    print(f"gate_engine: {handled} admitted records reported; most in flight {most}")


if __name__ == "__main__":
    main()
