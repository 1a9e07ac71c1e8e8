"""Against a real gateway (KAFKA_LEASE_ADDR) and the fixture topic (KAFKA_LEASE_FIXTURE)."""

from __future__ import annotations

import datetime as dt
import time

import grpc
import pytest

from kafka_lease import (
    Assigned,
    BusyError,
    Client,
    InvalidArgumentError,
    LeaseEndedError,
    NotFoundError,
    OutOfRangeError,
    Record,
    Records,
    RecordStream,
    Revoked,
    UnavailableError,
)
from kafka_lease.v1 import partition_lease_pb2 as pb

from conftest import Fixture, FixtureRecord, wait_until

DEADLINE = 20.0  # seconds any single wait for records may take


def take(stream: RecordStream, n: int) -> list[Record]:
    """The next ``n`` records, each within DEADLINE."""
    out = []
    for _ in range(n):
        record = stream.next_record(timeout=DEADLINE)
        assert record is not None, f"the stream ended after {len(out)} of {n} records"
        out.append(record)
    return out


def assert_same(record: Record, expected: FixtureRecord) -> None:
    assert record.offset == expected.offset
    assert record.key == expected.key, f"key at {expected.offset}"
    assert record.value == expected.value, f"value at {expected.offset}"
    assert [tuple(h) for h in record.headers] == expected.headers, f"headers at {expected.offset}"
    assert record.timestamp_ms == expected.timestamp_ms
    assert record.timestamp == dt.datetime.fromtimestamp(expected.timestamp_ms / 1000, tz=dt.timezone.utc)
    assert record.timestamp_type == pb.TIMESTAMP_TYPE_CREATE_TIME


def test_full_cycle_keeps_every_field(client: Client, fixture: Fixture) -> None:
    expected = fixture.of(0)
    assert len(expected) == 10
    group = fixture.fresh_group()
    lease = client.acquire(group, fixture.topic, partition=0, member="py-fidelity", ttl=30)
    assert (lease.topic, lease.partition, lease.group) == (fixture.topic, 0, group)
    assert lease.offset == 0 and lease.high_watermark == 10
    assert lease.fencing_token > 0 and lease.lease_id
    assert lease.expires_at is not None and lease.expires_at > dt.datetime.now(dt.timezone.utc)
    assert lease.ttl == 30.0
    assert lease.lease_id not in repr(lease)
    with lease.records(max_records=3) as stream:
        records = take(stream, 10)
        for record, want in zip(records, expected):
            assert_same(record, want)
        # The shapes the fixture is about, spelled out.
        assert records[1].key is None and records[2].key == b"" and records[2].value == b""
        assert records[3].value is None and records[4].key == b"\x00\xff\xfe"
        assert records[5].header("null") == ("null", None) and records[5].header("empty") == ("empty", b"")
        assert lease.release(commit_offset=10) == 10
        # A released lease's Read ends with OK.
        assert stream.next_record(timeout=DEADLINE) is None


def test_seek_drops_the_old_epoch(client: Client, fixture: Fixture) -> None:
    expected = fixture.of(0)
    with client.acquire(fixture.fresh_group(), fixture.topic, partition=0, ttl=30) as lease:
        with lease.records(max_records=2) as stream:
            assert [r.offset for r in take(stream, 5)] == [0, 1, 2, 3, 4]
            result = lease.seek(2)
            assert result.offset == 2 and result.seek_epoch >= 1 and lease.seek_epoch == result.seek_epoch
            # Records 5.. of the old epoch may be buffered: none of them is handed out.
            again = take(stream, 8)
            assert [r.offset for r in again] == list(range(2, 10))
            for record in again:
                assert_same(record, expected[record.offset])

            latest = lease.seek("latest")
            assert latest.offset == 10 and latest.seek_epoch > result.seek_epoch
            with pytest.raises(TimeoutError):
                stream.next_record(timeout=1.0)  # nothing after the high watermark

            earliest = lease.seek("earliest")
            assert earliest.offset == 0
            assert [r.offset for r in take(stream, 3)] == [0, 1, 2]

            at = lease.seek(dt.datetime.fromtimestamp(expected[6].timestamp_ms / 1000, tz=dt.timezone.utc))
            assert at.offset == 6
            assert stream.next_record(timeout=DEADLINE).offset == 6

            with pytest.raises(OutOfRangeError) as info:
                lease.seek(99)
            assert info.value.reason == "OFFSET_OUT_OF_RANGE"
            assert (info.value.metadata["low"], info.value.metadata["high"]) == ("0", "10")


