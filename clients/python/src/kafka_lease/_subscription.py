"""Groups that balance themselves: :meth:`Client.subscribe` joins a group as a member and the
gateways share the topics' partitions among the members."""

from __future__ import annotations

import datetime as _dt
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, Union

import grpc

from kafka_lease._errors import KafkaLeaseError
from kafka_lease._handle import Connection, LeaseHandle
from kafka_lease._queue import (
    ConsumeStats,
    Delivery,
    ErrorPolicy,
    OnAnswer,
    QueueOptions,
    Stop,
    _Acks,
    _MAX_SUBSCRIPTION_RENEW_EVERY,
    _MIN_RENEW_EVERY,
    consume_from,
)
from kafka_lease._stream import Pump, deadline_of, stream_broke
from kafka_lease._types import Batch, OffsetReset, Seconds, as_seconds, seconds_of, to_datetime, to_duration
from kafka_lease._types import offset_reset as _offset_reset
from kafka_lease.v1 import partition_lease_pb2 as pb

#: The wait before a resubscription: doubling from the first to the most.
_FIRST_BACKOFF, _MAX_BACKOFF = 0.1, 2.0
#: The gateway's ack deadline when the queue settings leave it unset.
_DEFAULT_ACK_DEADLINE = 30.0


class Partition(LeaseHandle):
    """One of the member's leases: ``commit``, ``seek`` and ``release`` it like a
    :class:`Lease`. The same object comes with every event of the lease."""

    def __init__(self, client: Connection, lease_id: str, topic: str, partition: int, fencing_token: int) -> None:
        super().__init__(client, lease_id, topic, partition, fencing_token)
        self._acks: _Acks | None = None

    def _answers(self) -> _Acks:
        """The lease's answer batcher (queue mode), made at its first deliveries."""
        if self._acks is None:
            self._acks = _Acks(self._client, self.lease_id)
        return self._acks


@dataclass(frozen=True)
class Assigned:
    """The member now holds ``partition``; its records follow from ``offset``."""

    partition: Partition
    offset: int
    high_watermark: int


@dataclass(frozen=True)
class Records:
    """A batch of one of the member's leases (stale seek epochs already dropped)."""

    partition: Partition
    batch: Batch


@dataclass(frozen=True)
class Delivered:
    """Deliveries of one of the member's leases, in queue mode (``subscribe(...,
    queue=QueueOptions(...))``): answer each :class:`Delivery` (``accept()``, ``retry()``,
    ``reject()``, ``renew()``) before its deadline; the gateway commits."""

    partition: Partition
    deliveries: list[Delivery]
    high_watermark: int


@dataclass(frozen=True)
class Revoking:
    """The lease moves to another member: no records of it follow. Commit what was
    processed before ``deadline``; it is released after that commit, or at the deadline."""

    partition: Partition
    deadline: _dt.datetime | None


@dataclass(frozen=True)
class Revoked:
    """The lease has ended; ``reason`` is an ErrorReason name (``LEASE_REVOKED`` after
    :class:`Revoking`, ``LEASE_RELEASED``, ``LEASE_LOST``, ...)."""

    partition: Partition
    reason: str
    message: str


Event = Union[Assigned, Records, Delivered, Revoking, Revoked]


