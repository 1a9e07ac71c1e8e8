"""Queue mode: a lease's records as :class:`Delivery` s answered one by one
(:meth:`Lease.deliveries`), and a consumer that runs a handler per record on threads
(:meth:`Lease.consume`).

Answers are batched: each lease sends at most one Acknowledge at a time, and the answers made
meanwhile go together in the next one, so busy handlers send few calls and an idle consumer
answers at once.
"""

from __future__ import annotations

import datetime as _dt
import enum
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Protocol, Union

import grpc

from kafka_lease._errors import KafkaLeaseError
from kafka_lease._handle import Connection
from kafka_lease._stream import _END, _ERROR, _HEADERS, _ITEM, Pump, deadline_of, stream_broke
from kafka_lease._types import Record, Seconds, as_seconds, to_datetime, to_duration
from kafka_lease.v1 import partition_lease_pb2 as pb

#: The most acknowledgements one Acknowledge carries (the gateway's limit).
_MAX_BATCH = 10_000
#: The longest RETRY delay and REJECT/RETRY reason (UTF-8 bytes) the gateway takes.
_MAX_RETRY_DELAY, _MAX_REASON_BYTES = 3600.0, 1024
_FIRST_BACKOFF, _MAX_BACKOFF = 0.1, 3.2
#: How many times an Acknowledge is sent when the connection breaks under it.
_ACK_ATTEMPTS = 4
#: Why a record still being handled at the end of a consume's drain is handed back.
SHUT_DOWN_REASON = "the consumer shut down before handling it"
#: The shortest and (for a subscription) longest wait between a drain's renewals.
_MIN_RENEW_EVERY, _MAX_SUBSCRIPTION_RENEW_EVERY = 0.1, 2.0


class Ordering(enum.IntEnum):
    """How a queue's records may be handed out relative to each other."""

    #: One record at a time, in offset order: the next once the last is done. The default.
    PARTITION = pb.DELIVERY_ORDER_PARTITION
    #: The records of one key one at a time, in offset order; keys in parallel. A record
    #: being retried holds back its key only. Records without a key are ordered by nothing.
    KEY = pb.DELIVERY_ORDER_KEY
    #: Any record, in parallel.
    UNORDERED = pb.DELIVERY_ORDER_UNORDERED


class AckType(enum.IntEnum):
    """What an answer does with a delivery (see :meth:`Delivery.answer`)."""

    #: Handled: the record is done.
    ACCEPT = pb.ACK_TYPE_ACCEPT
    #: Not handled: deliver it again (after a delay); at its last delivery, to the dead letters.
    RETRY = pb.ACK_TYPE_RETRY
    #: Never to be handled: to the dead letter topic now.
    REJECT = pb.ACK_TYPE_REJECT
    #: Still working: the delivery's deadline moves to now + the queue's ack deadline.
    RENEW = pb.ACK_TYPE_RENEW


class AckOutcome(enum.IntEnum):
    """What became of an answer."""

    #: Applied.
    APPLIED = pb.ACK_OUTCOME_APPLIED
    #: Changed nothing: the delivery was no longer in flight (its deadline passed and it was
    #: delivered again, or another answer came first), or the record is done. An ACCEPT of a
    #: record not done yet counts whichever delivery it answers.
    STALE = pb.ACK_OUTCOME_STALE
    #: Changed nothing: no record at this offset was ever delivered on the partition, by this
    #: holder or an earlier one (not handed out yet, or past the partition's end). Usually a
    #: bug of the caller, such as an offset off by one.
    NOT_DELIVERED = pb.ACK_OUTCOME_NOT_DELIVERED

    @classmethod
    def _of(cls, outcome: int) -> AckOutcome:
        """The gateway's outcome; STALE for one this version does not know (it changed
        nothing this client can tell)."""
        try:
            return cls(outcome)
        except ValueError:
            return cls.STALE


