"""Server streams: a pump that reads a gRPC stream on a thread (so that waits can have a
timeout), and the self-healing :class:`RecordStream` of a lease's Read."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

import grpc

from kafka_lease._errors import KafkaLeaseError
from kafka_lease._types import Batch, EpochFilter, Record

_ITEM, _END, _ERROR, _HEADERS = "item", "end", "error", "headers"


class Pump:
    """Reads a response stream on a daemon thread into a small bounded queue: the thread
    stops pulling when the queue is full, so HTTP/2 flow control still applies. With
    ``announce``, the first entry is ``("headers", initial metadata)`` once the response
    headers came (or the call ended without any: a status-only answer)."""

    def __init__(self, call: Any, depth: int = 4, announce: bool = False) -> None:
        self.call = call
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._announce = announce
        threading.Thread(target=self._run, name="kafka-lease-stream", daemon=True).start()

    def _run(self) -> None:
        try:
            if self._announce and not self._put((_HEADERS, self.call.initial_metadata())):
                return
            for message in self.call:
                if not self._put((_ITEM, message)):
                    return
            self._put((_END, None))
        except grpc.RpcError as error:
            self._put((_ERROR, error))
        except Exception as error:  # noqa: BLE001 - handed to the reader, never lost
            self._put((_ERROR, error))

    def _put(self, entry: tuple) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self, deadline: float | None) -> tuple[str, Any]:
        """The next entry; raises TimeoutError past ``deadline`` (a ``time.monotonic()``)."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no message within the timeout") from None

    def close(self) -> None:
        """Cancels the call; a reader waiting in :meth:`get` (on another thread) gets an end."""
        self._closed.set()
        self.call.cancel()
        try:
            self._queue.put_nowait((_END, None))
        except queue.Full:
            pass  # the reader has entries to take, and sees the close after them

    def drain(self) -> list[tuple[str, Any]]:
        """The entries queued now, without waiting (for a closed pump: what it had read)."""
        entries = []
        while True:
            try:
                entries.append(self._queue.get_nowait())
            except queue.Empty:
                return entries


def deadline_of(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


_BROKEN_WITHOUT_REASON = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED}
)
_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 2.0


def stream_broke(error: KafkaLeaseError) -> bool:
    """Whether a status that ended a Read says the stream broke, not the lease. With a
    reason, the gateway's RetryInfo decides; without one the transport made the status up
    (a dropped connection, an intermediary's reset)."""
    if error.reason is not None:
        return error.retry_delay is not None
    return error.code in _BROKEN_WITHOUT_REASON


class RecordStream:
    """An open Read on a lease, from :meth:`Lease.records`.

    Iterate it for :class:`Record` s, or call :meth:`batches` / :meth:`next_batch` for
    :class:`Batch` es (to commit ``batch.next_offset`` after each). Batches of a seek epoch
    older than the newest one the lease has seen are dropped. When the stream breaks (a
    transport failure, or UNAVAILABLE with RetryInfo), it reopens the Read with
    ``from_offset`` = the offset after the last record handed out (or at the lease's resume
    point if a seek happened since), so nothing is lost or repeated; after
    ``reconnect_attempts`` failures in a row the error is raised. The iteration ends after
    the lease is released; an error status (:class:`LeaseEndedError`,
    :class:`SupersededError`, ...) is raised once. :meth:`close` (or leaving a ``with``
    block) cancels the Read; it may be called from another thread.
    """

    def __init__(
        self,
        open_read: Callable[[int | None, int | None], Any],
        epochs: EpochFilter,
        from_offset: int | None,
        reconnect_attempts: int,
    ) -> None:
        self._open = open_read
        self._epochs = epochs
        self._attempts = reconnect_attempts
        self._failures = 0
        #: How many times the Read was reopened after a break.
        self.reconnects = 0
        self._delivered: tuple[int, int] | None = None  # (next offset, its epoch)
        self._pending: deque[Record] = deque()
        self._pending_epoch = 0
        self._pending_hwm = 0
        self._reopen_at: float | None = None
        self._done = False
        self._closed = False
        self._pump: Pump | None = Pump(open_read(from_offset, None))

    def __enter__(self) -> RecordStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancels the Read; iteration then ends."""
        self._closed = True
        if self._pump is not None:
            self._pump.close()

    def __iter__(self) -> Iterator[Record]:
        while (record := self.next_record()) is not None:
            yield record

    def batches(self) -> Iterator[Batch]:
        """The stream, batch by batch, until it ends."""
        while (batch := self.next_batch()) is not None:
            yield batch

    def next_record(self, timeout: float | None = None) -> Record | None:
        """The next record; ``None`` once the stream has ended; TimeoutError if none
        arrived within ``timeout`` seconds."""
        deadline = deadline_of(timeout)
        while True:
            if self._pending and self._epochs.newest <= self._pending_epoch:
                record = self._pending.popleft()
                self._delivered = (record.offset + 1, self._pending_epoch)
                return record
            self._pending.clear()  # stale after a seek, or empty
            batch = self._next_fresh(deadline)
            if batch is None:
                return None
            self._pending.extend(batch.records)
            self._pending_epoch, self._pending_hwm = batch.seek_epoch, batch.high_watermark

    def next_batch(self, timeout: float | None = None) -> Batch | None:
        """The next batch (what :meth:`next_record` left of the current one first); ``None``
        once the stream has ended; TimeoutError if none arrived within ``timeout`` seconds."""
        if self._pending and self._epochs.newest <= self._pending_epoch:
            batch = Batch(list(self._pending), self._pending_hwm, self._pending_epoch)
            self._pending.clear()
        else:
            self._pending.clear()
            batch = self._next_fresh(deadline_of(timeout))
            if batch is None:
                return None
        if batch.next_offset is not None:
            self._delivered = (batch.next_offset, batch.seek_epoch)
        return batch

    def _next_fresh(self, deadline: float | None) -> Batch | None:
        while True:
            if self._done or self._closed:
                return None
            if self._pump is None:  # reopening after a break
                wait = self._reopen_at - time.monotonic() if self._reopen_at else 0
                if wait > 0:
                    if deadline is not None and deadline < self._reopen_at:
                        time.sleep(max(0.0, deadline - time.monotonic()))
                        raise TimeoutError("no message within the timeout")
                    time.sleep(wait)
                self._pump = Pump(self._open(*self._reopen_from()))
                self.reconnects += 1
            kind, value = self._pump.get(deadline)
            if kind == _ITEM:
                if self._epochs.admit(value.seek_epoch):
                    self._failures = 0
                    return Batch.from_proto(
                        value.records, value.high_watermark, value.seek_epoch, value.next_offset
                    )
                continue  # stale: from before a seek
            if kind == _END or self._closed:
                self._done = True
                return None
            if not isinstance(value, grpc.RpcError):
                self._done = True
                raise value
            error = KafkaLeaseError.from_rpc_error(value)
            if stream_broke(error) and self._failures < self._attempts:
                backoff = min(_FIRST_BACKOFF * (1 << min(self._failures, 6)), _MAX_BACKOFF)
                self._failures += 1
                self._pump, self._reopen_at = None, time.monotonic() + backoff
                continue
            self._done = True
            raise error

    def _reopen_from(self) -> tuple[int | None, int | None]:
        """``(from_offset, if_seek_epoch)``: right after the last record handed out, while the
        lease is still at its seek epoch (the gateway checks, so a seek racing the reopen
        wins); ``(None, None)`` if a seek is known to have happened since (then the lease's
        resume point, which the seek set)."""
        if self._delivered is not None and self._epochs.newest <= self._delivered[1]:
            return self._delivered
        return None, None
