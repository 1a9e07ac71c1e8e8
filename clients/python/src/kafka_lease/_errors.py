"""Errors: gRPC statuses mapped to the kafka-lease API contract, with the machine-readable
reason, metadata and retry advice the gateway puts in the status details."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

#: The ``google.rpc.ErrorInfo`` domain of the gateway's errors; ErrorInfo of any other domain
#: (a proxy's, say) is ignored.
ERROR_DOMAIN = "kafka-lease"

_LEASE_ENDED = frozenset({"LEASE_LOST", "LEASE_EXPIRED", "LEASE_RELEASED", "LEASE_ABANDONED"})


class KafkaLeaseError(Exception):
    """A call failed. Branch on :attr:`reason` (an ``ErrorReason`` name of
    ``kafka_lease/v1/errors.proto``, e.g. ``"PARTITION_BUSY"``), never on the message.

    Attributes:
        code: the :class:`grpc.StatusCode`.
        message: the gateway's (or the transport's) message, for people.
        reason: ``ErrorInfo.reason`` of domain ``kafka-lease``; ``None`` when the status had
            none (a broken connection, or a gateway older than the details).
        metadata: ``ErrorInfo.metadata`` (``{"holder_member": ..., "partition": "3"}``);
            strings, numbers in decimal, times in RFC 3339.
        retry_delay: ``RetryInfo.retry_delay`` in seconds: present where the same call, sent
            again after it, can succeed.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}" + (f" [{reason}]" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.retry_delay = retry_delay

    @property
    def is_retryable(self) -> bool:
        """Whether the same call may succeed later: ``UNAVAILABLE`` with RetryInfo, or without
        any reason (the connection broke). ``PARTITION_BUSY`` is not: queue with ``wait``."""
        if self.code != grpc.StatusCode.UNAVAILABLE:
            return False
        return self.reason is None or self.retry_delay is not None

    @property
    def is_lease_ended(self) -> bool:
        """Whether the lease is gone for good (lost, expired, released, abandoned, or ended
        with its gateway's shutdown): only a new Acquire helps."""
        if self.reason in _LEASE_ENDED:
            return True
        return self.reason == "SHUTTING_DOWN" and "lease_ref" in self.metadata

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> KafkaLeaseError:
        """The error for a failed call (a :class:`grpc.RpcError` that is also a
        :class:`grpc.Call`), with the status details decoded from
        ``grpc-status-details-bin``."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = (error.details() if hasattr(error, "details") else None) or ""
        reason, metadata, retry_delay = _decode_details(error)
        if reason is None and code == grpc.StatusCode.FAILED_PRECONDITION:
            # A gateway older than the details: the contract's wording of a lease's end.
            lower = message.lower()
            ended = "lease lost" in lower or "lease expired" in lower
        else:
            ended = reason in _LEASE_ENDED
        if ended:
            kind: type[KafkaLeaseError] = LeaseEndedError
        elif reason == "WRONG_MODE" and code == grpc.StatusCode.FAILED_PRECONDITION:
            kind = WrongModeError
        else:
            kind = _BY_CODE.get(code, KafkaLeaseError)
        err = kind(code, message, reason, metadata, retry_delay)
        err.__cause__ = error
        return err


def _decode_details(error: grpc.RpcError) -> tuple[str | None, dict[str, str], float | None]:
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except (ValueError, AttributeError, TypeError):
        # Details that do not decode, or that contradict the status, count as absent.
        return None, {}, None
    if status is None:
        return None, {}, None
    reason: str | None = None
    metadata: dict[str, str] = {}
    retry_delay: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN and info.reason:
                reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            if retry.HasField("retry_delay"):
                retry_delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    return reason, metadata, retry_delay


class InvalidArgumentError(KafkaLeaseError):
    """``INVALID_ARGUMENT`` (reason ``INVALID_FIELD``, metadata ``field``)."""


class NotFoundError(KafkaLeaseError):
    """``NOT_FOUND``: ``TOPIC_NOT_FOUND``, ``PARTITION_NOT_FOUND`` or ``LEASE_NOT_FOUND``."""


class BusyError(KafkaLeaseError):
    """``RESOURCE_EXHAUSTED``: ``PARTITION_BUSY`` (metadata names the holder) or
    ``LIMIT_REACHED``."""


class FailedPreconditionError(KafkaLeaseError):
    """``FAILED_PRECONDITION`` other than a lease's end (``KAFKA_REFUSED``, ``WRONG_MODE``,
    ...)."""


class WrongModeError(FailedPreconditionError):
    """``WRONG_MODE``: the call does not fit the lease's mode. A Read, Seek or Commit (or
    ``release(commit_offset=...)``) on a lease in queue mode, where the gateway commits; an
    Acknowledge on a lease no Deliver has put in queue mode. Metadata ``lease_ref``,
    ``mode`` (``"queue"`` or ``"read"``, the lease's)."""


class LeaseEndedError(FailedPreconditionError):
    """The lease ended (``LEASE_LOST``, ``LEASE_EXPIRED``, ``LEASE_RELEASED``,
    ``LEASE_ABANDONED``): acquire a new one."""


class OutOfRangeError(KafkaLeaseError):
    """``OUT_OF_RANGE`` (``OFFSET_OUT_OF_RANGE``, metadata ``low`` and ``high``)."""


class SupersededError(KafkaLeaseError):
    """``ABORTED``: a newer Read on the lease took over this one."""


class UnavailableError(KafkaLeaseError):
    """``UNAVAILABLE``: Kafka, Consul or the gateway unreachable, or the gateway stopping.
    See :attr:`KafkaLeaseError.is_retryable`."""


_BY_CODE: dict[grpc.StatusCode, type[KafkaLeaseError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: BusyError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.ABORTED: SupersededError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
}