@dataclass(frozen=True)
class QueueOptions:
    """A queue's settings (:meth:`Lease.deliveries`, :meth:`Lease.consume`). Unset ones (0,
    ``None``, ``""``) take the gateway's defaults. A lease keeps the settings of its first
    Deliver: a later one (a reopen, a second consume) must ask for the same.

    ``ordering``: :class:`Ordering` or its name (``"partition"``, ``"key"``,
    ``"unordered"``); default partition. ``max_in_flight``: deliveries unanswered at once
    (1 ..= 10,000; default 64). ``max_in_flight_bytes``: bytes of records unanswered at once
    (default 4 MiB, at most 64 MiB; a larger record goes alone). ``ack_deadline``: how long a
    delivery may go unanswered before it is delivered again (1 s ..= 1 h; default 30 s).
    ``max_deliveries``: deliveries after which a record failing again goes to the dead letter
    topic (1 ..= 100; default 5). ``dead_letter_topic``: where rejected records go (default
    ``dlq.<group>.<topic>``); it must exist. ``reconnect_attempts``: how many times in a row
    a broken Deliver is reopened before the error reaches the caller (default 8).
    """

    ordering: Ordering | str = Ordering.PARTITION
    max_in_flight: int = 0
    max_in_flight_bytes: int = 0
    ack_deadline: Seconds | None = None
    max_deliveries: int = 0
    dead_letter_topic: str = ""
    reconnect_attempts: int = 8

    def _ordering(self) -> str:
        ordering = Ordering[self.ordering.upper()] if isinstance(self.ordering, str) else Ordering(self.ordering)
        return pb.DeliveryOrder.Name(ordering)

    def settings(self) -> pb.QueueSettings:
        """The QueueSettings of a SubscribeRequest (``reconnect_attempts`` is not one)."""
        return pb.QueueSettings(
            ordering=self._ordering(),
            max_in_flight=self.max_in_flight,
            max_in_flight_bytes=self.max_in_flight_bytes,
            ack_deadline=to_duration(self.ack_deadline),
            max_deliveries=self.max_deliveries,
            dead_letter_topic=self.dead_letter_topic,
        )

    def request(self, lease_id: str) -> pb.DeliverRequest:
        """The DeliverRequest for ``lease_id``."""
        return pb.DeliverRequest(
            lease_id=lease_id,
            ordering=self._ordering(),
            max_in_flight=self.max_in_flight,
            max_in_flight_bytes=self.max_in_flight_bytes,
            ack_deadline=to_duration(self.ack_deadline),
            max_deliveries=self.max_deliveries,
            dead_letter_topic=self.dead_letter_topic,
        )


