"""Groups that balance themselves: :meth:`Client.subscribe` joins a group as a member and the
gateways share the topics' partitions among the members."""

from __future__ import annotations

import datetime as _dt
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import grpc

from kafka_lease._errors import KafkaLeaseError
from kafka_lease._handle import Connection, LeaseHandle
from kafka_lease._stream import Pump, deadline_of, stream_broke
from kafka_lease._types import Batch, OffsetReset, Seconds, as_seconds, to_datetime, to_duration
from kafka_lease._types import offset_reset as _offset_reset
from kafka_lease.v1 import partition_lease_pb2 as pb

#: The wait before a resubscription: doubling from the first to the most.
_FIRST_BACKOFF, _MAX_BACKOFF = 0.1, 2.0


class Partition(LeaseHandle):
    """One of the member's leases: ``commit``, ``seek`` and ``release`` it like a
    :class:`Lease`. The same object comes with every event of the lease."""


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


Event = Union[Assigned, Records, Revoking, Revoked]


class Subscription:
    """A member of a group, from :meth:`Client.subscribe`; iterate it for events.

    The member stays in the group while the stream is open; :meth:`close` (or leaving the
    ``with`` block) cancels it: the member leaves and its leases are released. Commit what
    you processed *before* closing. ``next_event(timeout)`` waits at most ``timeout``
    seconds (TimeoutError), which lets a loop check a stop flag set by a signal handler.

    Options (unset ones take the gateway's defaults): ``member_id`` (stable id; the gateway
    makes one up otherwise), ``member`` (label), ``max_records``, ``max_bytes``,
    ``max_wait`` (per records event), ``offset_reset``, ``max_partitions`` (cap per topic),
    ``revoke_grace``, ``session_grace``, ``join_timeout`` (seconds to wait for ``joined``).

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
