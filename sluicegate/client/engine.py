"""The engine SDK: consume admitted starts, report each run's lifecycle, receive commands.

An engine consumes `sg.admitted` and `sg.commands` in one consumer group. Both topics are
keyed by execution id with the same partition count, and the range assignor gives an
engine instance the same partitions of both, so the commands for a run reach the
instance that holds it. Offsets are committed after a run has been reported `started`
(at-least-once towards the engine: an engine that dies before that sees the start again,
and the execution id lets it recognise a run it already began), and a command's once the
engine asks for its next delivery, that is after it acted on the command (an engine that
dies while acting on it gets it again; `command_id` tells a repeat).

An admitted start carries the trace context its producer started (`traceparent`), and
`Delivery.span()` continues that trace with OpenTelemetry when it is installed
(docs/decisions/traces.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from sluicegate import tracing
from sluicegate.config import Settings
from sluicegate.kafkautil import check_access
from sluicegate.schemas import codec
from sluicegate.schemas.payloads import Payloads
from sluicegate.schemas.records import AdmittedStart, EngineCommand, RunEvent, RunEventKind
from sluicegate.topology.framing import configure_codec
from sluicegate.topology.topics import Topics


@dataclass(frozen=True, slots=True)
class Delivery:
    """One record for the engine: an admitted start or a command."""

    admitted: AdmittedStart | None = None
    command: EngineCommand | None = None
    _position: TopicPartition | None = None
    _payloads: Payloads | None = None
    # The record's W3C trace context (`traceparent`, `tracestate`), when it carries one.
    trace: tracing.Headers | None = None

    @property
    def lease_ms(self) -> int | None:
        """The admitted run's lease: if sluicegate hears nothing of the run for this long
        (the worker's own time), it records the run failed (lost), frees its holds, starts
        its onFailure and sends a cancel. None: the run has no lease, heartbeats are not
        needed (docs/wire-format.md, Being an engine)."""
        return self.admitted.lease_ms if self.admitted is not None else None

    @property
    def heartbeat_every_ms(self) -> int | None:
        """How often to call `Engine.heartbeat` for the admitted run while it is held
        (running, or suspended in a `runs`-mode workflow); None: no heartbeat is needed."""
        return self.admitted.heartbeat_every_ms if self.admitted is not None else None

    def payload(self) -> Any:
        """The admitted start's payload as data, opened if sealed (`admitted.payload`
        stays the bytes as kept)."""
        assert self.admitted is not None
        return (self._payloads or Payloads(None)).open(self.admitted.payload)

    def span(self, name: str | None = None) -> AbstractContextManager[Any]:
        """A span for acting on this delivery, current inside the block, that continues the
        trace the start's producer began (`trace`; a trace of its own without one):
        `with delivery.span(): run it`. Recorded with the process's OpenTelemetry tracer
        provider, named `run <workflow>` (`cancel <workflow>` for a command) unless
        `name` says otherwise; yields the span, or None without OpenTelemetry installed."""
        record: AdmittedStart | EngineCommand
        if self.admitted is not None:
            what, record = "run", self.admitted
        else:
            assert self.command is not None
            what, record = self.command.kind.value, self.command
        return tracing.continued(name or f"{what} {record.workflow}", self.trace, {
            "sluicegate.workflow": record.workflow,
            "sluicegate.execution_id": record.execution_id,
        })


class Engine:
    def __init__(self, bootstrap: str | None = None, *, group: str,
                 settings: Settings | None = None) -> None:
        settings = settings or Settings()
        if bootstrap is not None:
            settings = settings.with_(bootstrap=bootstrap)
        self.settings = settings
        self.topics = Topics(settings)
        self._payloads = Payloads.of(settings)
        check_access(settings)
        configure_codec(settings)
        self._consumer = Consumer(settings.client_config(**{
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "range",
            "fetch.wait.max.ms": 20,
            "session.timeout.ms": 10000,
        }))
        self._consumer.subscribe([self.topics.admitted, self.topics.commands])
        self._producer = Producer(settings.client_config(**{
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 2,
        }))
        self._errors: list[KafkaError] = []
        # The last command delivered: its offset is stored when the next delivery is asked
        # for (or the engine closes), once the engine has acted on it.
        self._command_done: TopicPartition | None = None

    def poll(self, timeout: float = 1.0) -> Delivery | None:
        self._acknowledge_command()
        msg = self._consumer.poll(timeout)
        if msg is None or msg.error() is not None or msg.value() is None:
            return None
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        position = TopicPartition(topic, partition, offset + 1)
        # A list of (name, value) as the consumer gives them.
        headers = msg.headers()
        trace = tracing.trace_of(headers) if isinstance(headers, list) else None
        if msg.topic() == self.topics.admitted:
            return Delivery(admitted=codec.decode(AdmittedStart, msg.value()),
                            _position=position, _payloads=self._payloads, trace=trace)
        self._command_done = position
        return Delivery(command=codec.decode(EngineCommand, msg.value()), trace=trace)

    def _acknowledge_command(self) -> None:
        if self._command_done is not None:
            self._consumer.store_offsets(offsets=[self._command_done])
            self._command_done = None

    def __iter__(self) -> Iterator[Delivery]:
        while True:
            delivery = self.poll()
            if delivery is not None:
                yield delivery

    # -- lifecycle reports -----------------------------------------------------------

    def started(self, delivery: Delivery, run_id: str | None = None) -> None:
        assert delivery.admitted is not None
        self._report(delivery.admitted.execution_id, delivery.admitted.workflow,
                     RunEventKind.started, run_id=run_id)
        if delivery._position is not None:
            self._consumer.store_offsets(offsets=[delivery._position])

    def heartbeat(self, execution_id: str, workflow: str) -> None:
        """The run is still held: call it every `Delivery.heartbeat_every_ms` for each run
        whose admitted start has a lease, or the run is taken for lost when the lease runs
        out (cancelled, recorded failed, its onFailure started)."""
        self._report(execution_id, workflow, RunEventKind.heartbeat)

    def suspended(self, execution_id: str, workflow: str, reason: str | None = None) -> None:
        self._report(execution_id, workflow, RunEventKind.suspended, reason=reason)

    def resumed(self, execution_id: str, workflow: str) -> None:
        self._report(execution_id, workflow, RunEventKind.resumed)

    def completed(self, execution_id: str, workflow: str) -> None:
        self._report(execution_id, workflow, RunEventKind.completed)

    def failed(self, execution_id: str, workflow: str, *, retries_spent: int,
               error_tag: str | None = None, error_message: str | None = None) -> None:
        self._report(execution_id, workflow, RunEventKind.failed, retries_spent=retries_spent,
                     error_tag=error_tag, error_message=error_message)

    def cancelled(self, execution_id: str, workflow: str, reason: str | None = None) -> None:
        self._report(execution_id, workflow, RunEventKind.cancelled, reason=reason)

    def _report(self, execution_id: str, workflow: str, kind: RunEventKind, *,
                run_id: str | None = None, retries_spent: int | None = None,
                error_tag: str | None = None, error_message: str | None = None,
                reason: str | None = None) -> None:
        event = RunEvent(
            execution_id=execution_id, workflow=workflow, kind=kind,
            at_ms=int(time.time() * 1000), run_id=run_id, retries_spent=retries_spent,
            error_tag=error_tag, error_message=error_message, reason=reason,
        )

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self._errors.append(err)

        while True:
            try:
                self._producer.produce(self.topics.run_events, codec.encode(event),
                                       execution_id.encode(), on_delivery=delivered)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        self._producer.flush(timeout)
        if self._errors:
            errors, self._errors = self._errors, []
            raise RuntimeError(f"run events undelivered: {errors}")

    def close(self, *, acted: bool = True) -> None:
        """Flush the reports and leave the group. `acted`: the last command delivered was
        acted on, so its offset is committed (False when closing because acting failed:
        the next owner of its partition gets it again)."""
        self.flush()
        if acted:
            self._acknowledge_command()
        self._consumer.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(acted=exc_type is None)
