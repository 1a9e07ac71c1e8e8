"""One channel at the scale the gateway allows (issue 31), against a real gateway."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from kafka_lease import Client, KafkaLeaseError, Lease, LeaseHandle, RecordStream

from conftest import Fixture, wait_until

#: Groups leasing every partition of the fixture's scale topic (250): 4 x 250 = 1,000 leases,
#: the most one connection may hold (the gateway's --max-leases-per-connection).
GROUPS = 4
#: Acquires waiting for held partitions, on the same client.
WAITERS = 500
#: How long a short call is given on the full channel: far beyond its usual milliseconds.
SHORT_CALL = 10.0


def scrape_metric(url: str, name: str) -> float:
    """The sum of a metric's series on the gateway's Prometheus endpoint."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        if series.split("{", 1)[0] == name:
            total += float(value)
    return total


def timed(what: str, call) -> float:
    """Runs a short call; fails unless it answers within SHORT_CALL. Its latency, in ms."""
    started = time.monotonic()
    try:
        call()
    except KafkaLeaseError as error:
        pytest.fail(f"{what} on the full channel: {error}")
    elapsed = time.monotonic() - started
    assert elapsed < SHORT_CALL, f"{what} took {elapsed:.1f} s on the full channel"
    return elapsed * 1000


@pytest.mark.timeout(300)
def test_one_channel_carries_long_calls_and_short_calls_answer(addr: str, fixture: Fixture, capsys) -> None:
    """One client (one gRPC channel, one connection) holds 1,000 leases with a Read open on
    each and has 500 Acquires waiting for held partitions; a Commit, a Seek, a ListLeases and a
    Release through the same client still answer within SHORT_CALL.

    gRPC's C core (grpcio) sets no cap of its own on the streams of a channel: it keeps to
    the gateway's SETTINGS_MAX_CONCURRENT_STREAMS, which leaves short calls room past the
    long ones (against a gateway with the old limit, 200 streams and 150 long calls, the
    151st Read is refused RESOURCE_EXHAUSTED). A RecordStream reads on a thread of its own and a waiting Acquire blocks its
    caller's thread, so this holds 1,500 threads: fine for a test, and for a process with that
    many partitions. Takes 5 to 15 s."""

    def say(line: str, end: str = "") -> None:
        with capsys.disabled():  # shown in the suite's output, passed or not
            print(f"\n[python] {line}", end=end)

    started = time.monotonic()
    groups = [fixture.fresh_group() for _ in range(GROUPS)]
    keys = [(group, p) for group in groups for p in range(fixture.scale_partitions)]
    topic = fixture.scale_topic
    client = Client(addr, timeout=SHORT_CALL)
    streams: list[RecordStream] = []
    leases: list[Lease] = []
    try:
        with ThreadPoolExecutor(32) as pool:
            leases = list(
                pool.map(lambda k: client.acquire(k[0], topic, partition=k[1], ttl=60, member="py-scale"), keys)
            )
        say(f"{len(leases)} leases acquired in {time.monotonic() - started:.1f} s")

        # A Read open on each, through the client's RecordStream: each hands out the
        # partition's record at offset 0 (so it is open at the gateway), then stays open.
        reads_started = time.monotonic()
        streams = [lease.records() for lease in leases]
        for i, stream in enumerate(streams):
            record = stream.next_record(timeout=max(1.0, reads_started + 60 - time.monotonic()))
            assert record is not None and record.offset == 0, f"the Read of lease {i} started with {record}"
        say(f"{len(streams)} Reads open (each with its first record) in {time.monotonic() - reads_started:.1f} s")

        # 500 Acquires waiting for the first 500 leases' partitions, through the same client.
        waiters_started = time.monotonic()
        waiting_pool = ThreadPoolExecutor(WAITERS)
        waiters: list[Future] = [
            waiting_pool.submit(client.acquire, group, topic, partition=p, wait=120, retry_attempts=1)
            for group, p in keys[:WAITERS]
        ]
        waiting = wait_until(
            "every Acquire to wait at the gateway",
            lambda: (n := scrape_metric(fixture.metrics_url, "kafka_lease_acquires_waiting")) >= WAITERS and n,
            timeout=60,
        )
        say(f"{waiting:.0f} Acquires waiting after {time.monotonic() - waiters_started:.1f} s")

        # The short calls, on a lease of the last group (nobody waits for it), its Read open.
        probe, probe_stream = leases[-1], streams[-1]
        commit = timed("Commit", lambda: probe.commit(1))
        seek = timed("Seek", lambda: probe.seek("earliest"))
        listed: list = []
        listing = timed("ListLeases", lambda: listed.extend(client.list_leases(group=probe.group)))
        assert len(listed) == fixture.scale_partitions
        release = timed("Release", probe.release)
        say(
            f"one channel with {len(streams)} Reads and {WAITERS} waiting Acquires: Commit {commit:.1f} ms, "
            f"Seek {seek:.1f} ms, ListLeases {listing:.1f} ms, Release {release:.1f} ms"
        )
        # The released lease's Read ends (after the sought record 0 again); nothing else did.
        rest = []
        while (record := probe_stream.next_record(timeout=SHORT_CALL)) is not None:
            rest.append(record.offset)
        assert rest in ([], [0]), f"the released lease's Read handed out {rest}"
        assert not any(w.done() for w in waiters), [w.exception() for w in waiters if w.done()][:3]
        for stream in streams[:-1]:
            with pytest.raises(TimeoutError):
                stream.next_record(timeout=0)  # no end, no error: still open

        # Done: closing the client ends every call on it (the waiters fail CANCELLED).
        client.close()
        for w in waiters:
            with pytest.raises(KafkaLeaseError):
                w.result(timeout=SHORT_CALL)
        waiting_pool.shutdown()
    finally:
        client.close()
        for stream in streams:
            stream.close()
    # The leases released through another client (their Reads ended with the first one).
    with Client(addr) as other, ThreadPoolExecutor(16) as pool:
        handles = [LeaseHandle(other, x.lease_id, x.topic, x.partition, x.fencing_token) for x in leases if not x.released]
        list(pool.map(LeaseHandle.release, handles))
    say(f"test took {time.monotonic() - started:.1f} s", end="\n")
