"""Consumes a topic as a member of a consumer group, through a kafka-lease gateway.

    KAFKA_LEASE_ADDR=127.0.0.1:50051 KAFKA_LEASE_GROUP=demo-group KAFKA_LEASE_TOPIC=demo \\
        python -u examples/consume.py

Prints ``processed <topic> <partition> <offset>`` per record, commits after each batch and
when a partition is being revoked. On SIGTERM or SIGINT it stops, commits what it processed,
ends the subscription (the member leaves the group, its leases are released) and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from kafka_lease import Assigned, Client, KafkaLeaseError, Partition, Records, Revoked, Revoking

stopping = False


def stop(signum: int, _frame: object) -> None:
    # Only set a flag: the loop below polls with a timeout and sees it within 0.5 s.
    global stopping
    stopping = True


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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


def consume(client: Client, group: str, topic: str, member_id: str) -> None:
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
                        print(f"processed {p.topic} {p.partition} {record.offset}", flush=True)
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


def main() -> int:
    addr = os.environ["KAFKA_LEASE_ADDR"]
    group = os.environ["KAFKA_LEASE_GROUP"]
    topic = os.environ["KAFKA_LEASE_TOPIC"]
    member_id = os.environ.get("KAFKA_LEASE_MEMBER_ID", "")
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with Client(addr) as client:
        while not stopping:
            try:
                consume(client, group, topic, member_id)
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
