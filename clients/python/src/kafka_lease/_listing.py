"""What :meth:`Client.list_leases` returns: the held leases as the gateways see them."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from kafka_lease._queue import Ordering
from kafka_lease._types import seconds_of, to_datetime
from kafka_lease.v1 import partition_lease_pb2 as pb


@dataclass(frozen=True)
class QueueInfo:
    """A queue-mode lease's deliveries (:attr:`LeaseInfo.queue`), live from the serving
    instance."""

    #: The ordering the queue was opened with; ``None`` for one this version does not know.
    ordering: Ordering | None
    #: Deliveries handed out and not answered.
    in_flight: int
    #: How long (seconds) the oldest of them has been out; ``None`` when none is.
    oldest_in_flight: float | None
    #: Records fetched and waiting to be handed out (a retry's delay included).
    waiting: int
    #: Deliveries handed out since the queue opened on this lease.
    deliveries: int
    #: Of those, deliveries of a record delivered before (after a RETRY or a deadline, or
    #: counted by an earlier holder).
    redeliveries: int
    #: Records written to the dead letter topic since the queue opened on this lease.
    dead_letters: int
    #: The dead letter topic.
    dead_letter_topic: str
    #: Seconds since the last commit of the queue's progress that landed (since the queue
    #: opened, before the first); ``None`` from a gateway too old to say.
    progress_age: float | None = None
    #: Records done that no landed commit carries yet: what a crash of the serving gateway
    #: now would deliver again, beside the records in flight.
    done_not_committed: int = 0

    @classmethod
    def from_proto(cls, queue: pb.QueueInfo) -> QueueInfo:
        if queue.ordering == pb.DELIVERY_ORDER_UNSPECIFIED:
            ordering: Ordering | None = Ordering.PARTITION  # what unset stands for
        else:
            try:
                ordering = Ordering(queue.ordering)
            except ValueError:
                ordering = None
        return cls(
            ordering=ordering,
            in_flight=queue.in_flight,
            oldest_in_flight=seconds_of(queue.oldest_in_flight) if queue.HasField("oldest_in_flight") else None,
            waiting=queue.waiting,
            deliveries=queue.deliveries,
            redeliveries=queue.redeliveries,
            dead_letters=queue.dead_letters,
            dead_letter_topic=queue.dead_letter_topic,
            progress_age=seconds_of(queue.progress_age) if queue.HasField("progress_age") else None,
            done_not_committed=queue.done_not_committed,
        )


@dataclass(frozen=True)
class LeaseInfo:
    """A held lease, from :meth:`Client.list_leases`. It has no lease id: listing a lease
    does not hand out its bearer credential.

    The fields marked *live* come from the instance serving the lease (renewals are not
    written to Consul); they are ``None`` when that instance did not answer in time, could
    not be reached or no longer serves the lease (then :attr:`details_unavailable` says
    why), and ``position``, ``committed_offset`` and ``lag`` are also ``None`` where they do
    not apply."""

    #: The lease's consumer group, topic and partition.
    group: str
    topic: str
    partition: int
    #: The holder's free-text label (``acquire(member=...)`` or ``subscribe(member=...)``).
    member: str
    #: The member id of the subscription that holds the lease; ``""`` for an acquired one.
    member_id: str
    #: The lease's fencing token (as :attr:`Lease.fencing_token`).
    fencing_token: int
    #: When the lease was granted (aware UTC).
    acquired_at: _dt.datetime | None
    #: When the lease expires if nothing renews it (aware UTC); ``None`` with
    #: :attr:`details_unavailable`.
    expires_at: _dt.datetime | None
    #: The gateway instance serving the lease, and its advertised ``host:port`` (``""`` when
    #: the instance recorded none).
    gateway: str
    gateway_address: str
    #: Live: the read position: with a Read open, the offset of the next record handed to it;
    #: with none, where the next Read starts (the resume point).
    position: int | None
    #: Live: the group's committed offset for the partition, where it has one.
    committed_offset: int | None
    #: Live: the partition's high watermark as the serving instance last saw it.
    high_watermark: int | None
    #: Live: high_watermark - committed_offset, the consumer lag as Kafka's tools give it
    #: (``None`` while the group has no committed offset). The figure to alert on.
    lag: int | None
    #: Live: high_watermark - position, the records the Read has still to hand over.
    read_lag: int | None
    #: ``""`` when the live fields are set; otherwise why they are not.
    details_unavailable: str
    #: Live, for a lease in queue mode: its deliveries; ``None`` otherwise.
    queue: QueueInfo | None

    @classmethod
    def from_proto(cls, info: pb.LeaseInfo) -> LeaseInfo:
        def optional(field: str) -> int | None:
            return getattr(info, field) if info.HasField(field) else None

        return cls(
            group=info.group,
            topic=info.topic,
            partition=info.partition,
            member=info.member,
            member_id=info.member_id,
            fencing_token=info.fencing_token,
            acquired_at=to_datetime(info.acquired_at) if info.HasField("acquired_at") else None,
            expires_at=to_datetime(info.expires_at) if info.HasField("expires_at") else None,
            gateway=info.gateway,
            gateway_address=info.gateway_address,
            position=optional("position"),
            committed_offset=optional("committed_offset"),
            high_watermark=optional("high_watermark"),
            lag=optional("lag"),
            read_lag=optional("read_lag"),
            details_unavailable=info.details_unavailable,
            queue=QueueInfo.from_proto(info.queue) if info.HasField("queue") else None,
        )
