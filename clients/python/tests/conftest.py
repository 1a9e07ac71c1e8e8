"""Shared fixtures: the gateway (KAFKA_LEASE_ADDR), the fixture records (KAFKA_LEASE_FIXTURE),
fresh group names, and a TCP relay whose connections a test can cut."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import pytest

from kafka_lease import Client

T = TypeVar("T")


@dataclass(frozen=True)
class FixtureRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int


@dataclass(frozen=True)
class QueueFixture:
    """The queue-mode topic: partition 0 holds ``records`` records, key ``k<i % keys>``, value
    ``v<i>``, except at ``poison_offset`` whose value is ``poison``."""

    topic: str
    dead_letter_topic: str
    records: int
    keys: int
    poison_offset: int

    def key(self, offset: int) -> bytes:
        return b"k%d" % (offset % self.keys)

    def value(self, offset: int) -> bytes:
        return b"poison" if offset == self.poison_offset else b"v%d" % offset


@dataclass(frozen=True)
class Fixture:
    group: str
    topic: str
    partitions: int
    missing_topic: str
    records: list[FixtureRecord]
    #: A topic with one record (offset 0) in each partition, for the one-channel test.
    scale_topic: str
    scale_partitions: int
    #: The gateway's Prometheus endpoint.
    metrics_url: str
    #: The queue-mode topic; None for a fixture without one.
    queue: QueueFixture | None = None

    def fresh_group(self) -> str:
        """A group no run used before: commits persist in Kafka."""
        return f"{self.group}-py-{secrets.token_hex(4)}"

    def of(self, partition: int) -> list[FixtureRecord]:
        return [r for r in self.records if r.partition == partition]


def _bytes(hex_or_none: str | None) -> bytes | None:
    return None if hex_or_none is None else bytes.fromhex(hex_or_none)


@pytest.fixture(scope="session")
def addr() -> str:
    value = os.environ.get("KAFKA_LEASE_ADDR")
    if not value or not os.environ.get("KAFKA_LEASE_FIXTURE"):
        pytest.skip("KAFKA_LEASE_ADDR and KAFKA_LEASE_FIXTURE are not set: no gateway to test against")
    return value


@pytest.fixture(scope="session")
def fixture(addr: str) -> Fixture:
    with open(os.environ["KAFKA_LEASE_FIXTURE"], encoding="utf-8") as f:
        raw = json.load(f)
    records = [
        FixtureRecord(
            partition=r["partition"],
            offset=r["offset"],
            key=_bytes(r["key_hex"]),
            value=_bytes(r["value_hex"]),
            headers=[(h["key"], _bytes(h["value_hex"])) for h in r["headers"]],
            timestamp_ms=r["timestamp_ms"],
        )
        for r in raw["records"]
    ]
    fixture = Fixture(
        raw["group"],
        raw["topic"],
        raw["partitions"],
        raw["missing_topic"],
        records,
        raw["scale"]["topic"],
        raw["scale"]["partitions"],
        raw["metrics_url"],
        QueueFixture(**raw["queue"]) if "queue" in raw else None,
    )
    # The records must still be there: Kafka's time-based retention deletes records whose
    # timestamps are older than retention.ms (7 days by default) at its next check.
    with Client(addr) as client:
        with client.acquire(fixture.fresh_group(), fixture.topic, partition=0) as lease:
            start = lease.seek("earliest").offset
    first = min(r.offset for r in fixture.of(0))
    if start != first:
        pytest.fail(
            f"the fixture topic {fixture.topic} starts at offset {start}, not {first}: its records "
            "are gone (Kafka retention deletes records with old timestamps unless the topic "
            "has retention.ms=-1)"
        )
    return fixture


@pytest.fixture
def client(addr: str):
    with Client(addr) as c:
        yield c


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 15.0, every: float = 0.1) -> T:
    """Polls ``probe`` until it returns something other than None or False, or fails."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Relay:
    """A TCP relay on 127.0.0.1: forwards every connection to ``upstream``; :meth:`cut`
    closes every current connection while new ones are still accepted."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.accepted = 0
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                self.accepted += 1
                self._sockets += [downstream, upstream]
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        """Closes every open connection; returns how many sockets were closed."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return len(sockets)

    def close(self) -> None:
        self._stopped = True
        self._listener.close()
        self.cut()


@pytest.fixture
def relay(addr: str):
    r = Relay(addr)
    yield r
    r.close()
