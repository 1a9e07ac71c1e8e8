import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OffsetReset(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFSET_RESET_UNSPECIFIED: _ClassVar[OffsetReset]
    OFFSET_RESET_EARLIEST: _ClassVar[OffsetReset]
    OFFSET_RESET_LATEST: _ClassVar[OffsetReset]

class TimestampType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIMESTAMP_TYPE_UNSPECIFIED: _ClassVar[TimestampType]
    TIMESTAMP_TYPE_CREATE_TIME: _ClassVar[TimestampType]
    TIMESTAMP_TYPE_LOG_APPEND_TIME: _ClassVar[TimestampType]

class DeliveryOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_ORDER_UNSPECIFIED: _ClassVar[DeliveryOrder]
    DELIVERY_ORDER_PARTITION: _ClassVar[DeliveryOrder]
    DELIVERY_ORDER_KEY: _ClassVar[DeliveryOrder]
    DELIVERY_ORDER_UNORDERED: _ClassVar[DeliveryOrder]

class AckType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_TYPE_UNSPECIFIED: _ClassVar[AckType]
    ACK_TYPE_ACCEPT: _ClassVar[AckType]
    ACK_TYPE_RETRY: _ClassVar[AckType]
    ACK_TYPE_REJECT: _ClassVar[AckType]
    ACK_TYPE_RENEW: _ClassVar[AckType]

class AckOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_OUTCOME_UNSPECIFIED: _ClassVar[AckOutcome]
    ACK_OUTCOME_APPLIED: _ClassVar[AckOutcome]
    ACK_OUTCOME_STALE: _ClassVar[AckOutcome]
    ACK_OUTCOME_NOT_DELIVERED: _ClassVar[AckOutcome]
OFFSET_RESET_UNSPECIFIED: OffsetReset
OFFSET_RESET_EARLIEST: OffsetReset
OFFSET_RESET_LATEST: OffsetReset
TIMESTAMP_TYPE_UNSPECIFIED: TimestampType
TIMESTAMP_TYPE_CREATE_TIME: TimestampType
TIMESTAMP_TYPE_LOG_APPEND_TIME: TimestampType
DELIVERY_ORDER_UNSPECIFIED: DeliveryOrder
DELIVERY_ORDER_PARTITION: DeliveryOrder
DELIVERY_ORDER_KEY: DeliveryOrder
DELIVERY_ORDER_UNORDERED: DeliveryOrder
ACK_TYPE_UNSPECIFIED: AckType
ACK_TYPE_ACCEPT: AckType
ACK_TYPE_RETRY: AckType
ACK_TYPE_REJECT: AckType
ACK_TYPE_RENEW: AckType
ACK_OUTCOME_UNSPECIFIED: AckOutcome
ACK_OUTCOME_APPLIED: AckOutcome
ACK_OUTCOME_STALE: AckOutcome
ACK_OUTCOME_NOT_DELIVERED: AckOutcome

class AcquireRequest(_message.Message):
    __slots__ = ("group", "topic", "partition", "member", "ttl", "wait", "offset_reset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_RESET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    partition: int
    member: str
    ttl: _duration_pb2.Duration
    wait: _duration_pb2.Duration
    offset_reset: OffsetReset
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., member: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., offset_reset: _Optional[_Union[OffsetReset, str]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease_id", "topic", "partition", "fencing_token", "offset", "high_watermark", "expires_at", "group", "gateway", "ttl", "gateway_address")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    topic: str
    partition: int
    fencing_token: int
    offset: int
    high_watermark: int
    expires_at: _timestamp_pb2.Timestamp
    group: str
    gateway: str
    ttl: _duration_pb2.Duration
    gateway_address: str
    def __init__(self, lease_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., fencing_token: _Optional[int] = ..., offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., group: _Optional[str] = ..., gateway: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., gateway_address: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("lease_id", "max_records", "max_bytes", "max_wait", "from_offset", "if_seek_epoch")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IF_SEEK_EPOCH_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    max_records: int
    max_bytes: int
    max_wait: _duration_pb2.Duration
    from_offset: int
    if_seek_epoch: int
    def __init__(self, lease_id: _Optional[str] = ..., max_records: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., from_offset: _Optional[int] = ..., if_seek_epoch: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("records", "high_watermark", "seek_epoch", "next_offset")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SEEK_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[KafkaRecord]
    high_watermark: int
    seek_epoch: int
    next_offset: int
    def __init__(self, records: _Optional[_Iterable[_Union[KafkaRecord, _Mapping]]] = ..., high_watermark: _Optional[int] = ..., seek_epoch: _Optional[int] = ..., next_offset: _Optional[int] = ...) -> None: ...

class KafkaRecord(_message.Message):
    __slots__ = ("offset", "key", "value", "headers", "timestamp", "timestamp_type")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_TYPE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[KafkaHeader]
    timestamp: _timestamp_pb2.Timestamp
    timestamp_type: TimestampType
    def __init__(self, offset: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[KafkaHeader, _Mapping]]] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., timestamp_type: _Optional[_Union[TimestampType, str]] = ...) -> None: ...

class KafkaHeader(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("lease_id", "offset", "timestamp", "earliest", "latest", "committed")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    offset: int
    timestamp: _timestamp_pb2.Timestamp
    earliest: _empty_pb2.Empty
    latest: _empty_pb2.Empty
    committed: _empty_pb2.Empty
    def __init__(self, lease_id: _Optional[str] = ..., offset: _Optional[int] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., earliest: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ..., latest: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ..., committed: _Optional[_Union[_empty_pb2.Empty, _Mapping]] = ...) -> None: ...

class SeekResponse(_message.Message):
    __slots__ = ("offset", "seek_epoch")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEEK_EPOCH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    seek_epoch: int
    def __init__(self, offset: _Optional[int] = ..., seek_epoch: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("lease_id", "offset", "metadata")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    offset: int
    metadata: str
    def __init__(self, lease_id: _Optional[str] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("offset", "metadata")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    metadata: str
    def __init__(self, offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "commit_offset")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    commit_offset: int
    def __init__(self, lease_id: _Optional[str] = ..., commit_offset: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("committed_offset",)
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    committed_offset: int
    def __init__(self, committed_offset: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("group", "topics", "member", "member_id", "max_records", "max_bytes", "max_wait", "offset_reset", "max_partitions", "revoke_grace", "session_grace", "queue")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_RESET_FIELD_NUMBER: _ClassVar[int]
    MAX_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REVOKE_GRACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_GRACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    member: str
    member_id: str
    max_records: int
    max_bytes: int
    max_wait: _duration_pb2.Duration
    offset_reset: OffsetReset
    max_partitions: int
    revoke_grace: _duration_pb2.Duration
    session_grace: _duration_pb2.Duration
    queue: QueueSettings
    def __init__(self, group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., member: _Optional[str] = ..., member_id: _Optional[str] = ..., max_records: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., offset_reset: _Optional[_Union[OffsetReset, str]] = ..., max_partitions: _Optional[int] = ..., revoke_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., session_grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., queue: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class QueueSettings(_message.Message):
    __slots__ = ("ordering", "max_in_flight", "max_in_flight_bytes", "ack_deadline", "max_deliveries", "dead_letter_topic")
    ORDERING_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACK_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    ordering: DeliveryOrder
    max_in_flight: int
    max_in_flight_bytes: int
    ack_deadline: _duration_pb2.Duration
    max_deliveries: int
    dead_letter_topic: str
    def __init__(self, ordering: _Optional[_Union[DeliveryOrder, str]] = ..., max_in_flight: _Optional[int] = ..., max_in_flight_bytes: _Optional[int] = ..., ack_deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_deliveries: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("joined", "assigned", "records", "revoking", "revoked", "deliveries")
    JOINED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    joined: Joined
    assigned: Assigned
    records: SubscribedRecords
    revoking: Revoking
    revoked: Revoked
    deliveries: SubscribedDeliveries
    def __init__(self, joined: _Optional[_Union[Joined, _Mapping]] = ..., assigned: _Optional[_Union[Assigned, _Mapping]] = ..., records: _Optional[_Union[SubscribedRecords, _Mapping]] = ..., revoking: _Optional[_Union[Revoking, _Mapping]] = ..., revoked: _Optional[_Union[Revoked, _Mapping]] = ..., deliveries: _Optional[_Union[SubscribedDeliveries, _Mapping]] = ...) -> None: ...

class Joined(_message.Message):
    __slots__ = ("member_id", "gateway")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    gateway: str
    def __init__(self, member_id: _Optional[str] = ..., gateway: _Optional[str] = ...) -> None: ...

class Assigned(_message.Message):
    __slots__ = ("lease_id", "topic", "partition", "fencing_token", "offset", "high_watermark")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    topic: str
    partition: int
    fencing_token: int
    offset: int
    high_watermark: int
    def __init__(self, lease_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., fencing_token: _Optional[int] = ..., offset: _Optional[int] = ..., high_watermark: _Optional[int] = ...) -> None: ...

class SubscribedRecords(_message.Message):
    __slots__ = ("lease_id", "topic", "partition", "seek_epoch", "high_watermark", "records")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SEEK_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    topic: str
    partition: int
    seek_epoch: int
    high_watermark: int
    records: _containers.RepeatedCompositeFieldContainer[KafkaRecord]
    def __init__(self, lease_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., seek_epoch: _Optional[int] = ..., high_watermark: _Optional[int] = ..., records: _Optional[_Iterable[_Union[KafkaRecord, _Mapping]]] = ...) -> None: ...

class SubscribedDeliveries(_message.Message):
    __slots__ = ("lease_id", "topic", "partition", "high_watermark", "deliveries")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    topic: str
    partition: int
    high_watermark: int
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, lease_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., high_watermark: _Optional[int] = ..., deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class Revoking(_message.Message):
    __slots__ = ("lease_id", "topic", "partition", "deadline")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    topic: str
    partition: int
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, lease_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Revoked(_message.Message):
    __slots__ = ("lease_id", "topic", "partition", "reason", "message")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    topic: str
    partition: int
    reason: str
    message: str
    def __init__(self, lease_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ("group", "topic")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class ListMembersResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    def __init__(self, members: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ...) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("group", "topic", "member_id", "member", "gateway", "max_partitions", "joined_at", "partitions", "group_epoch", "target_partitions", "awaiting_target")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    MAX_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    JOINED_AT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    AWAITING_TARGET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    member_id: str
    member: str
    gateway: str
    max_partitions: int
    joined_at: _timestamp_pb2.Timestamp
    partitions: _containers.RepeatedScalarFieldContainer[int]
    group_epoch: int
    target_partitions: _containers.RepeatedScalarFieldContainer[int]
    awaiting_target: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., member_id: _Optional[str] = ..., member: _Optional[str] = ..., gateway: _Optional[str] = ..., max_partitions: _Optional[int] = ..., joined_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., partitions: _Optional[_Iterable[int]] = ..., group_epoch: _Optional[int] = ..., target_partitions: _Optional[_Iterable[int]] = ..., awaiting_target: _Optional[bool] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("group", "topic", "page_size", "page_token")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    page_size: int
    page_token: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases", "next_page_token")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseInfo]
    next_page_token: str
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class LeaseInfo(_message.Message):
    __slots__ = ("group", "topic", "partition", "member", "fencing_token", "acquired_at", "expires_at", "gateway", "position", "committed_offset", "high_watermark", "lag", "read_lag", "details_unavailable", "gateway_address", "member_id", "queue")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    READ_LAG_FIELD_NUMBER: _ClassVar[int]
    DETAILS_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    partition: int
    member: str
    fencing_token: int
    acquired_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    gateway: str
    position: int
    committed_offset: int
    high_watermark: int
    lag: int
    read_lag: int
    details_unavailable: str
    gateway_address: str
    member_id: str
    queue: QueueInfo
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., member: _Optional[str] = ..., fencing_token: _Optional[int] = ..., acquired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gateway: _Optional[str] = ..., position: _Optional[int] = ..., committed_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., lag: _Optional[int] = ..., read_lag: _Optional[int] = ..., details_unavailable: _Optional[str] = ..., gateway_address: _Optional[str] = ..., member_id: _Optional[str] = ..., queue: _Optional[_Union[QueueInfo, _Mapping]] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("ordering", "in_flight", "oldest_in_flight", "waiting", "deliveries", "redeliveries", "dead_letters", "dead_letter_topic", "progress_age", "done_not_committed")
    ORDERING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    REDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AGE_FIELD_NUMBER: _ClassVar[int]
    DONE_NOT_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ordering: DeliveryOrder
    in_flight: int
    oldest_in_flight: _duration_pb2.Duration
    waiting: int
    deliveries: int
    redeliveries: int
    dead_letters: int
    dead_letter_topic: str
    progress_age: _duration_pb2.Duration
    done_not_committed: int
    def __init__(self, ordering: _Optional[_Union[DeliveryOrder, str]] = ..., in_flight: _Optional[int] = ..., oldest_in_flight: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., waiting: _Optional[int] = ..., deliveries: _Optional[int] = ..., redeliveries: _Optional[int] = ..., dead_letters: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ..., progress_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., done_not_committed: _Optional[int] = ...) -> None: ...

class DeliverRequest(_message.Message):
    __slots__ = ("lease_id", "ordering", "max_in_flight", "max_in_flight_bytes", "ack_deadline", "max_deliveries", "dead_letter_topic")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ORDERING_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACK_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    ordering: DeliveryOrder
    max_in_flight: int
    max_in_flight_bytes: int
    ack_deadline: _duration_pb2.Duration
    max_deliveries: int
    dead_letter_topic: str
    def __init__(self, lease_id: _Optional[str] = ..., ordering: _Optional[_Union[DeliveryOrder, str]] = ..., max_in_flight: _Optional[int] = ..., max_in_flight_bytes: _Optional[int] = ..., ack_deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_deliveries: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class DeliverResponse(_message.Message):
    __slots__ = ("deliveries", "high_watermark")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    high_watermark: int
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., high_watermark: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("record", "attempt", "deadline")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    record: KafkaRecord
    attempt: int
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, record: _Optional[_Union[KafkaRecord, _Mapping]] = ..., attempt: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AcknowledgeRequest(_message.Message):
    __slots__ = ("lease_id", "acknowledgements")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGEMENTS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    acknowledgements: _containers.RepeatedCompositeFieldContainer[Acknowledgement]
    def __init__(self, lease_id: _Optional[str] = ..., acknowledgements: _Optional[_Iterable[_Union[Acknowledgement, _Mapping]]] = ...) -> None: ...

class Acknowledgement(_message.Message):
    __slots__ = ("offset", "type", "attempt", "retry_delay", "reason")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    offset: int
    type: AckType
    attempt: int
    retry_delay: _duration_pb2.Duration
    reason: str
    def __init__(self, offset: _Optional[int] = ..., type: _Optional[_Union[AckType, str]] = ..., attempt: _Optional[int] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class AcknowledgeResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedScalarFieldContainer[AckOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[AckOutcome, str]]] = ...) -> None: ...
