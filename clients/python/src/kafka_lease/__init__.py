"""Python client for kafka-lease: exclusive, expiring leases on Kafka partitions for consumer
groups, through a kafka-lease gateway (gRPC).

A thin wrapper over the generated stubs in :mod:`kafka_lease.v1` (usable on their own;
:attr:`Client.stub` is the generated stub)::

    from kafka_lease import Client

    with Client("127.0.0.1:50051") as client:
        with client.acquire("demo-group", "demo", partition=0, ttl=30) as lease:
            with lease.records() as stream:
                for batch in stream.batches():
                    for record in batch.records:
                        print(record.offset, record.key, record.value)
                    lease.commit(batch.next_offset)
"""

from kafka_lease._client import DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH, Client, Lease
from kafka_lease._handle import LeaseHandle
from kafka_lease._listing import LeaseInfo, QueueInfo
from kafka_lease._errors import (
    ERROR_DOMAIN,
    BusyError,
    FailedPreconditionError,
    InvalidArgumentError,
    KafkaLeaseError,
    LeaseEndedError,
    NotFoundError,
    OutOfRangeError,
    SupersededError,
    UnavailableError,
    WrongModeError,
)
from kafka_lease._queue import (
    SHUT_DOWN_REASON,
    AckOutcome,
    AckType,
    ConsumeStats,
    Deliveries,
    Delivery,
    ErrorPolicy,
    OnAnswer,
    Ordering,
    QueueOptions,
    Reject,
    Retry,
    retry_with_backoff,
)
from kafka_lease._stream import RecordStream
from kafka_lease._subscription import Assigned, Delivered, Event, Partition, Records, Revoked, Revoking, Subscription
from kafka_lease._types import Batch, EpochFilter, Header, OffsetReset, Position, Record, SeekResult

__all__ = [
    "DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH",
    "ERROR_DOMAIN",
    "SHUT_DOWN_REASON",
    "AckOutcome",
    "AckType",
    "Assigned",
    "Batch",
    "BusyError",
    "Client",
    "ConsumeStats",
    "Deliveries",
    "Delivered",
    "Delivery",
    "ErrorPolicy",
    "EpochFilter",
    "Event",
    "FailedPreconditionError",
    "Header",
    "InvalidArgumentError",
    "KafkaLeaseError",
    "Lease",
    "LeaseEndedError",
    "LeaseHandle",
    "LeaseInfo",
    "NotFoundError",
    "OffsetReset",
    "OnAnswer",
    "Ordering",
    "OutOfRangeError",
    "Partition",
    "Position",
    "QueueInfo",
    "QueueOptions",
    "Record",
    "RecordStream",
    "Records",
    "Reject",
    "Retry",
    "Revoked",
    "Revoking",
    "SeekResult",
    "Subscription",
    "SupersededError",
    "UnavailableError",
    "WrongModeError",
    "retry_with_backoff",
]
