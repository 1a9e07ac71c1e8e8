// Groups that balance themselves: Subscribe joins a group as a member, and the gateways share
// the topics' partitions among the members.
import type { ClientReadableStream } from "@grpc/grpc-js";
import { KafkaLeaseError, toKafkaLeaseError, Code } from "./errors";
import type { PartitionLeaseServiceClient, SubscribeResponse } from "./gen/kafka_lease/v1/partition_lease";
import { LeaseHandle } from "./lease";
import { type Batch, toBatch } from "./records";
import { timestampToDate } from "./convert";

/** A lease the member was assigned: commit, seek or release it like any lease. */
export class Partition extends LeaseHandle {}

/** What a subscription streams (after `joined`, which `Client.subscribe` waits for). */
export type SubscriptionEvent =
  | { type: "assigned"; partition: Partition; offset: bigint; highWatermark: bigint }
  | { type: "records"; partition: Partition; batch: Batch }
  /** No records of the lease follow: commit what was processed before `deadline`. */
  | { type: "revoking"; partition: Partition; deadline: Date | null }
  /** The lease ended: `reason` is LEASE_REVOKED after `revoking`, else why. */
  | { type: "revoked"; partition: Partition; reason: string; message: string };

/**
 * A member of a group: an async iterator of {@link SubscriptionEvent}s. The member stays in the
 * group while the stream is open; `cancel()` (or leaving a `for await` loop) ends it, and the
 * member leaves the group and its leases are released.
 *
 * Records of a partition made stale by a `Partition.seek` (an older seek epoch) are dropped.
 * Ends when the gateway ends the stream with OK; any other end is thrown once.
 */
export class Subscription implements AsyncIterableIterator<SubscriptionEvent> {
  readonly #partitions = new Map<string, Partition>();
  #done = false;

  private constructor(
    private readonly raw: PartitionLeaseServiceClient,
    private readonly call: ClientReadableStream<SubscribeResponse>,
    private readonly iterator: AsyncIterator<SubscribeResponse>,
    /** This member's id (the request's, or the one the gateway generated). */
    readonly memberId: string,
    /** The gateway instance serving the subscription. */
    readonly gateway: string,
  ) {}

  /** Opens the stream and waits for `joined`. */
  static async open(raw: PartitionLeaseServiceClient, call: ClientReadableStream<SubscribeResponse>) {
    const iterator: AsyncIterator<SubscribeResponse> = call[Symbol.asyncIterator]();
    let first: IteratorResult<SubscribeResponse>;
    try {
      first = await iterator.next();
    } catch (e) {
      throw toKafkaLeaseError(e);
    }
    const event = first.done ? undefined : first.value.event;
    if (event?.$case !== "joined") {
      call.cancel();
      throw new KafkaLeaseError(Code.INTERNAL, `the subscription's first event was not joined`, undefined, {}, undefined);
    }
    return new Subscription(raw, call, iterator, event.joined.memberId, event.joined.gateway);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  #partition(leaseId: string, topic: string, partition: number, fencingToken = 0n): Partition {
    let handle = this.#partitions.get(leaseId);
    if (handle === undefined) {
      handle = new Partition(this.raw, leaseId, topic, partition, fencingToken);
      this.#partitions.set(leaseId, handle);
    }
    return handle;
  }

  async next(): Promise<IteratorResult<SubscriptionEvent, undefined>> {
    while (!this.#done) {
      let item: IteratorResult<SubscribeResponse>;
      try {
        item = await this.iterator.next();
      } catch (e) {
        if (this.#done) break;
        this.cancel();
        throw toKafkaLeaseError(e);
      }
      if (item.done) break;
      const event = item.value.event;
      switch (event?.$case) {
        case "assigned": {
          const a = event.assigned;
          const partition = this.#partition(a.leaseId, a.topic, a.partition, a.fencingToken);
          return { done: false, value: { type: "assigned", partition, offset: a.offset, highWatermark: a.highWatermark } };
        }
        case "records": {
          const r = event.records;
          const partition = this.#partition(r.leaseId, r.topic, r.partition);
          if (!partition.epochs.admit(r.seekEpoch)) continue;
          return { done: false, value: { type: "records", partition, batch: toBatch(r) } };
        }
        case "revoking": {
          const r = event.revoking;
          const partition = this.#partition(r.leaseId, r.topic, r.partition);
          return { done: false, value: { type: "revoking", partition, deadline: timestampToDate(r.deadline) } };
        }
        case "revoked": {
          const r = event.revoked;
          const partition = this.#partition(r.leaseId, r.topic, r.partition);
          this.#partitions.delete(r.leaseId);
          return { done: false, value: { type: "revoked", partition, reason: r.reason, message: r.message } };
        }
        default:
          continue; // a later `joined`, or an event this version does not know
      }
    }
    this.cancel();
    return { done: true, value: undefined };
  }

  async return(): Promise<IteratorResult<SubscriptionEvent, undefined>> {
    this.cancel();
    return { done: true, value: undefined };
  }

  /** Ends the subscription: the member leaves the group and its leases are released. */
  cancel(): void {
    if (this.#done) return;
    this.#done = true;
    this.call.cancel();
  }
}