def test_commit_release_and_reacquire(client: Client, fixture: Fixture) -> None:
    group = fixture.fresh_group()
    lease = client.acquire(group, fixture.topic, partition=0)
    lease.commit(7, metadata="py-test")
    assert lease.release() is None
    with pytest.raises(LeaseEndedError) as info:
        lease.commit(8)
    assert info.value.reason == "LEASE_RELEASED" and info.value.is_lease_ended

    with client.acquire(group, fixture.topic, partition=0) as again:
        assert again.offset == 7
        with again.records() as stream:
            first = stream.next_record(timeout=DEADLINE)
            assert first is not None and first.offset == 7
            assert_same(first, fixture.of(0)[7])
    # The with block released it: the partition is free at once.
    with client.acquire(group, fixture.topic, partition=0) as third:
        assert third.offset == 7


def test_broken_read_is_reopened_without_loss(fixture: Fixture, relay) -> None:
    with Client(relay.addr) as client:
        with client.acquire(fixture.fresh_group(), fixture.topic, partition=0, ttl=30) as lease:
            with lease.records(max_records=1, max_wait=0) as stream:
                first = take(stream, 3)
                assert [r.offset for r in first] == [0, 1, 2]
                assert relay.cut() > 0
                rest = take(stream, 7)
                assert [r.offset for r in rest] == list(range(3, 10)), "no gap, no repeat"
                for record in rest:
                    assert_same(record, fixture.of(0)[record.offset])
                # Nothing more comes (no repeat), and the Read was really reopened.
                with pytest.raises(TimeoutError):
                    stream.next_record(timeout=2.0)
                assert stream.reconnects >= 1
                assert relay.accepted >= 2


def test_error_reasons(client: Client, fixture: Fixture) -> None:
    group = fixture.fresh_group()
    with pytest.raises(NotFoundError) as info:
        client.acquire(group, fixture.missing_topic, partition=0)
    assert info.value.reason == "TOPIC_NOT_FOUND" and info.value.code == grpc.StatusCode.NOT_FOUND
    assert info.value.metadata.get("topic") == fixture.missing_topic

    with pytest.raises(NotFoundError) as info:
        client.acquire(group, fixture.topic, partition=99)
    assert info.value.reason == "PARTITION_NOT_FOUND" and info.value.metadata["partition_count"] == "2"

    with client.acquire(group, fixture.topic, partition=0, member="py-holder") as holder:
        started = time.monotonic()
        with pytest.raises(BusyError) as info:
            client.acquire(group, fixture.topic, partition=0, member="py-second", wait=0)
        busy = info.value
        assert busy.reason == "PARTITION_BUSY" and busy.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert busy.metadata["holder_member"] == "py-holder"
        assert busy.metadata["partition"] == "0"
        assert busy.retry_delay is not None and busy.retry_delay > 0
        assert not busy.is_retryable and time.monotonic() - started < 5, "busy is not retried"
        assert holder.partition == 0

    for bad in ({"ttl": 0.5}, {"ttl": dt.timedelta(minutes=6)}):
        with pytest.raises(InvalidArgumentError) as info:
            client.acquire(group, fixture.topic, partition=0, **bad)
        assert info.value.reason == "INVALID_FIELD" and info.value.metadata["field"] == "ttl"
    with pytest.raises(InvalidArgumentError) as info:
        client.acquire("", fixture.topic)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.reason == "INVALID_FIELD" and info.value.metadata["field"] == "group"


