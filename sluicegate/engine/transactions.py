"""The worker's transactional producer, kept usable through broker restarts and hangs.

Kafka Streams answers a fatal producer error (a producer fenced because the broker expired
a transaction that outlived `transaction.timeout.ms` while the broker was away, say) by
closing the producer and making a new one with the same transactional.id: its
`init_transactions` fences the old one and aborts whatever it left open, and the task
rewinds to its committed offsets. This module does the same, and one thing more:
librdkafka's transactional calls take a timeout but can outlive it (after an epoch bump
that could not complete, `send_offsets_to_transaction` was seen blocked for minutes while
the client kept retrying to acquire its producer id: confluentinc/librdkafka#5511). So
every blocking transactional call runs on a helper thread and is waited for with a
deadline; a call that outlives it is treated as a fatal error, and its thread, with the
old producer, is left to finish on its own.

While it waits, the caller's `stopping()` is checked every 100 ms: a worker told to stop
never waits on the broker (`Stopping`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from sluicegate.config import Settings

log = logging.getLogger(__name__)

_WAIT_SLICE_S = 0.1
# How often a caller serves the producer while a call that needs it runs.
_SERVE_EVERY_S = 0.005
# The longest wait between two tries of something the broker refused.
MAX_BACKOFF_S = 5.0


class Stopping(Exception):
    """The worker was told to stop while it waited on Kafka."""


class CallHung(KafkaException):
    """A transactional call outlived its deadline: its producer is given up."""


def error_of(exc: BaseException) -> KafkaError | None:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def is_fatal(exc: BaseException) -> bool:
    """Whether `exc` leaves the producer unusable: a fatal error or a hung call."""
    if isinstance(exc, CallHung):
        return True
    error = error_of(exc)
    return error is not None and error.fatal()


class _Caller:
    """One daemon thread that runs blocking client calls, so that the loop can stop
    waiting for one. Retired with its producer; a call still stuck in it keeps only
    itself and that producer alive, never the process (daemon)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="sluicegate-txn", daemon=True).start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, done, box = job
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:
                box.append((False, exc))
            done.set()
            del job, fn, args, done, box

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline_s: float,
             stopping: Callable[[], bool], what: str,
             serve: Callable[[float], Any] | None = None) -> Any:
        """`fn(*args)` on this thread, the caller waiting for it (woken as soon as it is
        done). With `serve` (the producer's poll), the caller calls it meanwhile: a call
        that waits for delivery reports only another thread serves (abort_transaction)
        needs it."""
        done = threading.Event()
        box: list[tuple[bool, Any]] = []
        self._jobs.put((fn, args, done, box))
        end = time.monotonic() + deadline_s
        while not done.wait(_WAIT_SLICE_S if serve is None else _SERVE_EVERY_S):
            if serve is not None:
                serve(0)
            if stopping():
                raise Stopping(what)
            if time.monotonic() > end:
                raise CallHung(KafkaError(KafkaError._TIMED_OUT,
                                          f"{what} did not return within {deadline_s:.0f}s"))
        ok, value = box[0]
        if ok:
            return value
        raise value

    def retire(self) -> None:
        self._jobs.put(None)


def _dispose(producer: Producer) -> None:
    """Let go of a replaced producer off the loop's thread: destroying a client waits for
    its requests in flight, which a broker that is away does not answer."""
    with contextlib.suppress(Exception):  # a dead producer may refuse even this
        producer.purge(in_queue=True, in_flight=True, blocking=False)


