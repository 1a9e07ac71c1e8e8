"""Consumes a topic as a member of a consumer group, through a kafka-lease gateway.

    KAFKA_LEASE_ADDR=127.0.0.1:50051 KAFKA_LEASE_GROUP=demo-group KAFKA_LEASE_TOPIC=demo \\
        KAFKA_LEASE_DEAD_LETTER_TOPIC=dlq.demo-group.demo python -u examples/consume.py

With ``KAFKA_LEASE_DEAD_LETTER_TOPIC`` (a topic that exists, not the consumed one) the member
subscribes in queue mode, PARTITION ordering (each partition handled in offset order), and
runs a handler per record (``Subscription.consume``); it prints ``processed <topic>
<partition> <offset>`` once the record's accept was APPLIED, and the gateway commits. Without
it, it reads plain batches instead (``Records`` events), prints the same line per record and
commits after each batch and when a partition is being revoked.

On SIGTERM or SIGINT it stops: queue mode lets the running handlers finish (the member keeps
its leases meanwhile), the plain mode commits what it processed; then it ends the
subscription (the member leaves the group, its leases are released, committing their
progress), waits until the gateway shows none of its leases, and exits 0. No session grace:
the member leaves as soon as its stream ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from kafka_lease import (
    AckOutcome,
    AckType,
    Assigned,
    Client,
    Delivery,
    KafkaLeaseError,
    Partition,
    QueueOptions,
    Records,
    Revoked,
    Revoking,
)

stopping = False


def stop(signum: int, _frame: object) -> None:
    # Only set a flag: the loop below polls with a timeout and sees it within 0.5 s.
    global stopping
    stopping = True


class Stopping:
    """What ``Subscription.consume`` watches: the flag the signal handler sets."""

    def is_set(self) -> bool:
        return stopping


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


print_lock = threading.Lock()  # handlers of different partitions answer on their own threads


def processed(topic: str, partition: int, offset: int) -> None:
    with print_lock:
        print(f"processed {topic} {partition} {offset}", flush=True)


class Offsets:
    """What was processed and what was committed, per lease."""

    def __init__(self) -> None:
        self.processed: dict[str, tuple[Partition, int]] = {}
        self.committed: dict[str, int] = {}

    def done(self, partition: Partition, next_offset: int) -> None:
        self.processed[partition.lease_id] = (partition, next_offset)

    def commit(self, partition: Partition) -> None:
        """Commits what was processed of ``partition``, if not committed yet."""
        _, offset = self.processed.get(partition.lease_id, (partition, None))
        if offset is None or self.committed.get(partition.lease_id) == offset:
            return
        try:
            partition.commit(offset)
            self.committed[partition.lease_id] = offset
        except KafkaLeaseError as error:  # e.g. the lease ended meanwhile: someone else goes on
            log(f"commit {partition.topic}/{partition.partition} at {offset} failed: {error}")

    def commit_all(self) -> None:
        for partition, _ in list(self.processed.values()):
            self.commit(partition)

    def forget(self, partition: Partition) -> None:
        self.processed.pop(partition.lease_id, None)
        self.committed.pop(partition.lease_id, None)


def consume_queue(client: Client, group: str, topic: str, member_id: str, dead_letter_topic: str) -> None:
    """One subscription in queue mode, until SIGTERM/SIGINT or the gateway ends it."""
    options = QueueOptions(ordering="partition", max_in_flight=8, dead_letter_topic=dead_letter_topic)

    def handle(delivery: Delivery) -> None:
        # The work on delivery.record goes here. Returning accepts it; raising Retry or Reject
        # (kafka_lease) retries it or sends it to the dead letter topic.
        pass

    def on_answer(delivery: Delivery, kind: AckType, outcome: AckOutcome) -> None:
        if kind == AckType.ACCEPT and outcome == AckOutcome.APPLIED:
            processed(delivery.topic, delivery.partition, delivery.offset)

    subscription = client.subscribe(group, [topic], member_id=member_id, member="python-example", queue=options)
    log(f"joined {group} as {subscription.member_id} (queue mode, dead letters to {dead_letter_topic})")
    try:
        # Returns once stopped and drained; it closes the subscription last, so the answers
        # land while the member still holds its leases.
        stats = subscription.consume(handle, concurrency=8, stop=Stopping(), on_answer=on_answer)
    finally:
        subscription.close()
        wait_released(client, group, subscription.member_id)
    log(f"accepted {stats.accepted}, retried {stats.retried}, rejected {stats.rejected}, handed back {stats.handed_back}")
    if not stopping:
        log("the gateway ended the subscription")


def wait_released(client: Client, group: str, member_id: str, timeout: float = 10.0) -> None:
    """Waits until the gateway shows no lease of ``member_id`` (released: progress committed)."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        try:
            if not any(lease.member_id == member_id for lease in client.list_leases(group=group)):
                log(f"left {group}: no lease of {member_id} remains")
                return
        except KafkaLeaseError as error:
            log(f"listing the leases failed: {error}")
        time.sleep(0.2)
    log(f"{member_id} still held leases after {timeout:.0f} s")


def consume_records(client: Client, group: str, topic: str, member_id: str) -> None:
    """One subscription reading plain batches, until SIGTERM/SIGINT or the gateway ends it."""
    offsets = Offsets()
    with client.subscribe(group, [topic], member_id=member_id, member="python-example") as subscription:
        log(f"joined {group} as {subscription.member_id}")
        try:
            while not stopping:
                try:
                    event = subscription.next_event(timeout=0.5)
                except TimeoutError:
                    continue
                if event is None:
                    log("the gateway ended the subscription")
                    return
                if isinstance(event, Assigned):
                    log(f"assigned {event.partition.topic}/{event.partition.partition} from {event.offset}")
                elif isinstance(event, Records):
                    p = event.partition
                    for record in event.batch.records:
                        processed(p.topic, p.partition, record.offset)
                    offsets.done(p, event.batch.next_offset)
                    offsets.commit(p)
                elif isinstance(event, Revoking):
                    log(f"revoking {event.partition.topic}/{event.partition.partition}")
                    offsets.commit(event.partition)
                elif isinstance(event, Revoked):
                    log(f"revoked {event.partition.topic}/{event.partition.partition}: {event.reason}")
                    offsets.forget(event.partition)
        finally:
            # Before the subscription ends: once it has, its leases are released.
            offsets.commit_all()
    # Leaving the `with` block cancelled the stream: the member has left the group.
    wait_released(client, group, subscription.member_id)


def main() -> int:
    addr = os.environ["KAFKA_LEASE_ADDR"]
    group = os.environ["KAFKA_LEASE_GROUP"]
    topic = os.environ["KAFKA_LEASE_TOPIC"]
    member_id = os.environ.get("KAFKA_LEASE_MEMBER_ID", "")
    dead_letter_topic = os.environ.get("KAFKA_LEASE_DEAD_LETTER_TOPIC", "")
    if not dead_letter_topic:
        log(
            "KAFKA_LEASE_DEAD_LETTER_TOPIC is unset: queue mode needs a dead letter topic that "
            "exists (and is not the consumed topic), so this reads plain batches instead"
        )
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with Client(addr) as client:
        while not stopping:
            try:
                if dead_letter_topic:
                    consume_queue(client, group, topic, member_id, dead_letter_topic)
                else:
                    consume_records(client, group, topic, member_id)
            except KafkaLeaseError as error:
                if not error.is_retryable:
                    log(f"giving up: {error}")
                    return 1
                log(f"subscription broke ({error}); subscribing again")
                time.sleep(error.retry_delay or 1.0)
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