def test_subscribe_gets_everything_and_leaves_on_close(client: Client, fixture: Fixture) -> None:
    group = fixture.fresh_group()
    expected = {p: fixture.of(p) for p in range(fixture.partitions)}
    assigned: dict[int, Assigned] = {}
    got: dict[int, list[Record]] = {p: [] for p in expected}
    with client.subscribe(group, [fixture.topic], member_id="py-member-1", member="py-test") as sub:
        assert sub.member_id == "py-member-1"
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 15:
            event = sub.next_event(timeout=max(0.1, deadline - time.monotonic()))
            assert event is not None, "the subscription ended early"
            if isinstance(event, Assigned):
                assigned[event.partition.partition] = event
                assert event.offset == 0 and event.partition.fencing_token > 0
            elif isinstance(event, Records):
                assert event.partition.partition in assigned, "records before assigned"
                got[event.partition.partition].extend(event.batch.records)
                event.partition.commit(event.batch.next_offset)
            else:
                pytest.fail(f"unexpected {event}")
        assert sorted(assigned) == [0, 1]
        for p, records in got.items():
            assert [r.offset for r in records] == [r.offset for r in expected[p]]
            for record, want in zip(records, expected[p]):
                assert_same(record, want)
        members = client.list_members(group)
        assert [(m.member_id, sorted(m.partitions)) for m in members] == [("py-member-1", [0, 1])]
        # One join, one epoch of the group's target, which gives the member what it holds.
        assert (members[0].group_epoch, list(members[0].target_partitions)) == (1, [0, 1])
        assert not members[0].awaiting_target
    # Closing the subscription leaves the group and releases its leases.
    wait_until("the member to leave", lambda: client.list_members(group) == [] or None)
    wait_until("its leases to be released", lambda: client.list_leases(group=group) == [] or None)
    # What it committed stays with the group.
    for p, records in expected.items():
        with client.acquire(group, fixture.topic, partition=p) as lease:
            assert lease.offset == len(records)


def test_subscription_resubscribes_after_a_broken_connection(fixture: Fixture, relay) -> None:
    group = fixture.fresh_group() + "-resubscribe"
    expected = {p: [r.offset for r in fixture.of(p)] for p in range(fixture.partitions)}
    seen: dict[int, set[int]] = {p: set() for p in expected}
    assigned: dict[int, list[int]] = {p: [] for p in expected}  # the offsets of each Assigned
    cut_done = False
    with Client(relay.addr) as client:
        with client.subscribe(
            group, [fixture.topic], member="py-resubscribe", max_records=1, max_wait=0, session_grace=30
        ) as sub:
            member_id = sub.member_id  # made up by the gateway
            deadline = time.monotonic() + 60
            def done() -> bool:
                # Every record seen, and the cut followed by each lease's Assigned again.
                return cut_done and all(seen[p] == set(o) and len(assigned[p]) >= 2 for p, o in expected.items())

            while not done():
                event = sub.next_event(timeout=max(0.1, deadline - time.monotonic()))
                assert event is not None, "the subscription ended"
                if isinstance(event, Assigned):
                    assigned[event.partition.partition].append(event.offset)
                elif isinstance(event, Records):
                    for record in event.batch.records:
                        seen[event.partition.partition].add(record.offset)
                        assert_same(record, fixture.of(event.partition.partition)[record.offset])
                    try:
                        event.partition.commit(event.batch.next_offset)
                    except UnavailableError as error:  # a commit caught in the cut
                        assert error.is_retryable
                    if not cut_done and sum(map(len, seen.values())) >= 4 and all(assigned.values()):
                        # Mid-stream: the connection breaks; the caller does nothing about it.
                        # Not before each lease's first `assigned` came: events the gateway
                        # sent before a cut may be lost with the connection, and then only
                        # the `assigned` after it would be seen.
                        assert relay.cut() > 0
                        cut_done = True
                else:
                    pytest.fail(f"unexpected {event}")
            assert sub.resubscribes >= 1 and relay.accepted >= 2
            assert sub.member_id == member_id
            # The gateway assigned the member's leases again (at their committed offsets).
            for p, offsets in assigned.items():
                assert offsets[0] == 0 and all(0 <= o <= len(expected[p]) for o in offsets), f"partition {p}: {offsets}"
            members = client.list_members(group)
            assert [(m.member_id, sorted(m.partitions)) for m in members] == [(member_id, [0, 1])]