class TransactionalProducer:
    """The producer of one worker: `producer` for produce/poll in the hot path, and the
    transactional calls, each with a deadline."""

    def __init__(self, config: dict[str, Any], stopping: Callable[[], bool],
                 settings: Settings) -> None:
        self._config = config
        # Each call's own timeout (librdkafka's), and how much later a call still running
        # is taken to hang; how long a commit and an abort wait for delivery.
        self._call_s = settings.call_timeout_ms / 1000
        self._hang_s = self._call_s + settings.hang_grace_ms / 1000
        self._flush_s = settings.flush_timeout_ms / 1000
        self._abort_flush_s = settings.abort_flush_ms / 1000
        self._stopping = stopping
        self.producer = Producer(config)
        self._caller = _Caller()

    def _call(self, fn: Callable[..., Any], *args: Any, what: str,
              serve: bool = False) -> Any:
        return self._caller.call(fn, args, self._hang_s, self._stopping, what,
                                 self.producer.poll if serve else None)

    # -- lifecycle -------------------------------------------------------------------

    def init(self) -> None:
        """`init_transactions`, until it succeeds: a broker that is away is waited for (and
        said once); a producer that turns fatal or hangs meanwhile is replaced."""
        backoff = 0.1
        said = False
        while True:
            try:
                self._call(self.producer.init_transactions, self._call_s,
                           what="init_transactions")
                if said:
                    log.info("transactions initialised")
                return
            except KafkaException as exc:
                if not said:
                    log.warning("waiting for Kafka to initialise transactions: %s",
                                describe(exc))
                    said = True
                if is_fatal(exc):
                    self._new_producer()
            sleep_unless_stopping(backoff, self._stopping)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued for up to `timeout_s`, then let the producer go."""
        deadline = time.monotonic() + timeout_s
        try:
            while self.producer.flush(_WAIT_SLICE_S) and time.monotonic() < deadline:
                if self._stopping():
                    break
        except KafkaException as exc:
            log.debug("producer flush at close: %s", describe(exc))
        self._caller.retire()

    # -- one transaction -------------------------------------------------------------

    def begin(self) -> None:
        self.producer.begin_transaction()

    def commit(self, offsets: list[TopicPartition], group_metadata: Any,
               before_commit: Callable[[], None]) -> None:
        """Deliver the transaction's records, add `offsets` to it and commit it.
        `before_commit` runs just before the commit is asked for: from then on, a failure
        leaves the outcome unknown until the broker is asked again."""
        self._flush(self._flush_s)
        if offsets:
            self._call(self.producer.send_offsets_to_transaction, offsets, group_metadata,
                       self._call_s, what="send_offsets_to_transaction")
        before_commit()
        self._call(self.producer.commit_transaction, self._call_s,
                   what="commit_transaction")

    def abort(self, cause: BaseException | None = None) -> None:
        """End the open transaction without committing it. A producer that cannot (it is
        fatal, or its call hangs or fails) is replaced by a new one with the same
        transactional.id, whose init fences it and aborts what it left open."""
        if cause is None or not is_fatal(cause):
            try:
                # Deliver what is on its way first (into the transaction being aborted):
                # messages purged while in flight leave gaps in the producer's sequence
                # numbers, which the next transaction pays for with an epoch bump.
                self._flush(self._abort_flush_s)
                self._call(self.producer.abort_transaction, self._call_s,
                           what="abort_transaction", serve=True)
                return
            except KafkaException as exc:
                cause = exc
        log.warning("replacing the transactional producer (same transactional.id) after: %s",
                    describe(cause))
        self._new_producer()
        self.init()

    def _flush(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (left := self.producer.flush(_WAIT_SLICE_S)) > 0:
            if self._stopping():
                raise Stopping("flush")
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(
                    KafkaError._TIMED_OUT, f"{left} records undelivered after {timeout_s:.0f}s"))

    def _new_producer(self) -> None:
        old, self.producer = self.producer, Producer(self._config)
        self._caller.retire()
        self._caller = _Caller()
        threading.Thread(target=_dispose, args=(old,), name="sluicegate-dispose",
                         daemon=True).start()
        del old


def sleep_unless_stopping(seconds: float, stopping: Callable[[], bool]) -> None:
    """Sleep, but raise `Stopping` within 100 ms of `stopping()` saying so."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if stopping():
            raise Stopping("backoff")
        time.sleep(min(_WAIT_SLICE_S, left))


def describe(exc: BaseException) -> str:
    """A Kafka error in one line: its name and what it says."""
    error = error_of(exc)
    if error is None:
        return f"{type(exc).__name__}: {exc}"
    return f"{error.name()}: {error.str()}"
