"""The producer SDK: `Client.start(...)` turns a call into a start request on `sg.starts`.

The payload is validated here, before anything is produced, against the same declaration
the workers load. A caller that wants the decision waits on its own partition of
`sg.replies` (chosen at random per client), never on the whole ledger. A blocking caller
(`run()`, `start(wait=True)`) then waits for the run's end on the one partition of the
runs table that holds its execution id (docs/decisions/blocking-callers.md).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Producer, TopicPartition
from pydantic import BaseModel, ValidationError

from sluicegate import tracing
from sluicegate.client.errors import (
    BlockingCallerRefused,
    ClientError,
    DecisionTimeout,
    PayloadError,
    PayloadTooLarge,
    RateLimited,
    SingletonHeld,
    UnknownWorkflow,
)
from sluicegate.config import PAYLOAD_RESERVE_BYTES, Settings
from sluicegate.declare import App, Origin, load_app
from sluicegate.kafkautil import check_access, watermarks
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.payloads import Payloads, validate
from sluicegate.schemas.records import ENDED, Outcome, Reply, RunRow, StartRequest
from sluicegate.topology.framing import configure_codec
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.landing import Landings
from sluicegate.topology.topics import Topics


@dataclass(slots=True)
class Handle:
    """What a start returned. `status` is a SPEC.md section 2 status once decided, and
    `submitted` while the request is on its way."""

    request_id: str
    workflow: str
    status: str = "submitted"
    execution_id: str | None = None
    reason: str | None = None
    retry_after_ms: int | None = None
    deferral: str | None = None
    due_at_ms: int | None = None
    position: int | None = None
    # A blocking caller's answer: the run's row in the runs table once it ended.
    result: RunRow | None = None
    _future: Future[Reply] | None = None

    @property
    def decided(self) -> bool:
        return self.status != "submitted"

    def wait(self, timeout: float = 30.0) -> Handle:
        """Block until the decision is known (the handle is updated in place)."""
        if self.decided:
            return self
        if self._future is None:
            raise DecisionTimeout(f"start {self.request_id} was sent without a reply channel")
        try:
            reply = self._future.result(timeout)
        except TimeoutError as exc:
            raise DecisionTimeout(
                f"no decision for start {self.request_id} of {self.workflow} within {timeout}s"
            ) from exc
        self._apply(reply)
        return self

    def _apply(self, reply: Reply) -> None:
        self.status = reply.outcome.value
        self.execution_id = reply.execution_id
        self.reason = reply.reason
        self.retry_after_ms = reply.retry_after_ms
        self.deferral = reply.deferral
        self.due_at_ms = reply.due_at_ms
        self.position = reply.position


def _to_ms(at: datetime | int | float | None) -> int | None:
    if at is None:
        return None
    if isinstance(at, datetime):
        return int(at.timestamp() * 1000)
    return int(at)


class _Replies:
    """Reads one partition of sg.replies and completes the futures waiting on it."""

    def __init__(self, settings: Settings, topic: str, partition: int) -> None:
        self.partition = partition
        self._waiting: dict[str, Future[Reply]] = {}
        self._lock = threading.Lock()
        self._consumer = Consumer(settings.client_config(**{
            "group.id": f"{settings.namespace}client-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
        }))
        tp = TopicPartition(topic, partition)
        # Pin the start position now, before any request is produced: a reply can then
        # never land before the reader is looking.
        _, high = watermarks(self._consumer, tp)
        self._consumer.assign([TopicPartition(topic, partition, high if high >= 0 else OFFSET_END)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluicegate-replies", daemon=True)
        self._thread.start()

    def expect(self, request_id: str) -> Future[Reply]:
        future: Future[Reply] = Future()
        with self._lock:
            self._waiting[request_id] = future
        return future

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, timeout=0.1):
                if msg.error() is not None or msg.value() is None:
                    continue
                try:
                    reply = codec.decode(Reply, msg.value())
                except codec.DecodeError:
                    continue
                with self._lock:
                    future = self._waiting.pop(reply.request_id, None)
                if future is not None:
                    future.set_result(reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()


class _RunWatch:
    """Waits for one run's end on the one partition of `sg.runs` that holds its id.

    The runs table is keyed by execution id, so a run's rows land on one known partition.
    For a new run the reader starts at that partition's end as it was before the start
    was produced (the run's rows can only come after); for an `existing` answer it reads
    the earlier run's partition from its beginning (compacted: a row per run).
    """

    def __init__(self, settings: Settings, topic: str, execution_id: str) -> None:
        self.topic = topic
        self.partitions = settings.partitions
        self._consumer = Consumer(settings.client_config(**{
            "group.id": f"{settings.namespace}run-watch-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 20,
        }))
        self.partition = self._partition(execution_id)
        tp = TopicPartition(topic, self.partition)
        _, high = watermarks(self._consumer, tp)
        self._consumer.assign([TopicPartition(topic, self.partition, max(high, 0))])

    def _partition(self, execution_id: str) -> int:
        return partition_for(execution_id.encode(), self.partitions)

    def from_beginning(self, execution_id: str) -> None:
        self.partition = self._partition(execution_id)
        self._consumer.assign([TopicPartition(self.topic, self.partition, 0)])

    def ended(self, execution_id: str, deadline: float) -> RunRow:
        wanted = execution_id.encode()
        while time.monotonic() < deadline:
            for msg in self._consumer.consume(500, timeout=0.1):
                if msg.error() is not None or msg.value() is None or msg.key() != wanted:
                    continue
                try:
                    row = codec.decode(RunRow, msg.value())
                except codec.DecodeError:
                    continue
                if row.status in ENDED:
                    return row
        raise TimeoutError(f"run {execution_id} did not end before the caller's timeout")

    def close(self) -> None:
        self._consumer.close()


class StartBuilder:
    """Turns a call into a validated start request and its Kafka key, producing nothing.

    The payload is validated against the declaration (a batch workflow's item schema),
    sealed when the workflow encrypts payloads, and keyed where it is decided
    (`Landing.key`: its idempotency key when it has one, so repeats meet on one partition,
    else its first control's key, else its request id)."""

    def __init__(self, app: App, settings: Settings, reply_partition: int | None = None) -> None:
        self.app = app
        self.reply_partition = reply_partition
        self._payloads = Payloads.of(settings)
        self._max_payload = settings.max_payload_bytes
        self._landings = Landings(app, settings.deployment_cap)

    def build(self, workflow: str, payload: BaseModel | Mapping[str, Any], *,
              id: str | None = None, at: datetime | int | None = None,
              origin: str | Origin = "event",
              wait_decision: bool = False, request_id: str | None = None,
              requested_at_ms: int | None = None) -> tuple[StartRequest, bytes]:
        """The request and its Kafka key. `request_id` and `requested_at_ms` default to a
        fresh uuid and the wall clock (a test driver gives its own, for repeatable runs)."""
        wf = self.app.get(workflow)
        if wf is None:
            raise UnknownWorkflow(f"workflow {workflow!r} is not declared in this app")
        origin = Origin(origin)
        at_ms = _to_ms(at)
        if at_ms is not None and wait_decision:
            raise BlockingCallerRefused(
                f"workflow {workflow}: a delayed start (at) cannot be waited on: it exists only "
                "as a future row until its time comes")
        data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else dict(payload)
        try:
            document = codec.dump_payload(data)
            # The check the worker makes: the document as JSON, against the start's model.
            validate(wf.start_model, document)
        except (codec.EncodeError, ValidationError) as exc:
            raise PayloadError(f"workflow {workflow}: payload does not validate: {exc}") from exc
        kept = self._payloads.seal_bytes(wf, document)
        if len(kept) > self._max_payload:
            sealed = " sealed" if kept is not document else ""
            raise PayloadTooLarge(
                f"workflow {workflow}: the payload is {len(kept):,} bytes{sealed}, over the "
                f"{self._max_payload:,}-byte limit of a start's payload (message.max.bytes, "
                f"{self._max_payload + PAYLOAD_RESERVE_BYTES:,}, less room for the admitted "
                "start's other fields): it could not be admitted. Pass a reference to the "
                "data (a URL, a key in your store) instead of the data itself.")
        start = StartRequest(
            request_id=request_id if request_id is not None else uuid.uuid4().hex,
            workflow=workflow,
            payload=kept,
            origin=origin,
            requested_at_ms=(requested_at_ms if requested_at_ms is not None
                             else int(time.time() * 1000)),
            idempotency_id=id,
            at_ms=at_ms,
            reply_partition=self.reply_partition,
        )
        landing = self._landings.get(workflow)
        assert landing is not None  # every declared workflow has one
        return start, landing.key(start, data)


class Client:
    """Start workflow runs through sluicegate.

    `Client(app="examples.declarations")` or `Client(bootstrap, app=App([...]))`.
    """

    def __init__(self, bootstrap: str | None = None, *, app: App | str,
                 settings: Settings | None = None, replies: bool = True) -> None:
        settings = settings or Settings()
        if bootstrap is not None:
            settings = settings.with_(bootstrap=bootstrap)
        self.settings = settings
        self.app = load_app(app, settings) if isinstance(app, str) else app
        self.topics = Topics(settings)
        check_access(settings)
        configure_codec(settings)
        self._producer = Producer(settings.client_config(**{
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "linger.ms": 2,
        }))
        self._errors: list[KafkaError] = []
        self._replies = (
            _Replies(settings, self.topics.replies, random.randrange(settings.partitions))
            if replies else None
        )
        self._builder = StartBuilder(
            self.app, settings, self._replies.partition if self._replies is not None else None)

    def start(
        self,
        workflow: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        id: str | None = None,
        at: datetime | int | None = None,
        origin: str | Origin = "event",
        wait_decision: bool = False,
        wait: bool = False,
        timeout: float = 30.0,
    ) -> Handle:
        """Ask for a run. With `wait_decision`, return once sluicegate has decided; with
        `wait`, once the run has ended (`handle.result` is its row): refused for workflows
        whose starts can wait in the admission queue."""
        if wait:
            return self._start_and_wait(workflow, payload, id, at, origin, timeout)
        handle = self.submit(workflow, payload, id=id, at=at, origin=origin,
                             wait_decision=wait_decision)
        if wait_decision:
            self._producer.flush(timeout)
            handle.wait(timeout)
            _raise_synchronous_answer(handle)
        return handle

    def run(
        self,
        workflow: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        id: str | None = None,
        origin: str | Origin = "event",
        timeout: float = 30.0,
    ) -> RunRow:
        """Start a run and block until it ended; returns its row in the runs table
        (`status` completed, failed or cancelled, `last_reason`). rateLimit and singleton
        `skip` answer with RateLimited / SingletonHeld; a workflow that can defer its
        starts (debounce, batch, throttle, concurrency, singleton `queue`) refuses the
        call."""
        handle = self._start_and_wait(workflow, payload, id, None, origin, timeout)
        assert handle.result is not None
        return handle.result

    def _start_and_wait(self, workflow: str, payload: BaseModel | Mapping[str, Any],
                        id: str | None, at: datetime | int | None, origin: str | Origin,
                        timeout: float) -> Handle:
        refuse_blocking(self.app, workflow)
        if self._replies is None:
            raise ClientError("a blocking call needs the reply channel: this client was made "
                              "with replies=False")
        deadline = time.monotonic() + timeout
        start, kafka_key = self._builder.build(workflow, payload, id=id, at=at, origin=origin,
                                               wait_decision=True)
        # A fresh run's execution id is known before it exists (identity decides it on the
        # partition the start is produced to): watch its partition from now.
        n = self.settings.partitions
        fresh_id = execution_id_for(workflow, start.request_id, partition_for(kafka_key, n), n)
        watch = _RunWatch(self.settings, self.topics.runs, fresh_id)
        try:
            handle = Handle(start.request_id, workflow,
                            _future=self._replies.expect(start.request_id))
            self._produce(kafka_key, codec.encode(start))
            self._producer.flush(timeout)
            handle.wait(max(0.0, deadline - time.monotonic()))
            _raise_synchronous_answer(handle)
            if handle.status == Outcome.existing.value and handle.execution_id is not None:
                watch.from_beginning(handle.execution_id)
            elif handle.status not in (Outcome.admitted.value, Outcome.queued.value):
                raise ClientError(
                    f"workflow {workflow}: the start was {handle.status} ({handle.reason}); "
                    "there is no run to wait for")
            # Queued here means paused: the run, when unpaused, has the fresh id.
            execution_id = handle.execution_id or fresh_id
            handle.result = watch.ended(execution_id, deadline)
            return handle
        finally:
            watch.close()

    def submit(
        self,
        workflow: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        id: str | None = None,
        at: datetime | int | None = None,
        origin: str | Origin = "event",
        wait_decision: bool = False,
    ) -> Handle:
        """Validate and produce a start request without waiting for anything."""
        start, kafka_key = self._builder.build(workflow, payload, id=id, at=at, origin=origin,
                                               wait_decision=wait_decision)
        future = None
        if self._replies is not None:
            future = self._replies.expect(start.request_id)
        self._produce(kafka_key, codec.encode(start))
        return Handle(start.request_id, workflow, _future=future)

    def _produce(self, key: bytes, value: bytes) -> None:
        """Produce a start request, with the caller's current trace context (OpenTelemetry's,
        when its API is installed and a span is current) as its `traceparent` header."""
        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                self._errors.append(err)

        trace = tracing.current_trace()
        while True:
            try:
                if trace is None:
                    self._producer.produce(self.topics.starts, value, key,
                                           on_delivery=delivered)
                else:
                    self._producer.produce(self.topics.starts, value, key,
                                           on_delivery=delivered, headers=trace)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every start produced so far is on the broker."""
        remaining = self._producer.flush(timeout)
        if remaining or self._errors:
            errors, self._errors = self._errors, []
            raise RuntimeError(f"{remaining} starts undelivered; errors: {errors}")

    def close(self) -> None:
        self.flush()
        if self._replies is not None:
            self._replies.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DEFERRING = ("debounce", "batch", "throttle", "concurrency")


def refuse_blocking(app: App, workflow: str) -> None:
    """A start that may wait in the admission queue, or fold into another run, has no
    result to block on (SPEC.md section 2: blocking callers)."""
    wf = app.get(workflow)
    if wf is None:
        raise UnknownWorkflow(f"workflow {workflow!r} is not declared in this app")
    if wf.defers:
        declared = ", ".join([name for name in _DEFERRING if getattr(wf, name)]
                             + (["singleton mode 'queue'"] if wf.singleton is not None
                                and wf.singleton.mode == "queue" else []))
        raise BlockingCallerRefused(
            f"workflow {workflow} declares {declared}, so its starts can wait in the "
            "admission queue or fold into another run; run() / start(wait=True) blocks for "
            "the run's result, which such a start may not have for a long time, or ever. "
            "Call start() and poll the handle instead.")


def _raise_synchronous_answer(handle: Handle) -> None:
    """rateLimit and singleton skip answer a waiting caller with an error (SPEC.md 2)."""
    if handle.status == Outcome.dropped.value and handle.retry_after_ms is not None:
        raise RateLimited(handle)
    if handle.status == Outcome.skipped.value:
        raise SingletonHeld(handle)
