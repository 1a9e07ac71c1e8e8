"""Without a gateway: an in-process fake of the service for the paths a live gateway does not
take on demand (retry advice, reopening after a status), and the epoch filter."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
import datetime as dt

from google.protobuf import any_pb2, duration_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from kafka_lease import (
    SHUT_DOWN_REASON,
    AckOutcome,
    AckType,
    Assigned,
    Client,
    ConsumeStats,
    Delivery,
    EpochFilter,
    KafkaLeaseError,
    LeaseEndedError,
    LeaseInfo,
    Ordering,
    QueueInfo,
    QueueOptions,
    RecordStream,
    Reject,
    Retry,
    SupersededError,
    UnavailableError,
    WrongModeError,
)
from kafka_lease.v1 import partition_lease_pb2 as pb
from kafka_lease.v1 import partition_lease_pb2_grpc as pb_grpc


HOLD = object()  # in a script: the stream stays open until the client cancels it


def rich_status(code: int, message: str, reason: str, metadata=None, retry: float | None = None, domain="kafka-lease"):
    details = [error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata or {})]
    if retry is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=packed))


class FakeGateway(pb_grpc.PartitionLeaseServiceServicer):
    def __init__(self) -> None:
        self.acquire_answers: list = []  # a status to abort with, or a response
        self.acquires = 0
        self.read_scripts: list[list] = []  # per Read: responses, then optionally a status
        self.read_requests: list[pb.ReadRequest] = []
        self.seek_epoch = 0
        self.deliver_scripts: list[list] = []  # per Deliver: responses, statuses, HOLD
        self.deliver_requests: list[pb.DeliverRequest] = []
        self.ack_requests: list[pb.AcknowledgeRequest] = []
        self.ack_gate = threading.Event()  # Acknowledge answers once it is set
        self.ack_gate.set()
        self.ack_statuses: list = []  # statuses the next Acknowledges fail with
        self.subscribe_scripts: list[list] = []
        self.subscribe_requests: list[pb.SubscribeRequest] = []
        self.subscribe_open = False  # a Subscribe call is being served
        self.acks_while_subscribed: list[bool] = []  # per Acknowledge: was a Subscribe open
        self.lease_pages: list[pb.ListLeasesResponse] = []  # ListLeases answers, in order
        self.list_requests: list[pb.ListLeasesRequest] = []

    def Acquire(self, request, context):
        self.acquires += 1
        answer = self.acquire_answers.pop(0) if len(self.acquire_answers) > 1 else self.acquire_answers[0]
        if isinstance(answer, pb.AcquireResponse):
            return answer
        context.abort_with_status(answer)

    def Read(self, request, context):
        self.read_requests.append(request)
        for item in self.read_scripts.pop(0):
            if isinstance(item, pb.ReadResponse):
                yield item
            else:
                context.abort_with_status(item)

    def ListLeases(self, request, context):
        self.list_requests.append(request)
        return self.lease_pages.pop(0)

    def Seek(self, request, context):
        self.seek_epoch += 1
        return pb.SeekResponse(offset=request.offset, seek_epoch=self.seek_epoch)

    def _play(self, script, context):
        """Yields a script's responses; a status in it ends the call; ``HOLD`` keeps it open
        until the client cancels."""
        for item in script:
            if item is HOLD:
                while context.is_active():
                    time.sleep(0.02)
                return
            if isinstance(item, grpc.Status):
                context.abort_with_status(item)
            yield item

    def Deliver(self, request, context):
        self.deliver_requests.append(request)
        yield from self._play(self.deliver_scripts.pop(0), context)

    def Acknowledge(self, request, context):
        self.ack_requests.append(request)
        self.acks_while_subscribed.append(self.subscribe_open)
        self.ack_gate.wait(10)
        if self.ack_statuses:
            context.abort_with_status(self.ack_statuses.pop(0))
        return pb.AcknowledgeResponse(outcomes=[self.outcome(a.offset) for a in request.acknowledgements])

    @staticmethod
    def outcome(offset: int) -> int:
        """The fake's rule: offset 3 was never delivered, other odd offsets are STALE, even
        ones APPLIED."""
        if offset == 3:
            return pb.ACK_OUTCOME_NOT_DELIVERED
        return pb.ACK_OUTCOME_STALE if offset % 2 else pb.ACK_OUTCOME_APPLIED

    def Subscribe(self, request, context):
        self.subscribe_requests.append(request)
        self.subscribe_open = True
        try:
            yield from self._play(self.subscribe_scripts.pop(0), context)
        finally:
            self.subscribe_open = False


@pytest.fixture
def fake():
    gateway = FakeGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_PartitionLeaseServiceServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with Client(f"127.0.0.1:{port}", timeout=10) as client:
        yield gateway, client
    server.stop(0)


BIG = pb.AcquireResponse(
    lease_id="ref.secret", topic="t", partition=3, fencing_token=2**64 - 1, offset=2**62 + 1,
    high_watermark=2**63 - 1, group="g",
)


def test_acquire_waits_the_retry_delay_of_unavailable(fake) -> None:
    gateway, client = fake
    outage = rich_status(code_pb2.UNAVAILABLE, "Kafka is unavailable", "KAFKA_UNAVAILABLE", {"operation": "x"}, 0.2)
    gateway.acquire_answers = [outage, outage, BIG]
    started = time.monotonic()
    lease = client.acquire("g", "t", partition=3)
    assert gateway.acquires == 3 and time.monotonic() - started >= 0.4
    # int64/uint64 survive whole.
    assert (lease.fencing_token, lease.offset, lease.high_watermark) == (2**64 - 1, 2**62 + 1, 2**63 - 1)


def test_acquire_retries_are_bounded(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [rich_status(code_pb2.UNAVAILABLE, "consul down", "CONSUL_UNAVAILABLE", retry=0.01)]
    with pytest.raises(UnavailableError) as info:
        client.acquire("g", "t", retry_attempts=3)
    assert gateway.acquires == 3
    assert info.value.reason == "CONSUL_UNAVAILABLE" and info.value.retry_delay == pytest.approx(0.01)
    assert info.value.is_retryable


def test_unavailable_without_retry_advice_is_not_retried(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [
        rich_status(code_pb2.UNAVAILABLE, "lease ended with its gateway", "SHUTTING_DOWN", {"lease_ref": "r1"})
    ]
    with pytest.raises(UnavailableError) as info:
        client.acquire("g", "t")
    assert gateway.acquires == 1
    assert not info.value.is_retryable and info.value.is_lease_ended


def test_error_info_of_another_domain_is_ignored(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [rich_status(code_pb2.FAILED_PRECONDITION, "proxy", "LEASE_LOST", domain="some-proxy")]
    with pytest.raises(KafkaLeaseError) as info:
        client.acquire("g", "t")
    assert info.value.reason is None and info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not info.value.is_lease_ended


def batch(epoch: int, *offsets: int) -> pb.ReadResponse:
    return pb.ReadResponse(records=[pb.KafkaRecord(offset=o) for o in offsets], high_watermark=100, seek_epoch=epoch)


def test_read_reopens_after_the_last_record_handed_out(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.read_scripts = [
        [batch(0, 5, 6), batch(0, 7), rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, message="reset"))],  # no details
        [batch(1, 8), batch(1, 9)],  # then OK: the stream ends
    ]
    lease = client.acquire("g", "t")
    with lease.records() as stream:
        assert [r.offset for r in stream] == [5, 6, 7, 8, 9]
        assert stream.reconnects == 1
    assert not gateway.read_requests[0].HasField("from_offset")
    assert not gateway.read_requests[0].HasField("if_seek_epoch")
    assert gateway.read_requests[1].from_offset == 8
    # Only while the lease is still at the epoch of the last record handed out.
    assert gateway.read_requests[1].HasField("if_seek_epoch") and gateway.read_requests[1].if_seek_epoch == 0


def test_read_reopens_at_the_resume_point_after_a_seek(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    reset = rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, message="reset"))
    gateway.read_scripts = [[batch(0, 5, 6), reset], [batch(1, 20), reset], []]
    lease = client.acquire("g", "t")
    with lease.records() as stream:
        assert stream.next_record(timeout=10).offset == 5
        assert lease.seek(20).seek_epoch == 1
        assert [r.offset for r in stream] == [20]  # 6 was stale
    first, second = gateway.read_requests[1:]
    # After the seek: neither, so the Read starts where the seek put the lease.
    assert not first.HasField("from_offset") and not first.HasField("if_seek_epoch")
    assert second.from_offset == 21 and second.HasField("if_seek_epoch") and second.if_seek_epoch == 1


def test_superseded_read_is_not_reopened(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.read_scripts = [[batch(0, 1), rich_status(code_pb2.ABORTED, "superseded", "SUPERSEDED", {"lease_ref": "r"})]]
    lease = client.acquire("g", "t")
    with lease.records() as stream:
        assert stream.next_record(timeout=10).offset == 1
        with pytest.raises(SupersededError):
            stream.next_record(timeout=10)
        assert stream.next_record(timeout=10) is None
    assert len(gateway.read_requests) == 1


class FakeCall:
    """A Read call that yields scripted responses, released one at a time."""

    def __init__(self, responses: list[pb.ReadResponse]) -> None:
        self.responses = responses
        self.cancelled = threading.Event()

    def __iter__(self):
        yield from self.responses
        self.cancelled.wait(10)

    def cancel(self) -> None:
        self.cancelled.set()


def test_stale_epochs_are_dropped_when_handed_out() -> None:
    epochs = EpochFilter()
    call = FakeCall([batch(0, 0, 1), batch(0, 2, 3), batch(1, 50), batch(0, 4), batch(1, 51)])
    stream = RecordStream(lambda _offset, _epoch: call, epochs, None, 0)
    assert [r.offset for r in stream.next_batch(timeout=5).records] == [0, 1]
    assert stream.next_record(timeout=5).offset == 2
    epochs.observe(1)  # a Seek returned epoch 1: the rest of epoch 0 is stale
    assert [stream.next_record(timeout=5).offset for _ in range(2)] == [50, 51]
    with pytest.raises(TimeoutError):
        stream.next_record(timeout=0.2)
    stream.close()
    assert stream.next_record(timeout=1) is None


def test_close_from_another_thread_ends_a_waiting_read() -> None:
    call = FakeCall([])
    stream = RecordStream(lambda _offset, _epoch: call, EpochFilter(), None, 0)
    threading.Timer(0.2, stream.close).start()
    started = time.monotonic()
    assert stream.next_record(timeout=5) is None
    assert time.monotonic() - started < 2 and call.cancelled.is_set()


# Queue mode.

RESET = rpc_status.to_status(status_pb2.Status(code=code_pb2.UNAVAILABLE, message="reset"))  # a broken connection


def deliveries(*offsets: int, attempt: int = 1) -> pb.DeliverResponse:
    return pb.DeliverResponse(
        deliveries=[pb.Delivery(record=pb.KafkaRecord(offset=o, value=b"v%d" % o), attempt=attempt) for o in offsets],
        high_watermark=100,
    )


def test_answers_made_while_one_is_sent_go_together_in_the_next(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.deliver_scripts = [[deliveries(0, 1, 2, 3), HOLD]]
    lease = client.acquire("g", "t")
    with lease.deliveries(QueueOptions(ordering="unordered", max_in_flight=4, ack_deadline=5)) as stream:
        got = [stream.next_delivery(timeout=5) for _ in range(4)]
        assert [d.offset for d in got] == [0, 1, 2, 3] and got[0].record.value == b"v0"
        gateway.ack_gate.clear()  # the first Acknowledge waits
        first = got[0].answer(AckType.ACCEPT)
        wait_for(lambda: len(gateway.ack_requests) == 1)
        rest = [got[1].answer(AckType.RETRY, delay=2.5, reason="r" * 2000), got[2].answer(AckType.REJECT, reason="bad"), got[3].answer(AckType.RENEW)]
        time.sleep(0.2)
        assert len(gateway.ack_requests) == 1, "one Acknowledge at a time"
        gateway.ack_gate.set()
        assert first.result(5) == AckOutcome.APPLIED
        # Even offsets are APPLIED, odd ones STALE, 3 NOT_DELIVERED (the fake's rule): not
        # reported as stale.
        assert [f.result(5) for f in rest] == [AckOutcome.STALE, AckOutcome.APPLIED, AckOutcome.NOT_DELIVERED]
    assert len(gateway.ack_requests) == 2
    second = gateway.ack_requests[1]
    assert second.lease_id == "ref.secret"
    assert [(a.offset, a.type, a.attempt) for a in second.acknowledgements] == [
        (1, pb.ACK_TYPE_RETRY, 1), (2, pb.ACK_TYPE_REJECT, 1), (3, pb.ACK_TYPE_RENEW, 1)
    ]
    retry = second.acknowledgements[0]
    assert retry.retry_delay.seconds == 2 and retry.retry_delay.nanos == 500_000_000
    assert retry.reason == "r" * 1024, "a reason is cut to the gateway's 1024 bytes"
    request = gateway.deliver_requests[0]
    assert (request.ordering, request.max_in_flight, request.ack_deadline.seconds) == (pb.DELIVERY_ORDER_UNORDERED, 4, 5)


def test_an_acknowledge_error_reaches_every_answer_of_its_batch(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.deliver_scripts = [[deliveries(0), HOLD]]
    lease = client.acquire("g", "t")
    with lease.deliveries() as stream:
        delivery = stream.next_delivery(timeout=5)
    gateway.ack_statuses = [rich_status(code_pb2.FAILED_PRECONDITION, "released", "LEASE_RELEASED", {"lease_ref": "r"})] * 3
    gateway.ack_gate.clear()
    answers = [delivery.answer(kind) for kind in (AckType.RENEW, AckType.ACCEPT, AckType.RETRY)]
    wait_for(lambda: len(gateway.ack_requests) == 1)
    gateway.ack_gate.set()
    for answer in answers:
        with pytest.raises(LeaseEndedError) as info:
            answer.result(5)
        assert info.value.reason == "LEASE_RELEASED"
    assert len(gateway.ack_requests) == 2, "not sent again: the lease has ended"
    with pytest.raises(LeaseEndedError):
        delivery.accept()


def test_an_acknowledge_is_sent_again_after_a_broken_connection(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.deliver_scripts = [[deliveries(0), HOLD]]
    lease = client.acquire("g", "t")
    with lease.deliveries() as stream:
        delivery = stream.next_delivery(timeout=5)
        gateway.ack_statuses = [RESET, RESET]
        assert delivery.accept() == AckOutcome.APPLIED
    assert len(gateway.ack_requests) == 3


def test_a_broken_deliver_is_reopened_with_the_same_settings(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.deliver_scripts = [[deliveries(0, 1), RESET], [RESET], [deliveries(1, 2, attempt=2)]]  # then OK: released
    lease = client.acquire("g", "t")
    options = QueueOptions(ordering="key", max_deliveries=3, dead_letter_topic="dlq")
    with lease.deliveries(options) as stream:
        assert [(d.offset, d.attempt) for d in stream] == [(0, 1), (1, 1), (1, 2), (2, 2)]
        assert stream.reconnects == 2
    assert len(gateway.deliver_requests) == 3
    assert all(r == gateway.deliver_requests[0] for r in gateway.deliver_requests)
    assert gateway.deliver_requests[0].ordering == pb.DELIVERY_ORDER_KEY


def test_the_first_deliver_fails_at_once_and_others_are_not_reopened(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    wrong = rich_status(code_pb2.FAILED_PRECONDITION, "wrong mode", "WRONG_MODE", {"lease_ref": "r", "mode": "read"})
    gateway.deliver_scripts = [[wrong], [deliveries(0), wrong]]
    lease = client.acquire("g", "t")
    with pytest.raises(WrongModeError) as info:
        lease.deliveries()
    assert info.value.metadata["mode"] == "read" and not info.value.is_retryable
    with lease.deliveries() as stream:
        assert stream.next_delivery(timeout=5).offset == 0
        with pytest.raises(WrongModeError):
            stream.next_delivery(timeout=5)
        assert stream.next_delivery(timeout=5) is None
    assert len(gateway.deliver_requests) == 2


def test_consume_answers_by_the_handler_and_the_error_policy(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.deliver_scripts = [[deliveries(0, 1, 2, 3), deliveries(4, 5, attempt=3)]]  # then OK: released
    lease = client.acquire("g", "t")

    def handler(delivery: Delivery) -> None:
        offset = delivery.offset
        if offset == 1:
            raise Reject("cannot parse")
        if offset == 2:
            raise Retry("later", delay=7)
        if offset == 3:
            raise KeyError("k")
        if offset >= 4:
            raise RuntimeError("boom")

    def policy(error: BaseException, delivery: Delivery) -> Retry | Reject:
        return Reject("policy: " + type(error).__name__) if isinstance(error, KeyError) else Retry(str(error))

    stats = lease.consume(handler, concurrency=2, error_policy=policy, backoff=(0.5, 1.5))
    assert stats == ConsumeStats(accepted=1, retried=3, rejected=2)
    # concurrency 2 and no max_in_flight: 2 in flight.
    assert gateway.deliver_requests[0].max_in_flight == 2
    answers = {a.offset: a for r in gateway.ack_requests for a in r.acknowledgements}
    assert answers[0].type == pb.ACK_TYPE_ACCEPT
    assert (answers[1].type, answers[1].reason) == (pb.ACK_TYPE_REJECT, "cannot parse")
    assert (answers[2].type, answers[2].reason, answers[2].retry_delay.seconds) == (pb.ACK_TYPE_RETRY, "later", 7)
    assert (answers[3].type, answers[3].reason) == (pb.ACK_TYPE_REJECT, "policy: KeyError")
    # No delay given: the backoff for attempt 3, 0.5 s doubled twice, at most 1.5 s.
    assert answers[4].type == pb.ACK_TYPE_RETRY and answers[4].attempt == 3
    assert (answers[4].retry_delay.seconds, answers[4].retry_delay.nanos) == (1, 500_000_000)


def test_consume_hands_back_what_outlasts_the_drain(fake) -> None:
    gateway, client = fake
    gateway.acquire_answers = [BIG]
    gateway.deliver_scripts = [[deliveries(0, 1, 2, 3), HOLD]]
    lease = client.acquire("g", "t")
    gate, stop = threading.Event(), threading.Event()
    started: list[int] = []

    def handler(delivery: Delivery) -> None:
        started.append(delivery.offset)
        if delivery.offset != 0:
            gate.wait(10)

    def stop_soon() -> None:
        wait_for(lambda: len(started) == 3 and len(gateway.ack_requests) == 1)
        stop.set()

    threading.Thread(target=stop_soon, daemon=True).start()
    stats = lease.consume(handler, QueueOptions(max_in_flight=4), concurrency=2, stop=stop, drain=0.3)
    # 0 was accepted; 1 and 2 were running, 3 received and never started: handed back.
    assert stats == ConsumeStats(accepted=1, handed_back=3)
    assert sorted(started) == [0, 1, 2]
    gate.set()
    time.sleep(0.2)  # the late handlers return: they are not answered
    answers = [a for r in gateway.ack_requests for a in r.acknowledgements]
    assert [(a.offset, a.type) for a in answers[:1]] == [(0, pb.ACK_TYPE_ACCEPT)]
    back = sorted(answers[1:], key=lambda a: a.offset)
    assert [(a.offset, a.type, a.reason) for a in back] == [(o, pb.ACK_TYPE_RETRY, SHUT_DOWN_REASON) for o in (1, 2, 3)]
    assert all(a.retry_delay.seconds == 0 and a.retry_delay.nanos == 0 for a in back)


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# Resubscribing.

JOINED = pb.SubscribeResponse(joined=pb.Joined(member_id="made-up", gateway="gw"))


def assigned(offset: int) -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        assigned=pb.Assigned(lease_id="L", topic="t", partition=0, fencing_token=7, offset=offset, high_watermark=9)
    )


def records(*offsets: int) -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        records=pb.SubscribedRecords(
            lease_id="L", topic="t", partition=0, high_watermark=9, records=[pb.KafkaRecord(offset=o) for o in offsets]
        )
    )


def offsets_of(sub, n: int) -> list:
    out = []
    for _ in range(n):
        event = sub.next_event(timeout=5)
        out.append(("assigned", event.offset) if isinstance(event, Assigned) else [r.offset for r in event.batch.records])
    return out


def test_a_broken_subscription_resubscribes_with_its_member_id(fake) -> None:
    gateway, client = fake
    member_active = rich_status(code_pb2.ALREADY_EXISTS, "active", "MEMBER_ACTIVE", {"member_id": "made-up"})
    gateway.subscribe_scripts = [
        [JOINED, assigned(0), records(0, 1), RESET],
        [RESET],  # the connection is not back yet
        [member_active],  # the gateway has not seen the old stream end yet
        [JOINED, assigned(2), records(2), HOLD],
    ]
    with client.subscribe("g", ["t"], session_grace=10, max_records=5) as sub:
        assert sub.member_id == "made-up"
        first = sub.next_event(timeout=5)
        assert isinstance(first, Assigned) and first.offset == 0
        assert offsets_of(sub, 1) == [[0, 1]]
        again = sub.next_event(timeout=5)  # after the break: no error, the events go on
        assert isinstance(again, Assigned) and again.offset == 2
        assert again.partition is first.partition, "the same Partition all along"
        assert offsets_of(sub, 1) == [[2]]
        assert sub.resubscribes == 1
    requests = gateway.subscribe_requests
    assert len(requests) == 4 and requests[0].member_id == ""
    for request in requests[1:]:
        assert request.member_id == "made-up"
        assert (list(request.topics), request.max_records, request.session_grace.seconds) == (["t"], 5, 10)


@pytest.mark.parametrize(
    "status",
    [
        rich_status(code_pb2.PERMISSION_DENIED, "denied", "ACTION_DENIED", {"action": "subscribe"}),
        rich_status(code_pb2.INVALID_ARGUMENT, "bad", "INVALID_FIELD", {"field": "topics"}),
    ],
)
def test_errors_not_about_the_connection_end_the_subscription(fake, status) -> None:
    gateway, client = fake
    gateway.subscribe_scripts = [[JOINED, records(0), RESET], [status]]
    with client.subscribe("g", ["t"], member_id="m", session_grace=10) as sub:
        assert offsets_of(sub, 1) == [[0]]
        with pytest.raises(KafkaLeaseError) as info:
            sub.next_event(timeout=5)
        assert info.value.code != grpc.StatusCode.UNAVAILABLE
        assert sub.next_event(timeout=5) is None
    assert len(gateway.subscribe_requests) == 2


def test_no_resubscribe_without_a_session_grace(fake) -> None:
    gateway, client = fake
    gateway.subscribe_scripts = [[JOINED, records(0), RESET], [JOINED, HOLD]]
    with client.subscribe("g", ["t"], member_id="m") as sub:
        assert offsets_of(sub, 1) == [[0]]
        with pytest.raises(UnavailableError):
            sub.next_event(timeout=5)
    assert len(gateway.subscribe_requests) == 1


def test_resubscribing_stops_when_the_grace_runs_out(fake) -> None:
    gateway, client = fake
    gateway.subscribe_scripts = [[JOINED, RESET]] + [[RESET]] * 20
    with client.subscribe("g", ["t"], member_id="m", session_grace=1) as sub:
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            sub.next_event(timeout=10)
        assert time.monotonic() - started < 1.5
        # 0.1 + 0.2 + 0.4 s of waits fit in the grace; the next (0.8 s) would not.
        assert len(gateway.subscribe_requests) == 4


# Queue mode over a subscription.


def subscribed_deliveries(lease_id: str, partition: int, *offsets: int) -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        deliveries=pb.SubscribedDeliveries(
            lease_id=lease_id,
            topic="t",
            partition=partition,
            high_watermark=9,
            deliveries=[pb.Delivery(record=pb.KafkaRecord(offset=o), attempt=1) for o in offsets],
        )
    )


def test_subscription_consume_answers_per_lease_and_leaves_only_after_the_drain(fake) -> None:
    gateway, client = fake
    gateway.subscribe_scripts = [[JOINED, subscribed_deliveries("A", 0, 0, 1), subscribed_deliveries("B", 1, 0), HOLD]]
    stop = threading.Event()
    seen: list = []
    told: list = []

    def handler(delivery) -> None:
        seen.append((delivery.topic, delivery.partition, delivery.offset))
        if len(seen) == 3:
            stop.set()
        time.sleep(1.0 if delivery.partition == 1 else 0.2)  # B's outlasts the drain

    sub = client.subscribe("g", ["t"], queue=QueueOptions(ordering="key", max_in_flight=3, dead_letter_topic="dlq"))
    stats = sub.consume(
        handler, concurrency=3, stop=stop, drain=0.5, on_answer=lambda d, k, o: told.append((d.partition, d.offset, k, o))
    )
    assert gateway.subscribe_requests[0].queue == pb.QueueSettings(
        ordering=pb.DELIVERY_ORDER_KEY, max_in_flight=3, dead_letter_topic="dlq"
    )
    assert sorted(seen) == [("t", 0, 0), ("t", 0, 1), ("t", 1, 0)]
    assert stats == ConsumeStats(accepted=2, retried=0, rejected=0, handed_back=1)
    # Each lease's answers in its own Acknowledges, all while the member was still subscribed.
    answers = sorted((r.lease_id, a.offset, a.type) for r in gateway.ack_requests for a in r.acknowledgements)
    assert answers == [("A", 0, pb.ACK_TYPE_ACCEPT), ("A", 1, pb.ACK_TYPE_ACCEPT), ("B", 0, pb.ACK_TYPE_RETRY)]
    assert gateway.acks_while_subscribed and all(gateway.acks_while_subscribed)
    assert sorted(told) == [
        (0, 0, AckType.ACCEPT, AckOutcome.APPLIED),
        (0, 1, AckType.ACCEPT, AckOutcome.STALE),  # the fake answers odd offsets STALE
        (1, 0, AckType.RETRY, AckOutcome.APPLIED),
    ]
    wait_for(lambda: not gateway.subscribe_open)  # then the subscription was closed: the member left
    assert sub.next_event(timeout=1) is None


def test_subscription_consume_renews_what_still_runs_while_draining(fake) -> None:
    gateway, client = fake
    gateway.subscribe_scripts = [[JOINED, subscribed_deliveries("A", 0, 0, 2), HOLD]]
    stop = threading.Event()
    started: list[int] = []

    def handler(delivery) -> None:
        started.append(delivery.offset)
        if len(started) == 2:
            stop.set()
        if delivery.offset == 2:
            time.sleep(1.0)  # a third of the 1 s ack deadline: renewed about 3 times meanwhile

    sub = client.subscribe("g", ["t"], queue=QueueOptions(ordering="unordered", max_in_flight=2, ack_deadline=1))
    stats = sub.consume(handler, concurrency=2, stop=stop, drain=5)
    assert stats == ConsumeStats(accepted=2)
    answers = [(a.offset, a.type) for r in gateway.ack_requests for a in r.acknowledgements]
    renewals = [offset for offset, kind in answers if kind == pb.ACK_TYPE_RENEW]
    # Only the running handler's delivery, not the one answered at once; its accept last.
    assert renewals and set(renewals) == {2} and 2 <= len(renewals) <= 4, answers
    assert answers[-1] == (2, pb.ACK_TYPE_ACCEPT) and (0, pb.ACK_TYPE_ACCEPT) in answers


def test_subscription_consume_needs_queue_mode(fake) -> None:
    gateway, client = fake
    gateway.subscribe_scripts = [[JOINED, HOLD]]
    with client.subscribe("g", ["t"]) as sub:
        with pytest.raises(ValueError):
            sub.consume(lambda d: None)


def test_list_leases_returns_the_clients_own_types_over_every_page(fake) -> None:
    gateway, client = fake
    acquired = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=250_000_000)
    expires = timestamp_pb2.Timestamp(seconds=1_700_000_010)
    queued = pb.LeaseInfo(
        group="g", topic="t", partition=0, member="worker-1", fencing_token=2**64 - 1, acquired_at=acquired,
        expires_at=expires, gateway="gw-a", gateway_address="127.0.0.1:50051", position=40, committed_offset=38,
        high_watermark=2**63 - 1, lag=2, read_lag=0, member_id="m-1",
        queue=pb.QueueInfo(
            ordering=pb.DELIVERY_ORDER_KEY, in_flight=3, oldest_in_flight=duration_pb2.Duration(seconds=1, nanos=500_000_000),
            waiting=7, deliveries=50, redeliveries=4, dead_letters=1, dead_letter_topic="dlq.g.t",
            progress_age=duration_pb2.Duration(seconds=2, nanos=250_000_000), done_not_committed=9,
        ),
    )
    # Not live: the serving instance did not answer; no committed offset, no queue.
    unavailable = pb.LeaseInfo(group="g", topic="t", partition=1, acquired_at=acquired, gateway="gw-b",
                               details_unavailable="gw-b did not answer in time")
    gateway.lease_pages = [
        pb.ListLeasesResponse(leases=[queued], next_page_token="page-2"),
        pb.ListLeasesResponse(leases=[unavailable]),
    ]
    leases = client.list_leases(group="g", page_size=1)
    assert [(r.group, r.page_size, r.page_token) for r in gateway.list_requests] == [("g", 1, ""), ("g", 1, "page-2")]
    assert all(isinstance(lease, LeaseInfo) for lease in leases)
    utc = dt.timezone.utc
    assert leases[0] == LeaseInfo(
        group="g", topic="t", partition=0, member="worker-1", member_id="m-1", fencing_token=2**64 - 1,
        acquired_at=dt.datetime(2023, 11, 14, 22, 13, 20, 250_000, tzinfo=utc),
        expires_at=dt.datetime(2023, 11, 14, 22, 13, 30, tzinfo=utc), gateway="gw-a", gateway_address="127.0.0.1:50051",
        position=40, committed_offset=38, high_watermark=2**63 - 1, lag=2, read_lag=0, details_unavailable="",
        queue=QueueInfo(ordering=Ordering.KEY, in_flight=3, oldest_in_flight=1.5, waiting=7, deliveries=50,
                        redeliveries=4, dead_letters=1, dead_letter_topic="dlq.g.t", progress_age=2.25,
                        done_not_committed=9),
    )
    second = leases[1]
    assert (second.partition, second.gateway, second.details_unavailable) == (1, "gw-b", "gw-b did not answer in time")
    # Unset stays None, distinct from 0.
    assert (second.expires_at, second.position, second.committed_offset, second.high_watermark, second.lag,
            second.read_lag, second.queue) == (None,) * 7
    assert QueueInfo.from_proto(pb.QueueInfo()).ordering == Ordering.PARTITION  # unset: the default
    assert QueueInfo.from_proto(pb.QueueInfo()).progress_age is None  # an older gateway's
