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
"""

from __future__ import annotations

import argparse
import signal
import time
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


def run(settings: Settings, group: str, mode: str) -> int:
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
    args = parser.parse_args()
    settings = Settings(bootstrap=args.bootstrap, namespace=args.namespace)
    handled = run(settings, args.group, args.mode)
    print(f"gate_engine: {handled} admitted records reported")


if __name__ == "__main__":
    main()
