"""What a :class:`Lease` and a subscription's :class:`Partition` share (:class:`LeaseHandle`),
and what they call through (:class:`Connection`): a module of its own, so that neither the
lease nor the subscription module needs the client that makes them."""

from __future__ import annotations

from typing import Any, Protocol

from kafka_lease._types import EpochFilter, Position, SeekResult, seek_position
from kafka_lease.v1 import partition_lease_pb2 as pb


class Connection(Protocol):
    """What a lease's calls go through: a :class:`Client`."""

    @property
    def stub(self) -> Any: ...

    @property
    def timeout(self) -> float | None: ...

    def call(self, method: str, request: Any) -> Any: ...


class LeaseHandle:
    """Commit, seek and release on a lease id: what a :class:`Lease` and a subscription's
    :class:`Partition` share."""

    def __init__(self, client: Connection, lease_id: str, topic: str, partition: int, fencing_token: int) -> None:
        self._client = client
        #: The opaque lease id: a bearer credential, do not log it.
        self.lease_id = lease_id
        self.topic = topic
        self.partition = partition
        self.fencing_token = fencing_token
        self.epochs = EpochFilter()
        self.released = False

    @property
    def seek_epoch(self) -> int:
        """The newest seek epoch seen for this lease (0 until the first seek)."""
        return self.epochs.newest

    def commit(self, offset: int, metadata: str | None = None) -> None:
        """Commits ``offset`` (the next offset to read: last processed + 1), fenced by the
        lease, with optional ``metadata`` (at most 4057 UTF-8 bytes)."""
        self._client.call("Commit", pb.CommitRequest(lease_id=self.lease_id, offset=offset, metadata=metadata))

    def seek(self, position: Position) -> SeekResult:
        """Repositions the lease: ``seek(42)``, ``seek("earliest")``, ``seek("latest")``,
        ``seek("committed")`` or ``seek(datetime)``. Once it returns, nothing of the old
        position is handed out; the next record is at the result's offset (or the next
        existing one). Commits nothing."""
        request = seek_position(pb.SeekRequest(lease_id=self.lease_id), position)
        response = self._client.call("Seek", request)
        self.epochs.observe(response.seek_epoch)
        return SeekResult(response.offset, response.seek_epoch)

    def release(self, commit_offset: int | None = None) -> int | None:
        """Ends the lease, committing ``commit_offset`` first if given (if that commit is
        rejected the lease is kept). Returns the offset committed, if any."""
        response = self._client.call("Release", pb.ReleaseRequest(lease_id=self.lease_id, commit_offset=commit_offset))
        self.released = True
        return response.committed_offset if response.HasField("committed_offset") else None

    def __repr__(self) -> str:  # leaves out the lease id
        return f"{type(self).__name__}(topic={self.topic!r}, partition={self.partition}, fencing_token={self.fencing_token})"