class Subscription:
    """A member of a group, from :meth:`Client.subscribe`; iterate it for events.

    The member stays in the group while the stream is open; :meth:`close` (or leaving the
    ``with`` block) cancels it: the member leaves and its leases are released. Commit what
    you processed *before* closing. ``next_event(timeout)`` waits at most ``timeout``
    seconds (TimeoutError), which lets a loop check a stop flag set by a signal handler.

    Options (unset ones take the gateway's defaults): ``member_id`` (stable id; the gateway
    makes one up otherwise), ``member`` (label), ``max_records``, ``max_bytes`` (a bound: the
    gateway sends at most 256 KiB of records per event whatever it allows),
    ``max_wait`` (per records event), ``offset_reset``, ``max_partitions`` (cap per topic),
    ``revoke_grace``, ``session_grace``, ``join_timeout`` (seconds to wait for ``joined``),
    ``queue`` (:class:`QueueOptions`: every lease of the member in queue mode, its records
    coming as :class:`Delivered` events; ``max_in_flight`` and ``max_in_flight_bytes`` are
    shared by all the member's leases; ``reconnect_attempts`` does not apply). See
    :meth:`consume`.

    **Resubscribing.** With a ``session_grace`` (the gateway keeps a member whose stream
    ended, with its leases, for that long), a stream that breaks (a transport failure, or
    UNAVAILABLE with RetryInfo: a gateway shutting down, Kafka or Consul unreachable, the
    member's instance unreachable) is subscribed again by itself, with the same member id
    (the one from ``joined`` when none was given), topics and settings, waiting 0.1 s
    doubling up to 2 s between tries, for as long as the grace runs from the break. The
    events go on: the gateway sends :class:`Assigned` again for each lease the member still
    holds (the same :class:`Partition`, at its resume point: records come again from the
    last commit) or :class:`Revoking`. ``ALREADY_EXISTS`` (``MEMBER_ACTIVE``) met while
    resubscribing is tried again too within the grace, as the gateway may not have seen the
    old stream end yet (a connection that vanished without closing is found within the
    gateway's keepalive); past the grace it is raised. Any other error (``INVALID_ARGUMENT``,
    ``PERMISSION_DENIED``, ``NOT_FOUND``, ...) ends the subscription at once. Without a
    ``session_grace`` (or with 0) the member leaves when its stream ends, so nothing is
    resubscribed: the error is raised and you subscribe again. :attr:`resubscribes` counts
    the resubscriptions.
    """

    def __init__(
        self,
        client: Connection,
        group: str,
        topics: Sequence[str],
        *,
        member_id: str = "",
        member: str = "",
        max_records: int = 0,
        max_bytes: int = 0,
        max_wait: Seconds | None = None,
        offset_reset: OffsetReset | str = OffsetReset.EARLIEST,
        max_partitions: int = 0,
        revoke_grace: Seconds | None = None,
        session_grace: Seconds | None = None,
        join_timeout: float = 30.0,
        queue: QueueOptions | None = None,
    ) -> None:
        self._request = pb.SubscribeRequest(
            group=group,
            topics=list(topics),
            member=member,
            member_id=member_id,
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait=to_duration(max_wait),
            offset_reset=_offset_reset(offset_reset),
            max_partitions=max_partitions,
            revoke_grace=to_duration(revoke_grace),
            session_grace=to_duration(session_grace),
            queue=queue.settings() if queue is not None else None,
        )
        self._client = client
        self._grace = as_seconds(session_grace) if session_grace is not None else 0.0
        self._closed = threading.Event()
        self._done = False
        #: The member's leases, by lease id.
        self.partitions: dict[str, Partition] = {}
        #: How many times the subscription was resubscribed after its stream broke.
        self.resubscribes = 0
        self._broken_at: float | None = None  # when the stream broke, while resubscribing
        self._tries = 0  # resubscriptions tried since the break
        self._retry_at = 0.0
        self._joining = False  # a resubscription's stream, before its `joined`
        self._joined = False  # the first `joined` came: there is a member to take over
        self._pump: Pump | None = Pump(client.stub.Subscribe(self._request))
        try:
            first = self._message(deadline_of(join_timeout))
        except BaseException:
            self.close()
            raise
        if first is None or first.WhichOneof("event") != "joined":
            self.close()
            raise KafkaLeaseError(grpc.StatusCode.INTERNAL, f"the subscription's first event was not `joined`: {first}")
        self.member_id: str = first.joined.member_id
        self.gateway: str = first.joined.gateway
        self._joined = True
        # A resubscription takes the member over: same id, whichever the gateway made up.
        self._request.member_id = self.member_id

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the subscription: the member leaves the group, its leases are released."""
        self._closed.set()
        pump = self._pump
        if pump is not None:
            pump.close()

    def __iter__(self) -> Iterator[Event]:
        while (event := self.next_event()) is not None:
            yield event

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event; ``None`` once the stream ended with OK or was closed; raises
        TimeoutError after ``timeout`` seconds without one, :class:`KafkaLeaseError` when the
        stream ended with an error that resubscribing could not (or may not) mend: subscribe
        again."""
        deadline = deadline_of(timeout)
        while True:
            message = self._message(deadline)
            if message is None:
                return None
            event = self._event(message)
            if event is not None:
                return event

    def _message(self, deadline: float | None) -> pb.SubscribeResponse | None:
        while True:
            if self._done or self._closed.is_set():
                return None
            if self._pump is None:  # resubscribing after a break
                wait = self._retry_at - time.monotonic()
                if wait > 0:
                    if deadline is not None and deadline < self._retry_at:
                        self._closed.wait(max(0.0, deadline - time.monotonic()))
                        raise TimeoutError("no event within the timeout")
                    if self._closed.wait(wait):
                        return None
                self._pump = Pump(self._client.stub.Subscribe(self._request))
                self._joining = True
                if self._closed.is_set():
                    self._pump.close()
                    return None
            kind, value = self._pump.get(deadline)
            if kind == "item":
                if self._joining:
                    self._joining = False
                    if value.WhichOneof("event") == "joined":
                        # Back in: the events go on; `joined` itself is not one of them.
                        self.resubscribes += 1
                        self._broken_at, self._tries = None, 0
                        self.gateway = value.joined.gateway
                        continue
                return value
            if kind == "end" or self._closed.is_set():
                self._done = True
                return None
            if not isinstance(value, grpc.RpcError):
                self._done = True
                raise value
            error = KafkaLeaseError.from_rpc_error(value)
            if self._may_resubscribe(error):
                self._tries += 1
                self._pump = None
                self._retry_at = time.monotonic() + min(_FIRST_BACKOFF * 2 ** (self._tries - 1), _MAX_BACKOFF)
                continue
            self._done = True
            raise error

    def _may_resubscribe(self, error: KafkaLeaseError) -> bool:
        """Whether the stream that ended with ``error`` is subscribed again: it broke (or,
        while resubscribing, the gateway still sees the old stream) within the grace."""
        if self._grace <= 0 or not self._joined:
            return False  # no grace, or the first subscription: nothing to take over
        resubscribing = self._broken_at is not None
        if not (stream_broke(error) or (resubscribing and error.reason == "MEMBER_ACTIVE")):
            return False
        if self._broken_at is None:
            self._broken_at = time.monotonic()
        backoff = min(_FIRST_BACKOFF * 2**self._tries, _MAX_BACKOFF)
        return time.monotonic() + backoff < self._broken_at + self._grace

    def consume(
        self,
        handler: Callable[[Delivery], object],
        *,
        concurrency: int = 1,
        stop: Stop | None = None,
        error_policy: ErrorPolicy | None = None,
        backoff: tuple[Seconds, Seconds] = (0.1, 30.0),
        drain: Seconds = 10.0,
        on_answer: OnAnswer | None = None,
    ) -> ConsumeStats:
        """Runs ``handler(delivery)`` on every delivery of the member's leases, on up to
        ``concurrency`` threads, as :meth:`Lease.consume` does for one lease (same handler
        outcomes, ``error_policy``, ``backoff``, ``on_answer``); ``delivery.topic`` and
        ``delivery.partition`` say whose record it is. The subscription must have been made
        with ``queue=QueueOptions(...)``; its ``max_in_flight`` (gateway default 64, shared
        by the member's leases) bounds what waits for a free thread, so set it near
        ``concurrency``. The gateway follows assignments and revocations: a revoking lease
        gets no new deliveries and is released once none of its deliveries is in flight.

        Runs until ``stop`` is set (checked every 0.1 s) or the subscription ends. Then it
        takes no more deliveries but keeps the stream open (the member keeps its leases, so
        the answers land), gives running handlers ``drain`` seconds (renewing their
        deliveries meanwhile every third of the queue's ack deadline, at most 2 s, at least
        0.1 s), hands back what is unfinished (RETRY without delay,
        :data:`SHUT_DOWN_REASON`), and only then closes the subscription: the member leaves,
        its leases are released and their progress committed (after the ``session_grace``,
        if it has one). Returns the
        :class:`ConsumeStats`; raises, after the drain, the error that ended the
        subscription.
        """
        if not self._request.HasField("queue"):
            raise ValueError("Subscription.consume needs a subscription in queue mode: subscribe(..., queue=QueueOptions(...))")
        return consume_from(
            _SubscriptionSource(self),
            handler,
            concurrency=concurrency,
            stop=stop,
            error_policy=error_policy,
            backoff=backoff,
            drain=drain,
            on_answer=on_answer,
        )

    def _handle(self, lease_id: str, topic: str, partition: int, token: int = 0) -> Partition:
        handle = self.partitions.get(lease_id)
        if handle is None:
            handle = self.partitions[lease_id] = Partition(self._client, lease_id, topic, partition, token)
        return handle

    def _event(self, message: pb.SubscribeResponse) -> Event | None:
        which = message.WhichOneof("event")
        if which == "assigned":
            a = message.assigned
            return Assigned(self._handle(a.lease_id, a.topic, a.partition, a.fencing_token), a.offset, a.high_watermark)
        if which == "records":
            r = message.records
            handle = self._handle(r.lease_id, r.topic, r.partition)
            if not handle.epochs.admit(r.seek_epoch):
                return None  # from before a seek
            return Records(handle, Batch.from_proto(r.records, r.high_watermark, r.seek_epoch))
        if which == "deliveries":
            d = message.deliveries
            handle = self._handle(d.lease_id, d.topic, d.partition)
            acks = handle._answers()
            deliveries = [
                Delivery.from_proto(x, acks, d.topic, d.partition) for x in d.deliveries if x.HasField("record")
            ]
            return Delivered(handle, deliveries, d.high_watermark)
        if which == "revoking":
            r = message.revoking
            deadline = to_datetime(r.deadline) if r.HasField("deadline") else None
            return Revoking(self._handle(r.lease_id, r.topic, r.partition), deadline)
        if which == "revoked":
            r = message.revoked
            handle = self.partitions.pop(r.lease_id, None) or Partition(
                self._client, r.lease_id, r.topic, r.partition, 0
            )
            return Revoked(handle, r.reason, r.message)
        return None  # a later `joined`, or an event this version does not know


