"""Queue mode against a real gateway (KAFKA_LEASE_ADDR) and the fixture's queue topic
(KAFKA_LEASE_FIXTURE): partition 0 holds 40 records, key ``k<i % 4>``, value ``v<i>``, the one at
offset 13 ``poison``."""

from __future__ import annotations

import time

import pytest

from kafka_lease import AckOutcome, Client, LeaseEndedError, NotFoundError, QueueOptions, WrongModeError
from kafka_lease.v1 import partition_lease_pb2 as pb

from conftest import Fixture, QueueFixture

DEADLINE = 20.0  # seconds any single wait for a delivery may take


@pytest.fixture
def queue(fixture: Fixture) -> QueueFixture:
    if fixture.queue is None:
        pytest.skip("the fixture has no queue topic")
    return fixture.queue


def queue_info(client: Client, group: str) -> pb.QueueInfo | None:
    leases = client.list_leases(group=group)
    if len(leases) != 1 or not leases[0].HasField("queue"):
        return None
    return leases[0].queue


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
