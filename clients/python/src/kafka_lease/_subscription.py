"""Groups that balance themselves: :meth:`Client.subscribe` joins a group as a member and the
gateways share the topics' partitions among the members."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import grpc

from kafka_lease._errors import KafkaLeaseError
from kafka_lease._handle import Connection, LeaseHandle
from kafka_lease._stream import Pump, deadline_of
from kafka_lease._types import Batch, OffsetReset, Seconds, to_datetime, to_duration
from kafka_lease._types import offset_reset as _offset_reset
from kafka_lease.v1 import partition_lease_pb2 as pb



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
        request = pb.SubscribeRequest(
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
        self._closed = False
        self._done = False
        #: The member's leases, by lease id.
        self.partitions: dict[str, Partition] = {}
        self._pump = Pump(client.stub.Subscribe(request))
        try:
            first = self._message(deadline_of(join_timeout))
        except BaseException:
            self._pump.close()
            raise
        if first is None or first.WhichOneof("event") != "joined":
            self._pump.close()
            raise KafkaLeaseError(grpc.StatusCode.INTERNAL, f"the subscription's first event was not `joined`: {first}")
        self.member_id: str = first.joined.member_id
        self.gateway: str = first.joined.gateway

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the subscription: the member leaves the group, its leases are released."""
        self._closed = True
        self._pump.close()

    def __iter__(self) -> Iterator[Event]:
        while (event := self.next_event()) is not None:
            yield event

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event; ``None`` once the stream ended with OK or was closed; raises
        TimeoutError after ``timeout`` seconds without one, :class:`KafkaLeaseError` when the
        gateway ended the stream with an error (subscribe again)."""
        deadline = deadline_of(timeout)
        while True:
            message = self._message(deadline)
            if message is None:
                return None
            event = self._event(message)
            if event is not None:
                return event

    def _message(self, deadline: float | None) -> pb.SubscribeResponse | None:
        if self._done or self._closed:
            return None
        kind, value = self._pump.get(deadline)
        if kind == "item":
            return value
        self._done = True
        if kind == "end" or self._closed:
            return None
        if isinstance(value, grpc.RpcError):
            raise KafkaLeaseError.from_rpc_error(value) from None
        raise value

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