class _SubscriptionSource:
    """A subscription's deliveries, for :func:`consume_from`: pausing leaves the stream open
    (the member keeps its leases while its handlers drain), closing ends it."""

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self._pending: deque[Delivery] = deque()

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        deadline = deadline_of(timeout)
        while not self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            event = self._subscription.next_event(left)
            if event is None:
                return None
            if isinstance(event, Delivered):
                self._pending.extend(event.deliveries)
            elif isinstance(event, Revoked):
                # The lease has ended: its deliveries not started can no longer be answered.
                acks = event.partition._acks
                self._pending = deque(d for d in self._pending if acks is None or d._acks is not acks)
        return self._pending.popleft()

    def pause(self) -> list[Delivery]:
        pending, self._pending = list(self._pending), deque()
        return pending

    def close(self) -> None:
        self._subscription.close()

    def renew_every(self) -> float:
        # The open stream keeps the leases; renewals keep the deliveries' deadlines ahead.
        # An ack deadline of 0 is unset: the gateway's default.
        ack_deadline = seconds_of(self._subscription._request.queue.ack_deadline) or _DEFAULT_ACK_DEADLINE
        return max(_MIN_RENEW_EVERY, min(ack_deadline / 3, _MAX_SUBSCRIPTION_RENEW_EVERY))
