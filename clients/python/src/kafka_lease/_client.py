"""The connection to a gateway (:class:`Client`) and a held lease (:class:`Lease`)."""

from __future__ import annotations

import datetime as _dt
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import grpc

from kafka_lease._errors import KafkaLeaseError, LeaseEndedError, NotFoundError
from kafka_lease._handle import LeaseHandle
from kafka_lease._listing import LeaseInfo
from kafka_lease._queue import (
    ConsumeStats,
    Deliveries,
    Delivery,
    ErrorPolicy,
    OnAnswer,
    QueueOptions,
    Stop,
    _Acks,
    consume as _consume,
)
from kafka_lease._stream import RecordStream
from kafka_lease._types import (
    OffsetReset,
    Seconds,
    as_seconds,
    offset_reset as _offset_reset,
    seconds_of,
    to_datetime,
    to_duration,
)
from kafka_lease.v1 import partition_lease_pb2 as pb
from kafka_lease.v1 import partition_lease_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from kafka_lease._subscription import Subscription

#: The largest response accepted by default (gRPC's own default, 4 MiB, is too small for the
#: gateway's largest batches: ``max_bytes`` does not count the protobuf framing, and a record
#: larger than it comes alone).
DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH = 64 * 1024 * 1024


class Client:
    """A connection to a kafka-lease gateway: ``Client("127.0.0.1:50051")``.

    Plaintext unless ``credentials`` (e.g. :func:`grpc.ssl_channel_credentials`) are given;
    ``options`` are extra channel arguments; ``channel`` uses an existing channel instead.
    ``timeout`` (seconds) bounds each unary call (Acquire: plus its ``wait``). Thread-safe;
    close it (or use ``with``) when done.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        channel: grpc.Channel | None = None,
        timeout: float | None = 30.0,
    ) -> None:
        if channel is None:
            if target is None:
                raise ValueError("Client needs a target ('host:port') or a channel")
            opts = list(options)
            if not any(key == "grpc.max_receive_message_length" for key, _ in opts):
                opts.append(("grpc.max_receive_message_length", DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH))
            if credentials is None:
                channel = grpc.insecure_channel(target, options=opts)
            else:
                channel = grpc.secure_channel(target, credentials, options=opts)
        self.channel = channel
        #: The generated stub, for calls and options this wrapper does not cover.
        self.stub = pb_grpc.PartitionLeaseServiceStub(channel)
        self.timeout = timeout

    def close(self) -> None:
        """Closes the channel; open streams end."""
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """One unary call of the stub, its failure raised as :class:`KafkaLeaseError`."""
        try:
            return getattr(self.stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            raise KafkaLeaseError.from_rpc_error(error) from None

    def acquire(
        self,
        group: str,
        topic: str,
        *,
        partition: int | None = None,
        member: str = "",
        ttl: Seconds | None = None,
        wait: Seconds | None = None,
        offset_reset: OffsetReset | str = OffsetReset.EARLIEST,
        retry_attempts: int = 5,
        retry_deadline: float = 30.0,
    ) -> Lease:
        """Takes an exclusive lease on ``partition`` of ``topic`` for ``group`` (or on any
        free partition). ``ttl`` default 10 s (1 s ..= 5 min); ``wait`` for a busy partition,
        default 0. Retries when the gateway says it may succeed later (UNAVAILABLE with
        RetryInfo, waiting its retry delay, or a broken connection), at most
        ``retry_attempts`` times within ``retry_deadline`` seconds.

        Raises :class:`BusyError` (``PARTITION_BUSY``: ``metadata["holder_member"]``),
        :class:`NotFoundError` (``TOPIC_NOT_FOUND``, ``PARTITION_NOT_FOUND``),
        :class:`InvalidArgumentError` (``INVALID_FIELD``), :class:`UnavailableError`.
        """
        request = pb.AcquireRequest(
            group=group,
            topic=topic,
            partition=partition,
            member=member,
            ttl=to_duration(ttl),
            wait=to_duration(wait),
            offset_reset=_offset_reset(offset_reset),
        )
        call_timeout = None if self.timeout is None else self.timeout + as_seconds(wait or 0)
        give_up = time.monotonic() + retry_deadline
        for attempt in range(1, retry_attempts + 1):
            try:
                response = self.call("Acquire", request, call_timeout)
                return Lease(self, response, group)
            except KafkaLeaseError as error:
                delay = error.retry_delay if error.retry_delay is not None else min(0.2 * 2 ** (attempt - 1), 2.0)
                if not error.is_retryable or attempt == retry_attempts or time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    def subscribe(self, group: str, topics: Sequence[str], **options: Any) -> Subscription:
        """Joins ``group`` as a member for ``topics``; see :class:`Subscription` for the
        options. Returns once the member has joined."""
        from kafka_lease._subscription import Subscription

        return Subscription(self, group, topics, **options)

    def list_members(self, group: str, topic: str | None = None) -> list[pb.MemberInfo]:
        """The members subscribed to ``group`` across every gateway instance."""
        return list(self.call("ListMembers", pb.ListMembersRequest(group=group, topic=topic)).members)

    def list_leases(
        self, group: str | None = None, topic: str | None = None, page_size: int = 0
    ) -> list[LeaseInfo]:
        """Every held lease (all pages; of ``group`` and/or ``topic`` if given), ordered by
        group, topic, partition: see :class:`LeaseInfo`."""
        leases: list[LeaseInfo] = []
        token = ""
        while True:
            request = pb.ListLeasesRequest(group=group, topic=topic, page_size=page_size, page_token=token)
            response = self.call("ListLeases", request)
            leases.extend(LeaseInfo.from_proto(info) for info in response.leases)
            if not response.next_page_token:
                return leases
            token = response.next_page_token


class Lease(LeaseHandle):
    """An exclusive, expiring lease on one partition, from :meth:`Client.acquire`.

    Alive while a :meth:`records` stream is open, and for ``ttl`` after the last call
    otherwise. ``with client.acquire(...) as lease:`` releases it at the end of the block.
    """

    def __init__(self, client: Client, response: pb.AcquireResponse, group: str) -> None:
        super().__init__(client, response.lease_id, response.topic, response.partition, response.fencing_token)
        self.group = response.group or group
        #: Where reading starts: the group's committed offset, else the reset position.
        self.offset: int = response.offset
        self.high_watermark: int = response.high_watermark
        self.expires_at: _dt.datetime | None = (
            to_datetime(response.expires_at) if response.HasField("expires_at") else None
        )
        self.gateway = response.gateway
        self.gateway_address = response.gateway_address
        #: The granted TTL in seconds.
        self.ttl: float = seconds_of(response.ttl) if response.HasField("ttl") else 10.0
        self._acks: _Acks | None = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.released:
            return
        try:
            self.release()
        except (NotFoundError, LeaseEndedError):
            pass  # already gone
        except KafkaLeaseError:
            if exc_type is None:
                raise

    def records(
        self,
        *,
        max_records: int = 0,
        max_bytes: int = 0,
        max_wait: Seconds | None = None,
        from_offset: int | None = None,
        reconnect_attempts: int = 8,
    ) -> RecordStream:
        """Opens a Read: the partition's records in order, from ``from_offset`` if given, else
        from the lease's resume point (Acquire offset, last commit or last seek). One Read per
        lease: a new one supersedes the old. ``max_bytes`` is a bound: the gateway sends at most
        256 KiB of records per batch whatever it allows (a single larger record comes alone).
        See :class:`RecordStream`."""
        template = pb.ReadRequest(
            lease_id=self.lease_id, max_records=max_records, max_bytes=max_bytes, max_wait=to_duration(max_wait)
        )

        def open_read(offset: int | None, if_seek_epoch: int | None) -> Any:
            request = pb.ReadRequest()
            request.CopyFrom(template)
            if offset is not None:
                request.from_offset = offset
            if if_seek_epoch is not None:
                request.if_seek_epoch = if_seek_epoch
            return self._client.stub.Read(request)

        return RecordStream(open_read, self.epochs, from_offset, reconnect_attempts)

    def deliveries(self, options: QueueOptions | None = None) -> Deliveries:
        """Puts the lease in queue mode (on the first call: from then on ``records``,
        ``seek``, ``commit`` and ``release(commit_offset=...)`` raise :class:`WrongModeError`;
        the gateway commits) and opens its Deliver: the records one by one, as
        :class:`Delivery` s to answer. One Deliver per lease: a new one (with the same
        ``options``) supersedes the old. See :class:`Deliveries`.

        Raises at once what the Deliver fails with: :class:`InvalidArgumentError` (a setting
        out of range, or not the queue's), :class:`NotFoundError` (``TOPIC_NOT_FOUND``: the
        dead letter topic does not exist), :class:`LeaseEndedError`.
        """
        options = options or QueueOptions()
        request = options.request(self.lease_id)
        if self._acks is None:
            self._acks = _Acks(self._client, self.lease_id)
        return Deliveries(
            lambda: self._client.stub.Deliver(request),
            self._acks,
            options.reconnect_attempts,
            self._client.timeout,
            self.topic,
            self.partition,
        )

    def consume(
        self,
        handler: Callable[[Delivery], object],
        options: QueueOptions | None = None,
        *,
        concurrency: int = 1,
        stop: Stop | None = None,
        error_policy: ErrorPolicy | None = None,
        backoff: tuple[Seconds, Seconds] = (0.1, 30.0),
        drain: Seconds = 10.0,
        on_answer: OnAnswer | None = None,
    ) -> ConsumeStats:
        """Runs ``handler(delivery)`` on every record of the lease in queue mode, on up to
        ``concurrency`` threads at once (and as many deliveries in flight, unless
        ``options.max_in_flight`` says otherwise), until ``stop`` is set (a
        :class:`threading.Event`, checked every 0.1 s) or the lease is released.

        A handler that returns accepts the record. One that raises :class:`Retry` has it
        delivered again (after its ``delay``, else the backoff: ``backoff[0]`` seconds
        doubling with each attempt up to ``backoff[1]``); :class:`Reject` sends it to the
        dead letter topic; any other exception goes to ``error_policy`` (default: retry with
        the backoff), which returns a :class:`Retry` or a :class:`Reject`. After the queue's
        ``max_deliveries`` a failing record goes to the dead letter topic. The handler may
        call ``delivery.renew()`` for more time; it should not answer the delivery itself.

        At the end it stops taking deliveries (closing the Deliver), gives the running
        handlers ``drain`` seconds, renewing their deliveries every third of the lease's
        ``ttl`` (at least 0.1 s) meanwhile, which keeps the lease alive, then hands back the
        records of those still running (and any received but not started): a RETRY without
        delay, reason :data:`SHUT_DOWN_REASON`; a handler that finishes later is not
        answered. Then release the lease: Release commits what was
        done.

        ``on_answer(delivery, ack_type, outcome)``, if given, is told of each answer sent
        and the gateway's :class:`AckOutcome` (say, to log a record once its ACCEPT is
        APPLIED).

        Returns the :class:`ConsumeStats`. Raises what opening the deliveries fails with
        (see :meth:`deliveries`), or, after the drain, the error that ended them (the lease
        ended, or a broken stream could not be reopened).
        """
        return _consume(
            self.deliveries,
            handler,
            options,
            concurrency=concurrency,
            ttl=self.ttl,
            stop=stop,
            error_policy=error_policy,
            backoff=backoff,
            drain=drain,
            on_answer=on_answer,
        )
