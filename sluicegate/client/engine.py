"""The engine SDK: consume admitted starts, report each run's lifecycle, receive commands.

Two ways to take admitted starts (docs/wire-format.md, Being an engine):

- **A consumer group** (the default). An engine consumes `sg.admitted` and `sg.commands`
  in one consumer group. Both topics are keyed by execution id with the same partition
  count, and the range assignor gives an engine instance the same partitions of both, so
  the commands for a run reach the instance that holds it. Runs of one key start in order;
  instances beyond the partition count idle.
- **A share group** (`share_group=True`, KIP-932). Every instance takes admitted starts
  from every partition, each record on its own, so a fleet can be as wide as it likes and a
  slow run holds back no other; a start whose instance died before acknowledging it is
  delivered to another. No order between runs. Commands stay on a consumer group, one per
  instance (`<group>.commands.<instance>`): every instance reads every command and acts on
  the runs it holds, since a run may be held by any instance.

Either way delivery is at-least-once: a start is acknowledged (its offset committed, or its
share-group record accepted) after the run has been reported `started`, so an engine that
dies before that sees the start again, on this instance or another. `started` dedupes by
execution id through `begun` (a store of the runs begun: this process's memory by default,
one every instance shares if a run started twice on two instances is worse than a lost
one). A command's offset is committed once the engine asks for its next delivery, that is
after it acted on the command (an engine that dies while acting on it gets it again;
`command_id` tells a repeat).

An admitted start carries the trace context its producer started (`traceparent`), and
`Delivery.span()` continues that trace with OpenTelemetry when it is installed
(docs/decisions/traces.md).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import (
    AcknowledgeType,
    Consumer,
    KafkaError,
    Message,
    Producer,
    ShareConsumer,
    TopicPartition,
)

from sluicegate import tracing
from sluicegate.config import Settings
from sluicegate.kafkautil import check_access
from sluicegate.schemas import codec
from sluicegate.schemas.payloads import Payloads
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    EngineCommand,
    RunEvent,
    RunEventKind,
)
from sluicegate.topology.admin import configure_share_group
from sluicegate.topology.framing import configure_codec
from sluicegate.topology.topics import Topics


class RunsBegun(Protocol):
    """The runs an engine has begun, by execution id: what `Engine.started` dedupes by."""

    def claim(self, execution_id: str) -> bool:
        """Record that this run begins; False if it was already begun (nothing recorded).
        An engine whose instances share one store makes this atomic across them (an
        insert under a unique key)."""
        ...


class RecentRuns:
    """The last `keep` execution ids begun in this process: dedupes a start delivered
    twice to the same instance (a rebalance, a lock that ran out), not one delivered to
    another instance after this one died."""

    def __init__(self, keep: int = 100_000) -> None:
        self.keep = keep
        self._ids: OrderedDict[str, None] = OrderedDict()

    def claim(self, execution_id: str) -> bool:
        if execution_id in self._ids:
            return False
        self._ids[execution_id] = None
        if len(self._ids) > self.keep:
            self._ids.popitem(last=False)
        return True


@dataclass(frozen=True, slots=True)
class Delivery:
    """One record for the engine: an admitted start or a command."""

    admitted: AdmittedStart | None = None
    command: EngineCommand | None = None
    # A share group's count of the times this start was delivered (1 the first time);
    # None on a consumer group, which does not count.
    delivery_count: int | None = None
    # Consumer group: the offset to commit once the start is reported; share group: the
    # record itself, to acknowledge.
    _position: TopicPartition | None = None
    _acquired: TopicPartition | None = None
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


def _where(msg: Message) -> tuple[str, int, int]:
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


class Engine:
    """Takes admitted starts and commands, reports runs (module docstring).

    `share_group`: take admitted starts in the share group `group` (Kafka 4.2 or later);
    `instance` names this instance's consumer group of commands, `<group>.commands.
    <instance>` (a new random one by default: give each instance a name it keeps across
    restarts, so a restarted instance resumes its commands where it stopped instead of
    reading the topic from its start). `begun`: the runs begun, which `started` dedupes by.
    """

    def __init__(self, bootstrap: str | None = None, *, group: str,
                 settings: Settings | None = None, share_group: bool = False,
                 instance: str | None = None, begun: RunsBegun | None = None) -> None:
        settings = settings or Settings()
        if bootstrap is not None:
            settings = settings.with_(bootstrap=bootstrap)
        self.settings = settings
        self.topics = Topics(settings)
        self.share_group = share_group
        self.instance = instance or uuid.uuid4().hex[:12]
        self.begun: RunsBegun = begun if begun is not None else RecentRuns()
        self._payloads = Payloads.of(settings)
        check_access(settings)
        configure_codec(settings)
        consumer_config = {
            "isolation.level": "read_committed",
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 20,
            "session.timeout.ms": 10000,
        }
        self._share: ShareConsumer | None = None
        if share_group:
            configure_share_group(settings, group)
            self._share = ShareConsumer(settings.client_config(**{
                "group.id": group,
                # Each start is accepted once its run is reported started, not when polled.
                "share.acknowledgement.mode": "explicit",
                "fetch.wait.max.ms": 20,
            }))
            self._share.subscribe([self.topics.admitted])
            # Every command reaches every instance: the run it names may be held by any.
            self._consumer = Consumer(settings.client_config(
                **consumer_config, **{"group.id": f"{group}.commands.{self.instance}"}))
            self._consumer.subscribe([self.topics.commands])
        else:
            self._consumer = Consumer(settings.client_config(
                **consumer_config, **{"group.id": group, "partition.assignment.strategy": "range"}))
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
        # Share group: the starts of the last poll not handed out yet, and those handed out
        # and not acknowledged (all must be before the share consumer polls again).
        self._fetched: deque[Message] = deque()
        self._unacknowledged: set[tuple[str, int, int]] = set()
        self._acknowledged = False  # since the share consumer last sent acknowledgements

    def poll(self, timeout: float = 1.0) -> Delivery | None:
        self._acknowledge_command()
        if self._share is None:
            return self._from_consumer(self._consumer.poll(timeout))
        # Commands first, without waiting: a cancel is not held up behind a batch of starts.
        command = self._from_consumer(self._consumer.poll(0))
        if command is not None:
            return command
        if not self._fetched:
            self._fetch(timeout)
        while self._fetched:
            msg = self._fetched.popleft()
            if msg.error() is None:
                if msg.value() is not None:
                    return self._from_share(msg)
                # No start to hand out, but every record fetched must be acknowledged.
                self._unacknowledged.add(_where(msg))
        return None

    def _from_consumer(self, msg: Message | None) -> Delivery | None:
        if msg is None or msg.error() is not None or msg.value() is None:
            return None
        topic, partition, offset = _where(msg)
        position = TopicPartition(topic, partition, offset + 1)
        # A list of (name, value) as the consumer gives them.
        headers = msg.headers()
        trace = tracing.trace_of(headers) if isinstance(headers, list) else None
        if topic == self.topics.admitted:
            return Delivery(admitted=codec.decode(AdmittedStart, msg.value()),
                            _position=position, _payloads=self._payloads, trace=trace)
        self._command_done = position
        return Delivery(command=codec.decode(EngineCommand, msg.value()), trace=trace)

    def _from_share(self, msg: Message) -> Delivery:
        topic, partition, offset = _where(msg)
        self._unacknowledged.add((topic, partition, offset))
        headers = msg.headers()
        return Delivery(admitted=codec.decode(AdmittedStart, msg.value()),
                        delivery_count=msg.delivery_count(),
                        trace=tracing.trace_of(headers) if isinstance(headers, list) else None,
                        _acquired=TopicPartition(topic, partition, offset),
                        _payloads=self._payloads)

    def _fetch(self, timeout: float) -> None:
        """The next batch of starts from the share group, after acknowledging the last
        one's: a start handed out and not reported (the caller moved on without calling
        `started`: it answered it otherwise, or ignored it) is accepted too, as a consumer
        group's later offset covers it. The reports go to the broker before the
        acknowledgements, which this poll sends."""
        assert self._share is not None
        for topic, partition, offset in self._unacknowledged:
            self._share.acknowledge_offset(topic, partition, offset, AcknowledgeType.ACCEPT)
            self._acknowledged = True
        self._unacknowledged.clear()
        if self._acknowledged:
            self.flush()
            self._acknowledged = False
        self._fetched.extend(self._share.poll(timeout))

    def _acknowledge_start(self, delivery: Delivery) -> None:
        if delivery._position is not None:
            self._consumer.store_offsets(offsets=[delivery._position])
        acquired = delivery._acquired
        if acquired is not None and self._share is not None:
            key = (acquired.topic, acquired.partition, acquired.offset)
            if key in self._unacknowledged:
                self._unacknowledged.discard(key)
                self._share.acknowledge_offset(*key, AcknowledgeType.ACCEPT)
                self._acknowledged = True

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

    def started(self, delivery: Delivery, run_id: str | None = None) -> bool:
        """Report the run started and acknowledge its start; call it before asking for the
        next delivery. False if a `start` of this execution id was already begun (`begun`
        says so): nothing is reported, the start is acknowledged, do not run it. A
        `resume` is always reported (the run was begun before it suspended)."""
        start = delivery.admitted
        assert start is not None
        if start.kind is AdmittedKind.start and not self.begun.claim(start.execution_id):
            self._acknowledge_start(delivery)
            return False
        self._report(start.execution_id, start.workflow, RunEventKind.started, run_id=run_id)
        self._acknowledge_start(delivery)
        return True

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
        if self._share is not None:
            # The starts reported are accepted; those fetched and not handed out, or handed
            # out and not reported, go back to the group for another instance.
            self._share.commit_sync()
            self._share.close()
        self._consumer.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(acted=exc_type is None)
