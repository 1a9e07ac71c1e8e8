"""Value types (records, batches, seek results) and conversions to and from the protobuf
well-known types."""

from __future__ import annotations

import datetime as _dt
import enum
import threading
from dataclasses import dataclass
from typing import Literal, NamedTuple, Union

from google.protobuf import duration_pb2, empty_pb2, timestamp_pb2

from kafka_lease.v1 import partition_lease_pb2 as pb

#: A duration: seconds as a number, or a :class:`datetime.timedelta`.
Seconds = Union[float, int, _dt.timedelta]

#: Where :meth:`Lease.seek` goes: an offset, the first record at or after a time (a
#: timezone-aware :class:`datetime.datetime`; a naive one is taken as UTC), or one of
#: ``"earliest"``, ``"latest"``, ``"committed"``.
Position = Union[int, _dt.datetime, Literal["earliest", "latest", "committed"]]


class OffsetReset(enum.IntEnum):
    """Where a lease starts when the group has no committed offset (Kafka's
    ``auto.offset.reset``)."""

    EARLIEST = pb.OFFSET_RESET_EARLIEST
    LATEST = pb.OFFSET_RESET_LATEST


def offset_reset(value: OffsetReset | str) -> int:
    if isinstance(value, str):
        return int(OffsetReset[value.upper()])
    return int(OffsetReset(value))


def as_seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, _dt.timedelta) else float(value)


def to_duration(value: Seconds | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    if isinstance(value, _dt.timedelta):
        nanos = (value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1000
    else:
        nanos = round(value * 1_000_000_000)
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(nanos)
    return duration


def seconds_of(duration: duration_pb2.Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def to_datetime(ts: timestamp_pb2.Timestamp) -> _dt.datetime:
    return ts.ToDatetime(tzinfo=_dt.timezone.utc)


def seek_position(request: pb.SeekRequest, position: Position) -> pb.SeekRequest:
    """Sets the oneof ``position`` of a SeekRequest."""
    if isinstance(position, bool):
        raise TypeError("seek position: an offset (int), a datetime, or 'earliest'/'latest'/'committed'")
    if isinstance(position, int):
        request.offset = position
    elif isinstance(position, _dt.datetime):
        if position.tzinfo is None:
            position = position.replace(tzinfo=_dt.timezone.utc)
        request.timestamp.FromDatetime(position)
    elif position in ("earliest", "latest", "committed"):
        getattr(request, position).CopyFrom(empty_pb2.Empty())
    else:
        raise ValueError(f"seek position {position!r}: an offset, a datetime, or 'earliest'/'latest'/'committed'")
    return request


class Header(NamedTuple):
    """A record header. ``value`` ``None`` is a null value, distinct from ``b""``."""

    key: str
    value: bytes | None


@dataclass(frozen=True)
class Record:
    """A Kafka record as the broker stored it. ``key``/``value`` ``None`` (a null key, a
    tombstone) is distinct from ``b""``; ``headers`` keep the producer's order and
    duplicates."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    #: Milliseconds since the epoch; ``None`` when the record has no timestamp.
    timestamp_ms: int | None
    #: ``pb.TIMESTAMP_TYPE_CREATE_TIME``, ``..._LOG_APPEND_TIME`` or ``..._UNSPECIFIED``.
    timestamp_type: int

    @property
    def timestamp(self) -> _dt.datetime | None:
        """The timestamp as an aware UTC datetime."""
        if self.timestamp_ms is None:
            return None
        return _dt.datetime.fromtimestamp(self.timestamp_ms / 1000, tz=_dt.timezone.utc)

    def header(self, key: str) -> Header | None:
        """The first header named ``key``, if any."""
        return next((h for h in self.headers if h.key == key), None)

    @classmethod
    def from_proto(cls, record: pb.KafkaRecord) -> Record:
        ts = record.timestamp
        return cls(
            offset=record.offset,
            key=record.key if record.HasField("key") else None,
            value=record.value if record.HasField("value") else None,
            headers=tuple(
                Header(h.key, h.value if h.HasField("value") else None) for h in record.headers
            ),
            timestamp_ms=ts.seconds * 1000 + ts.nanos // 1_000_000 if record.HasField("timestamp") else None,
            timestamp_type=record.timestamp_type,
        )


@dataclass(frozen=True)
class Batch:
    """Consecutive records of one partition, in offset order (one ReadResponse)."""

    records: list[Record]
    high_watermark: int
    seek_epoch: int
    # The gateway's ReadResponse.next_offset (0 when it has none).
    after: int = 0

    @property
    def next_offset(self) -> int | None:
        """The offset to commit once the batch is processed: last offset + 1, or further
        when the offsets after it hold no record (a transaction's marker)."""
        return max(self.records[-1].offset + 1, self.after) if self.records else None

    @classmethod
    def from_proto(cls, records, high_watermark: int, seek_epoch: int, after: int = 0) -> Batch:
        return cls([Record.from_proto(r) for r in records], high_watermark, seek_epoch, after)


class SeekResult(NamedTuple):
    """Where a seek went: the first record of the new epoch is at or after ``offset``."""

    offset: int
    seek_epoch: int


class EpochFilter:
    """The newest seek epoch a lease's client has seen. A Seek raises it; responses of an
    older epoch are dropped when handed out, so nothing from before a seek leaks after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._newest = 0

    @property
    def newest(self) -> int:
        return self._newest

    def observe(self, epoch: int) -> None:
        with self._lock:
            self._newest = max(self._newest, epoch)

    def admit(self, epoch: int) -> bool:
        """Whether a response of ``epoch`` may be handed out; a handed-out epoch becomes
        the newest."""
        with self._lock:
            if epoch < self._newest:
                return False
            self._newest = epoch
            return True
