from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    INVALID_FIELD: _ClassVar[ErrorReason]
    TOPIC_NOT_FOUND: _ClassVar[ErrorReason]
    PARTITION_NOT_FOUND: _ClassVar[ErrorReason]
    LEASE_NOT_FOUND: _ClassVar[ErrorReason]
    PARTITION_BUSY: _ClassVar[ErrorReason]
    WRONG_GATEWAY: _ClassVar[ErrorReason]
    LEASE_LOST: _ClassVar[ErrorReason]
    LEASE_EXPIRED: _ClassVar[ErrorReason]
    LEASE_RELEASED: _ClassVar[ErrorReason]
    LEASE_ABANDONED: _ClassVar[ErrorReason]
    OFFSET_OUT_OF_RANGE: _ClassVar[ErrorReason]
    SUPERSEDED: _ClassVar[ErrorReason]
    SHUTTING_DOWN: _ClassVar[ErrorReason]
    KAFKA_UNAVAILABLE: _ClassVar[ErrorReason]
    CONSUL_UNAVAILABLE: _ClassVar[ErrorReason]
    KAFKA_DENIED: _ClassVar[ErrorReason]
    KAFKA_REFUSED: _ClassVar[ErrorReason]
    LIMIT_REACHED: _ClassVar[ErrorReason]
    GATEWAY_UNREACHABLE: _ClassVar[ErrorReason]
    MEMBER_ACTIVE: _ClassVar[ErrorReason]
    LEASE_REVOKED: _ClassVar[ErrorReason]
    NOT_AUTHENTICATED: _ClassVar[ErrorReason]
    ACTION_DENIED: _ClassVar[ErrorReason]
    WRONG_MODE: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
INVALID_FIELD: ErrorReason
TOPIC_NOT_FOUND: ErrorReason
PARTITION_NOT_FOUND: ErrorReason
LEASE_NOT_FOUND: ErrorReason
PARTITION_BUSY: ErrorReason
WRONG_GATEWAY: ErrorReason
LEASE_LOST: ErrorReason
LEASE_EXPIRED: ErrorReason
LEASE_RELEASED: ErrorReason
LEASE_ABANDONED: ErrorReason
OFFSET_OUT_OF_RANGE: ErrorReason
SUPERSEDED: ErrorReason
SHUTTING_DOWN: ErrorReason
KAFKA_UNAVAILABLE: ErrorReason
CONSUL_UNAVAILABLE: ErrorReason
KAFKA_DENIED: ErrorReason
KAFKA_REFUSED: ErrorReason
LIMIT_REACHED: ErrorReason
GATEWAY_UNREACHABLE: ErrorReason
MEMBER_ACTIVE: ErrorReason
LEASE_REVOKED: ErrorReason
NOT_AUTHENTICATED: ErrorReason
ACTION_DENIED: ErrorReason
WRONG_MODE: ErrorReason