class _Acks:
    """A lease's answers on their way: one Acknowledge at a time, on a thread that runs
    while answers wait, the answers made meanwhile batched behind it."""

    def __init__(self, client: Connection, lease_id: str) -> None:
        self._client = client
        self._lease_id = lease_id
        self._lock = threading.Lock()
        self._waiting: list[tuple[pb.Acknowledgement, Future[AckOutcome]]] = []
        self._sending = False

    def send(self, ack: pb.Acknowledgement) -> Future[AckOutcome]:
        answer: Future[AckOutcome] = Future()
        with self._lock:
            self._waiting.append((ack, answer))
            if self._sending:
                return answer
            self._sending = True
        threading.Thread(target=self._run, name="kafka-lease-acks", daemon=True).start()
        return answer

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._waiting:
                    self._sending = False
                    return
                batch, self._waiting = self._waiting[:_MAX_BATCH], self._waiting[_MAX_BATCH:]
            request = pb.AcknowledgeRequest(lease_id=self._lease_id, acknowledgements=[ack for ack, _ in batch])
            try:
                outcomes = self._call(request)
            except BaseException as error:  # noqa: BLE001 - handed to every answer of the batch
                for _, answer in batch:
                    answer.set_exception(error)
                continue
            for i, (_, answer) in enumerate(batch):
                answer.set_result(AckOutcome._of(outcomes[i]) if i < len(outcomes) else AckOutcome.STALE)


    def _call(self, request: pb.AcknowledgeRequest) -> list[int]:
        """One Acknowledge, sent again after a broken connection (or UNAVAILABLE with
        RetryInfo) at most ``_ACK_ATTEMPTS - 1`` times: an answer names its delivery, so a
        repeat changes nothing more (an accept or retry that had been applied comes back
        STALE)."""
        for attempt in range(1, _ACK_ATTEMPTS + 1):
            try:
                return list(self._client.call("Acknowledge", request).outcomes)
            except KafkaLeaseError as error:
                if not error.is_retryable or attempt == _ACK_ATTEMPTS:
                    raise
                time.sleep(error.retry_delay if error.retry_delay is not None else 0.1 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")


def _reason(text: str) -> str:
    """``text`` cut to the gateway's 1024 UTF-8 bytes (a longer one would fail the batch)."""
    encoded = text.encode("utf-8")
    if len(encoded) <= _MAX_REASON_BYTES:
        return text
    return encoded[:_MAX_REASON_BYTES].decode("utf-8", errors="ignore")


class Delivery:
    """One hand-out of a record, from :class:`Deliveries`: answer it with :meth:`accept`,
    :meth:`retry` or :meth:`reject`, or :meth:`renew` it, before its :attr:`deadline` (else
    it is delivered again, with :attr:`attempt` one higher). The answers wait for the
    gateway's and return its :class:`AckOutcome`; :meth:`answer` returns at once with a
    future. Any thread may answer, also after the Deliver is closed; a lease's answers travel
    together (one Acknowledge at a time, sent again up to 3 times if the connection breaks
    under it). An answer on a lease that has ended raises :class:`LeaseEndedError`.
    """

    __slots__ = ("record", "attempt", "deadline", "topic", "partition", "_acks")

    def __init__(
        self, record: Record, attempt: int, deadline: _dt.datetime | None, acks: _Acks, topic: str = "", partition: int = -1
    ) -> None:
        #: The record.
        self.record = record
        #: The record's topic and partition.
        self.topic = topic
        self.partition = partition
        #: 1 for the first delivery, one more for each after it (carried over handovers).
        self.attempt = attempt
        #: When the gateway delivers the record again unless it is answered (aware UTC).
        self.deadline = deadline
        self._acks = acks

    @classmethod
    def from_proto(cls, delivery: pb.Delivery, acks: _Acks, topic: str = "", partition: int = -1) -> Delivery:
        deadline = to_datetime(delivery.deadline) if delivery.HasField("deadline") else None
        return cls(Record.from_proto(delivery.record), delivery.attempt, deadline, acks, topic, partition)

    @property
    def offset(self) -> int:
        """The record's offset."""
        return self.record.offset

    def answer(self, kind: AckType, *, delay: Seconds | None = None, reason: str = "") -> Future[AckOutcome]:
        """Sends an answer without waiting: the future's result is its outcome, or its
        exception the call's :class:`KafkaLeaseError`. ``delay`` (RETRY) is cut to 1 h and
        ``reason`` (RETRY, REJECT: the dead letter's ``kafka-lease.reason`` header) to 1024
        UTF-8 bytes, the gateway's limits."""
        ack = pb.Acknowledgement(offset=self.record.offset, type=pb.AckType.Name(AckType(kind)), attempt=self.attempt)
        if delay is not None:
            ack.retry_delay.CopyFrom(to_duration(min(max(as_seconds(delay), 0.0), _MAX_RETRY_DELAY)))
        if reason:
            ack.reason = _reason(reason)
        return self._acks.send(ack)

    def accept(self) -> AckOutcome:
        """Handled: the record is done."""
        return self.answer(AckType.ACCEPT).result()

    def retry(self, delay: Seconds = 0, reason: str = "") -> AckOutcome:
        """Not handled: deliver it again after ``delay`` seconds (at its last delivery it goes
        to the dead letter topic instead, with ``reason``)."""
        return self.answer(AckType.RETRY, delay=delay, reason=reason).result()

    def reject(self, reason: str = "") -> AckOutcome:
        """Never to be handled: to the dead letter topic now, with ``reason``."""
        return self.answer(AckType.REJECT, reason=reason).result()

    def renew(self) -> AckOutcome:
        """Still working: the deadline moves to now + the queue's ack deadline (this object's
        :attr:`deadline` is not updated)."""
        return self.answer(AckType.RENEW).result()

    def __repr__(self) -> str:
        return (
            f"Delivery(topic={self.topic!r}, partition={self.partition}, offset={self.record.offset}, "
            f"attempt={self.attempt}, deadline={self.deadline})"
        )


class Deliveries:
    """A lease's deliveries, from :meth:`Lease.deliveries`: iterate it for
    :class:`Delivery` s, or call :meth:`next_delivery` (with a timeout).

    When the Deliver stream breaks (a transport failure, or UNAVAILABLE with RetryInfo) it is
    reopened with the same settings, at most ``reconnect_attempts`` times in a row, waiting
    0.1 s doubling up to 3.2 s between; deliveries in flight stay in flight meanwhile and can
    still be answered. The iteration ends after the lease is released; an error (the lease
    ended, a stream that could not be reopened) is raised once. :meth:`close` (or leaving the
    ``with`` block) cancels the Deliver; it may be called from another thread.
    """

    def __init__(
        self,
        open_deliver: Callable[[], Any],
        acks: _Acks,
        reconnect_attempts: int,
        open_timeout: float | None,
        topic: str = "",
        partition: int = -1,
    ) -> None:
        self._open = open_deliver
        self._acks = acks
        self._topic, self._partition = topic, partition
        self._attempts = reconnect_attempts
        self._failures = 0
        #: How many times the Deliver was reopened after a break.
        self.reconnects = 0
        self._ready: deque[Delivery] = deque()
        self._stash: tuple[str, Any] | None = None
        self._reopen_at = 0.0
        self._done = False
        self._closed = threading.Event()
        call = open_deliver()
        self._pump: Pump | None = Pump(call, announce=True)
        # The first Deliver's errors (settings out of range, a dead letter topic that does not
        # exist, the lease's end) are raised here, not at the first delivery: they come as a
        # status without headers.
        try:
            kind, value = self._pump.get(deadline_of(open_timeout))
            if kind == _HEADERS and (not value or call.done()):
                kind, value = self._pump.get(deadline_of(0.5))
        except TimeoutError:
            return
        if kind == _ERROR:
            self._pump.close()
            self._done = True
            if isinstance(value, grpc.RpcError):
                raise KafkaLeaseError.from_rpc_error(value) from None
            raise value
        if kind != _HEADERS:
            self._stash = (kind, value)

    def __enter__(self) -> Deliveries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> list[Delivery]:
        """Cancels the Deliver; iteration then ends. Returns the deliveries received and not
        handed out yet: they are in flight at the gateway until answered (retry them to have
        them delivered again now) or until their deadline."""
        self._closed.set()
        left = list(self._ready)
        self._ready.clear()
        entries = [self._stash] if self._stash is not None else []
        self._stash = None
        if self._pump is not None:
            self._pump.close()
            entries += self._pump.drain()
        for kind, value in entries:
            if kind == _ITEM:
                left += [Delivery.from_proto(d, self._acks, self._topic, self._partition) for d in value.deliveries if d.HasField("record")]
        return left

    def __iter__(self) -> Iterator[Delivery]:
        while (delivery := self.next_delivery()) is not None:
            yield delivery

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery; ``None`` once the stream has ended (the lease was released, or
        :meth:`close`); raises TimeoutError if none came within ``timeout`` seconds."""
        deadline = deadline_of(timeout)
        while True:
            if self._closed.is_set():
                return None
            if self._ready:
                return self._ready.popleft()
            if self._done:
                return None
            if self._pump is None:  # reopening after a break
                wait = self._reopen_at - time.monotonic()
                if wait > 0:
                    if deadline is not None and deadline < self._reopen_at:
                        self._closed.wait(max(0.0, deadline - time.monotonic()))
                        raise TimeoutError("no delivery within the timeout")
                    if self._closed.wait(wait):
                        return None
                self._pump = Pump(self._open())
                self.reconnects += 1
                if self._closed.is_set():
                    self._pump.close()
                    return None
            if self._stash is not None:
                (kind, value), self._stash = self._stash, None
            else:
                kind, value = self._pump.get(deadline)
            if kind == _ITEM:
                self._failures = 0
                self._ready.extend(Delivery.from_proto(d, self._acks, self._topic, self._partition) for d in value.deliveries if d.HasField("record"))
                continue
            if kind == _HEADERS:
                continue
            if kind == _END or self._closed.is_set():
                self._done = True
                return None
            if not isinstance(value, grpc.RpcError):
                self._done = True
                raise value
            error = KafkaLeaseError.from_rpc_error(value)
            if stream_broke(error) and self._failures < self._attempts:
                self._failures += 1
                backoff = min(_FIRST_BACKOFF * (1 << min(self._failures - 1, 6)), _MAX_BACKOFF)
                self._pump, self._reopen_at = None, time.monotonic() + backoff
                continue
            self._done = True
            raise error


class Retry(Exception):
    """Raise it from a :meth:`Lease.consume` handler (or return it from an error policy) to
    have the record delivered again: after ``delay`` seconds, or after the consumer's backoff
    for its attempt when ``None``. ``reason`` goes with the dead letter if this was its last
    delivery."""

    def __init__(self, reason: str = "", delay: Seconds | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class Reject(Exception):
    """Raise it from a :meth:`Lease.consume` handler (or return it from an error policy) to
    send the record to the dead letter topic now, with ``reason``."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


#: What a consumer does when its handler raises something other than :class:`Retry` or
#: :class:`Reject`: given the exception and the delivery, a :class:`Retry` or a
#: :class:`Reject`.
ErrorPolicy = Callable[[BaseException, Delivery], Union[Retry, Reject]]


def retry_with_backoff(error: BaseException, delivery: Delivery) -> Retry | Reject:
    """The default :data:`ErrorPolicy`: retry after the consumer's backoff, the exception as
    the reason (so after ``max_deliveries`` the record goes to the dead letter topic)."""
    return Retry(f"{type(error).__name__}: {error}")


@dataclass
class ConsumeStats:
    """What a :meth:`Lease.consume` did."""

    #: Records the handler handled (accepted).
    accepted: int = 0
    #: Handler failures answered with a retry.
    retried: int = 0
    #: Records the handler rejected (to the dead letter topic).
    rejected: int = 0
    #: Records handed back at shutdown, unfinished (retried at once, reason
    #: :data:`SHUT_DOWN_REASON`).
    handed_back: int = 0


class Stop(Protocol):
    """What :meth:`Lease.consume` watches to stop: a :class:`threading.Event`, say."""

    def is_set(self) -> bool: ...


#: Told of each answer a consumer sent and its outcome: the delivery, what the answer was
#: (ACCEPT, RETRY, REJECT) and the gateway's :class:`AckOutcome`. Not called for an answer
#: whose call failed. Runs on the thread that answered; what it raises is ignored.
OnAnswer = Callable[[Delivery, AckType, AckOutcome], None]


class DeliverySource(Protocol):
    """Where a consumer takes its deliveries: a lease's :class:`Deliveries`, or a
    subscription's."""

    def next_delivery(self, timeout: float | None = None) -> Delivery | None: ...

    def pause(self) -> list[Delivery]:
        """Stops taking deliveries; returns those received and not handed out."""
        ...

    def close(self) -> None:
        """After the drain: ends what ``pause`` left open."""
        ...

    def renew_every(self) -> float:
        """How often (seconds) the drain renews the deliveries of the running handlers."""
        ...


_RUNNING, _ANSWERING, _HANDED_BACK = "running", "answering", "handed back"


class _Consumer:
    """One :meth:`Lease.consume`: a thread per running handler, at most ``concurrency``."""

    def __init__(
        self,
        handler: Callable[[Delivery], object],
        concurrency: int,
        error_policy: ErrorPolicy,
        backoff: tuple[Seconds, Seconds],
        on_answer: OnAnswer | None = None,
    ) -> None:
        self.handler = handler
        self.on_answer = on_answer
        self.slots = threading.BoundedSemaphore(concurrency)
        self.error_policy = error_policy
        self.backoff = (as_seconds(backoff[0]), as_seconds(backoff[1]))
        self.lock = threading.Condition()
        self.state: dict[int, tuple[str, Delivery]] = {}
        self.stats = ConsumeStats()
        self._next_token = 0

    def delay(self, attempt: int) -> float:
        initial, most = self.backoff
        return min(initial * (1 << min(max(attempt - 1, 0), 20)), most)

    def start(self, delivery: Delivery) -> None:
        """Runs the handler on a thread of its own; the caller holds a slot for it."""
        with self.lock:
            token = self._next_token
            self._next_token += 1
            self.state[token] = (_RUNNING, delivery)
        threading.Thread(target=self._work, args=(token, delivery), name="kafka-lease-handler", daemon=True).start()

    def _decide(self, delivery: Delivery) -> Retry | Reject | None:
        try:
            self.handler(delivery)
            return None
        except (Retry, Reject) as explicit:
            return explicit
        except BaseException as error:  # noqa: BLE001 - the policy decides, the record is answered
            try:
                decided: object = self.error_policy(error, delivery)
            except BaseException as policy_error:  # noqa: BLE001 - a failing policy retries
                decided = Retry(f"the error policy failed: {type(policy_error).__name__}: {policy_error}")
            return decided if isinstance(decided, (Retry, Reject)) else retry_with_backoff(error, delivery)

    def _work(self, token: int, delivery: Delivery) -> None:
        try:
            decision = self._decide(delivery)
            with self.lock:
                if self.state[token][0] == _HANDED_BACK:
                    del self.state[token]
                    self.lock.notify_all()
                    return
                self.state[token] = (_ANSWERING, delivery)
                if decision is None:
                    self.stats.accepted += 1
                elif isinstance(decision, Reject):
                    self.stats.rejected += 1
                else:
                    self.stats.retried += 1
            try:
                if decision is None:
                    kind, outcome = AckType.ACCEPT, delivery.accept()
                elif isinstance(decision, Reject):
                    kind, outcome = AckType.REJECT, delivery.reject(decision.reason)
                else:
                    delay = decision.delay if decision.delay is not None else self.delay(delivery.attempt)
                    kind, outcome = AckType.RETRY, delivery.retry(delay, decision.reason)
                self.told(delivery, kind, outcome)
            except KafkaLeaseError:
                pass  # a lost answer costs a redelivery after the deadline, never a record
            with self.lock:
                del self.state[token]
                self.lock.notify_all()
        finally:
            self.slots.release()

    def told(self, delivery: Delivery, kind: AckType, outcome: AckOutcome) -> None:
        if self.on_answer is None:
            return
        try:
            self.on_answer(delivery, kind, outcome)
        except Exception:  # noqa: BLE001 - documented: ignored, the consumer goes on
            pass

    def drain(self, drain: float, unstarted: list[Delivery], renew_every: float) -> None:
        """Gives running handlers ``drain`` seconds, renewing their deliveries every
        ``renew_every`` seconds meanwhile, then hands back the records of those still running
        and ``unstarted``; returns once every answer is sent."""
        now = time.monotonic()
        give_up, renew_at = now + drain, now + renew_every
        while True:
            with self.lock:
                now = time.monotonic()
                running = [d for s, d in self.state.values() if s == _RUNNING]
                if not running or now >= give_up:
                    break
                if now < renew_at:
                    self.lock.wait(min(give_up, renew_at) - now)
                    continue
                renew_at = now + renew_every
            # Outside the lock, without waiting: a lost renewal costs nothing (the drain ends
            # soon), and one that comes after the handler's answer is merely STALE.
            for delivery in running:
                delivery.answer(AckType.RENEW)
        with self.lock:
            back = list(unstarted)
            for token, (s, delivery) in list(self.state.items()):
                if s == _RUNNING:
                    self.state[token] = (_HANDED_BACK, delivery)
                    back.append(delivery)
        answers = [(d, d.answer(AckType.RETRY, delay=0, reason=SHUT_DOWN_REASON)) for d in back]
        for delivery, answer in answers:
            try:
                outcome = answer.result()
            except KafkaLeaseError:
                continue
            self.stats.handed_back += 1
            self.told(delivery, AckType.RETRY, outcome)
        with self.lock:
            while any(s == _ANSWERING for s, _ in self.state.values()):
                self.lock.wait()


class _LeaseSource:
    """A lease's :class:`Deliveries` as a consumer's source: pausing closes the Deliver."""

    def __init__(self, deliveries: Deliveries, ttl: float) -> None:
        self.deliveries = deliveries
        self._ttl = ttl

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        return self.deliveries.next_delivery(timeout)

    def pause(self) -> list[Delivery]:
        return self.deliveries.close()

    def close(self) -> None:
        pass

    def renew_every(self) -> float:
        # A third of the TTL: with the Deliver closed, the renewals keep the lease alive.
        return max(self._ttl / 3, _MIN_RENEW_EVERY)


def consume(
    open_deliveries: Callable[[QueueOptions], Deliveries],
    handler: Callable[[Delivery], object],
    options: QueueOptions | None,
    *,
    concurrency: int,
    ttl: float,
    **kwargs: Any,
) -> ConsumeStats:
    """:meth:`Lease.consume`: :func:`consume_from` the lease's Deliver, with
    ``max_in_flight`` = ``concurrency`` unless set; ``ttl`` is the lease's (seconds)."""
    queue_options = options or QueueOptions()
    if not queue_options.max_in_flight:
        queue_options = replace(queue_options, max_in_flight=min(max(1, int(concurrency)), _MAX_BATCH))
    source = _LeaseSource(open_deliveries(queue_options), ttl)
    return consume_from(source, handler, concurrency=concurrency, **kwargs)


def consume_from(
    source: DeliverySource,
    handler: Callable[[Delivery], object],
    *,
    concurrency: int,
    stop: Stop | None,
    error_policy: ErrorPolicy | None,
    backoff: tuple[Seconds, Seconds],
    drain: Seconds,
    on_answer: OnAnswer | None = None,
    poll: float = 0.1,
) -> ConsumeStats:
    """The consumer loop: ``handler`` on up to ``concurrency`` threads over ``source``'s
    deliveries until ``stop`` is set or the source ends; then ``source.pause()``, the drain
    (running handlers get ``drain`` seconds, their deliveries renewed every
    ``source.renew_every()`` seconds meanwhile, then what is unfinished is handed back), and
    only then ``source.close()``."""
    concurrency = max(1, int(concurrency))
    consumer = _Consumer(handler, concurrency, error_policy or retry_with_backoff, backoff, on_answer)
    deliveries = source
    ended: KafkaLeaseError | None = None
    unstarted: list[Delivery] = []
    try:
        while stop is None or not stop.is_set():
            if not consumer.slots.acquire(timeout=poll):
                continue
            try:
                delivery = deliveries.next_delivery(timeout=poll)
            except TimeoutError:
                consumer.slots.release()
                continue
            except KafkaLeaseError as error:
                consumer.slots.release()
                ended = error
                break
            except BaseException:
                consumer.slots.release()
                raise
            if delivery is None:
                consumer.slots.release()
                break
            consumer.start(delivery)
    finally:
        # Stop taking deliveries; those received and not started go back with the running
        # ones that outlast the drain. The source is closed only after that, so that the
        # answers still reach their leases.
        try:
            unstarted = deliveries.pause()
            consumer.drain(as_seconds(drain), unstarted, deliveries.renew_every())
        finally:
            deliveries.close()
    if ended is not None:
        raise ended
    return consumer.stats
