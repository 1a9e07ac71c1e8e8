"""Queue mode against a real gateway (KAFKA_LEASE_ADDR) and the fixture's queue topic
(KAFKA_LEASE_FIXTURE): partition 0 holds 40 records, key ``k<i % 4>``, value ``v<i>``, the one at
offset 13 ``poison``."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

from kafka_lease import (
    SHUT_DOWN_REASON,
    AckOutcome,
    AckType,
    BusyError,
    Client,
    ConsumeStats,
    Delivery,
    LeaseEndedError,
    LeaseInfo,
    NotFoundError,
    Ordering,
    QueueInfo,
    QueueOptions,
    Record,
    Reject,
    WrongModeError,
)
from kafka_lease.v1 import partition_lease_pb2 as pb

from conftest import Fixture, QueueFixture, wait_until

DEADLINE = 20.0  # seconds any single wait for a delivery may take


@pytest.fixture
def queue(fixture: Fixture) -> QueueFixture:
    if fixture.queue is None:
        pytest.skip("the fixture has no queue topic")
    return fixture.queue


class Background:
    """``lease.consume(...)`` on a thread of its own, stopped by :attr:`stop`."""

    def __init__(self, consume: Callable[..., ConsumeStats], *args: Any, **kwargs: Any) -> None:
        self.stop = threading.Event()
        self.stats: ConsumeStats | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(consume, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, consume: Callable[..., ConsumeStats], args: tuple, kwargs: dict) -> None:
        try:
            self.stats = consume(*args, stop=self.stop, **kwargs)
        except BaseException as error:  # noqa: BLE001 - the test raises it
            self.error = error

    def finish(self, timeout: float = 30.0) -> ConsumeStats:
        self.stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "consume did not return after stop"
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats


def queue_info(client: Client, group: str) -> QueueInfo | None:
    leases = client.list_leases(group=group)
    if len(leases) != 1:
        return None
    return leases[0].queue


def dead_letters_of(client: Client, fixture: Fixture, topic: str, group: str) -> list[Record]:
    """The records of ``topic`` (every partition, read by a fresh group) that ``group`` wrote
    there as dead letters (header ``kafka-lease.group``)."""
    with pytest.raises(NotFoundError) as info:
        client.acquire(fixture.fresh_group(), topic, partition=1_000_000)
    found = []
    for partition in range(int(info.value.metadata["partition_count"])):
        with client.acquire(fixture.fresh_group() + "-dlq", topic, partition=partition) as lease:
            if lease.offset >= lease.high_watermark:
                continue
            with lease.records() as stream:
                while (record := stream.next_record(timeout=DEADLINE)) is not None:
                    header = record.header("kafka-lease.group")
                    if header is not None and header.value == group.encode():
                        found.append(record)
                    if record.offset + 1 >= lease.high_watermark:
                        break
    return found


def test_poison_record_goes_to_the_dead_letters_holding_back_its_key_only(
    client: Client, fixture: Fixture, queue: QueueFixture
) -> None:
    group = fixture.fresh_group() + "-poison"
    lease = client.acquire(group, queue.topic, partition=0, ttl=30)
    assert lease.offset == 0
    lock = threading.Lock()
    calls: list[tuple[int, int, bytes | None, bytes | None]] = []  # (offset, attempt, key, value), in call order

    def handler(delivery: Delivery) -> None:
        record = delivery.record
        with lock:
            calls.append((record.offset, delivery.attempt, record.key, record.value))
        if record.value == b"poison":
            raise ValueError("cannot handle poison")

    options = QueueOptions(ordering="key", max_deliveries=3, dead_letter_topic=queue.dead_letter_topic)
    run = Background(lease.consume, handler, options, concurrency=4, backoff=(0.05, 0.2))

    def handled() -> set[int] | None:
        with lock:
            done = {o for o, _, _, v in calls if v != b"poison"}
        return done if len(done) == queue.records - 1 else None

    wait_until("the 39 good records to be handled", handled, timeout=60)
    info = wait_until("the poison record's dead letter", lambda: (q := queue_info(client, group)) and q.dead_letters == 1 and q)
    assert info.ordering == Ordering.KEY and info.dead_letter_topic == queue.dead_letter_topic
    stats = run.finish()
    assert stats == ConsumeStats(accepted=queue.records - 1, retried=3, rejected=0, handed_back=0)

    # Every record as produced; each good one handled once, the poison one 3 times.
    for offset, _, key, value in calls:
        assert (key, value) == (queue.key(offset), queue.value(offset)), f"record at {offset}"
    poison = queue.poison_offset
    assert [a for o, a, _, _ in calls if o == poison] == [1, 2, 3]
    assert sorted(o for o, _, _, _ in calls if o != poison) == [o for o in range(queue.records) if o != poison]
    # Its key-mates after it waited for its last attempt; before it, they came in order; the
    # other keys did not wait for it.
    last_poison = max(i for i, (o, _, _, _) in enumerate(calls) if o == poison)
    first_poison = min(i for i, (o, _, _, _) in enumerate(calls) if o == poison)
    position = {o: i for i, (o, _, _, _) in enumerate(calls) if o != poison}
    mates_after = range(poison + queue.keys, queue.records, queue.keys)
    assert list(mates_after) == [17, 21, 25, 29, 33, 37]
    for offset in mates_after:
        assert position[offset] > last_poison, f"offset {offset} (key k1) handled before the poison's last attempt"
    for offset in range(poison % queue.keys, poison, queue.keys):
        assert position[offset] < first_poison
    assert any(position[o] < last_poison for o in range(poison + 1, queue.records) if o % queue.keys != poison % queue.keys)

    # The dead letter: the record as produced, with where it came from and why.
    [letter] = dead_letters_of(client, fixture, queue.dead_letter_topic, group)
    assert (letter.key, letter.value) == (b"k1", b"poison")
    headers = {h.key: h.value for h in letter.headers}
    assert headers["kafka-lease.topic"] == queue.topic.encode()
    assert headers["kafka-lease.offset"] == str(poison).encode() and headers["kafka-lease.attempts"] == b"3"
    assert headers["kafka-lease.reason"] == b"ValueError: cannot handle poison"

    # Release commits the queue's progress: the next holder starts after the last record.
    assert lease.release() is None
    with client.acquire(group, queue.topic, partition=0) as again:
        assert again.offset == queue.records


def test_shutdown_hands_back_the_records_still_running(client: Client, fixture: Fixture, queue: QueueFixture) -> None:
    group = fixture.fresh_group() + "-handback"
    options = QueueOptions(ordering="unordered", dead_letter_topic=queue.dead_letter_topic)
    with client.acquire(group, queue.topic, partition=0, ttl=30) as lease:
        lock = threading.Lock()
        gate = threading.Event()
        started: list[tuple[int, int]] = []

        def blocking(delivery: Delivery) -> None:
            with lock:
                started.append((delivery.offset, delivery.attempt))
            gate.wait(60)

        run = Background(lease.consume, blocking, options, concurrency=3, drain=0.5)
        wait_until("3 handlers to be running", lambda: len(started) == 3)
        info = wait_until("3 deliveries in flight", lambda: (q := queue_info(client, group)) and q.in_flight == 3 and q)
        assert info.ordering == Ordering.UNORDERED
        stats = run.finish()
        assert stats == ConsumeStats(handed_back=3)
        assert len(started) == 3 and all(attempt == 1 for _, attempt in started)
        gate.set()  # the handlers return now: too late, their records went back unanswered

        # A second consume (same settings) gets them again, as their second delivery.
        back = {offset for offset, _ in started}
        seen: dict[int, list[int]] = {}

        def handler(delivery: Delivery) -> None:
            with lock:
                seen.setdefault(delivery.offset, []).append(delivery.attempt)

        again = Background(lease.consume, handler, options, concurrency=3)
        # Stopped once it handled the whole partition: stopped earlier, the deliveries it had
        # received and not yet started would be handed back too (seen under load).
        wait_until(
            "the handed-back records again, and every other record",
            lambda: back <= seen.keys() and len(seen) == queue.records,
        )
        stats = again.finish()
        for offset in back:
            assert seen[offset][0] == 2, f"offset {offset}: attempts {seen[offset]}"
        assert stats.handed_back == 0 and stats.accepted == sum(map(len, seen.values()))
        assert len(started) == 3, "the first consume started no handler after its stop"


def test_draining_handlers_keep_the_lease_alive_past_its_ttl(client: Client, fixture: Fixture, queue: QueueFixture) -> None:
    """Once stopped, the consumer closes the Deliver; a handler that runs on for 3 TTLs is
    still answered on the same lease: the drain renews its delivery every third of the TTL,
    and those calls keep the lease alive."""
    group = fixture.fresh_group() + "-drain-renews"
    options = QueueOptions(dead_letter_topic=queue.dead_letter_topic)
    shutdown = threading.Event()
    started = threading.Event()
    told: list[tuple[int, AckType, AckOutcome]] = []

    def slow(delivery: Delivery) -> None:
        started.set()
        shutdown.wait(DEADLINE)
        time.sleep(3 * lease.ttl)  # well past the TTL, within the drain

    with client.acquire(group, queue.topic, partition=0, ttl=2) as lease:
        assert lease.ttl == 2.0
        run = Background(
            lease.consume, slow, options, drain=4 * lease.ttl, on_answer=lambda d, k, o: told.append((d.offset, k, o))
        )
        assert started.wait(DEADLINE), "no handler started"
        shutdown.set()
        stats = run.finish()
        assert stats == ConsumeStats(accepted=1)
        assert told == [(0, AckType.ACCEPT, AckOutcome.APPLIED)], "the accept was lost: the lease expired while draining"
        lease.release()  # still held: no LeaseEndedError


def test_an_answer_after_release_fails_with_the_lease_end(client: Client, fixture: Fixture, queue: QueueFixture) -> None:
    group = fixture.fresh_group() + "-after-release"
    lease = client.acquire(group, queue.topic, partition=0, ttl=30)
    with lease.deliveries(QueueOptions(max_in_flight=2, dead_letter_topic=queue.dead_letter_topic)) as deliveries:
        first = deliveries.next_delivery(timeout=DEADLINE)
        assert first is not None and (first.offset, first.attempt) == (0, 1)
        assert (first.record.key, first.record.value) == (b"k0", b"v0") and first.deadline is not None
        assert first.renew() == AckOutcome.APPLIED
        # Queue mode: the gateway commits, so Commit, Seek and a commit at Release are refused.
        with pytest.raises(WrongModeError) as info:
            lease.commit(1)
        assert info.value.reason == "WRONG_MODE" and info.value.metadata["mode"] == "queue"
        assert not info.value.is_lease_ended
        with pytest.raises(WrongModeError):
            lease.seek(0)
        with pytest.raises(WrongModeError):
            lease.release(commit_offset=1)
        assert first.accept() == AckOutcome.APPLIED
        assert first.accept() == AckOutcome.STALE  # done already

        second = deliveries.next_delivery(timeout=DEADLINE)
        assert second is not None and second.offset == 1
        lease.release()
        # A released lease's Deliver ends with OK.
        assert deliveries.next_delivery(timeout=DEADLINE) is None
        with pytest.raises(LeaseEndedError) as ended:
            second.accept()
        assert ended.value.reason == "LEASE_RELEASED" and ended.value.is_lease_ended


def test_queue_mode_errors(client: Client, fixture: Fixture, queue: QueueFixture) -> None:
    group = fixture.fresh_group() + "-queue-errors"
    with client.acquire(group, queue.topic, partition=0) as lease:
        # A dead letter topic that does not exist fails the Deliver at once.
        with pytest.raises(NotFoundError) as info:
            lease.deliveries(QueueOptions(dead_letter_topic=fixture.missing_topic))
        assert info.value.reason == "TOPIC_NOT_FOUND" and info.value.metadata["topic"] == fixture.missing_topic
        # An Acknowledge on a lease no Deliver opened: WRONG_MODE, mode "read".
        ack = pb.Acknowledgement(offset=0, type=pb.ACK_TYPE_ACCEPT)
        with pytest.raises(WrongModeError) as wrong:
            client.call("Acknowledge", pb.AcknowledgeRequest(lease_id=lease.lease_id, acknowledgements=[ack]))
        assert wrong.value.metadata["mode"] == "read"


def test_broken_deliver_is_reopened(fixture: Fixture, queue: QueueFixture, relay) -> None:
    group = fixture.fresh_group() + "-reopen"
    with Client(relay.addr) as client:
        with client.acquire(group, queue.topic, partition=0, ttl=30) as lease:
            options = QueueOptions(ack_deadline=2, dead_letter_topic=queue.dead_letter_topic)
            with lease.deliveries(options) as deliveries:
                got: list[int] = []
                while len(set(got)) < queue.records:
                    delivery = deliveries.next_delivery(timeout=DEADLINE)
                    assert delivery is not None, "the deliveries ended"
                    got.append(delivery.offset)
                    if len(got) == 10:
                        assert relay.cut() > 0
                        time.sleep(0.2)
                    delivery.accept()
                assert sorted(set(got)) == list(range(queue.records))
                # Partition order: offset order, a record at most twice (its answer lost in
                # the cut, it came again after its ack deadline).
                assert got == sorted(got) and max(map(got.count, got)) <= 2
                assert deliveries.reconnects >= 1 and relay.accepted >= 2


def test_subscription_consumer_in_queue_mode(client: Client, fixture: Fixture, queue: QueueFixture) -> None:
    """A member in queue mode handles the queue topic's records through ``Subscription.consume``:
    the poison one rejected to the dead letter topic, the other 39 handled; once the consumer
    stops, the member leaves and the release commits, so a new lease starts at 40."""
    group = fixture.fresh_group() + "-subq"
    lock = threading.Lock()
    handled: dict[int, tuple[str, int]] = {}  # offset of partition 0 -> (topic, partition) the handler saw
    applied: list[tuple[int, int, AckType, AckOutcome]] = []  # (partition, offset, answer, outcome)

    def handler(delivery: Delivery) -> None:
        if delivery.partition == 0 and delivery.record.value == b"poison":
            raise Reject("poison")
        with lock:
            if delivery.partition == 0:
                handled[delivery.offset] = (delivery.topic, delivery.partition)

    def on_answer(delivery: Delivery, kind: AckType, outcome: AckOutcome) -> None:
        with lock:
            applied.append((delivery.partition, delivery.offset, kind, outcome))

    options = QueueOptions(ordering="key", max_in_flight=4, dead_letter_topic=queue.dead_letter_topic)
    subscription = client.subscribe(group, [queue.topic], member="py-subq", queue=options)
    run = Background(subscription.consume, handler, concurrency=4, on_answer=on_answer)

    wait_until("the 39 good records to be handled", lambda: len(handled) == queue.records - 1, timeout=60)
    assert set(handled) == set(range(queue.records)) - {queue.poison_offset}
    assert set(handled.values()) == {(queue.topic, 0)}

    def lease_of_0() -> LeaseInfo | None:
        leases = [l for l in client.list_leases(group=group) if l.partition == 0]
        return leases[0] if leases and leases[0].queue is not None else None

    info = wait_until("the poison record's dead letter", lambda: (l := lease_of_0()) and l.queue.dead_letters == 1 and l)
    assert info.queue.ordering == Ordering.KEY and info.queue.dead_letter_topic == queue.dead_letter_topic
    assert info.member_id == subscription.member_id
    stats = run.finish()
    assert stats.accepted >= queue.records - 1 and stats.rejected == 1 and stats.handed_back == 0
    with lock:
        zero = [(o, k, out) for p, o, k, out in applied if p == 0]
    assert (queue.poison_offset, AckType.REJECT, AckOutcome.APPLIED) in zero
    assert sorted(o for o, k, out in zero if k == AckType.ACCEPT and out == AckOutcome.APPLIED) == sorted(handled)

    # consume closed the subscription: the member left, its leases were released, committing.
    def acquired_at_the_end() -> int | None:
        try:
            with client.acquire(group, queue.topic, partition=0) as lease:
                return lease.offset
        except BusyError:
            return None

    assert wait_until("partition 0 to be free", acquired_at_the_end, timeout=10) == queue.records
    assert not [l for l in client.list_leases(group=group) if l.member_id == subscription.member_id]
