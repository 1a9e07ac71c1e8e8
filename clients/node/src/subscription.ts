// Groups that balance themselves: Subscribe joins a group as a member, and the gateways share
// the topics' partitions among the members.
import type { ClientReadableStream } from "@grpc/grpc-js";
import { KafkaLeaseError, toKafkaLeaseError, Code, streamBroke } from "./errors";
import type { PartitionLeaseServiceClient, SubscribeResponse } from "./gen/kafka_lease/v1/partition_lease";
import { LeaseHandle } from "./lease";
import { type Batch, toBatch, toRecord } from "./records";
import { sleep, timestampToDate } from "./convert";
import {
  Acknowledger,
  type ConsumeStats,
  type ConsumerOptions,
  Delivery,
  type DeliverySource,
  type Handler,
  handBack,
  runConsumer,
  subscriptionRenewEveryMs,
} from "./queue";

/** A lease the member was assigned: commit, seek or release it like any lease. */
export class Partition extends LeaseHandle {}

/** What a subscription streams (after `joined`, which `Client.subscribe` waits for). */
export type SubscriptionEvent =
  | { type: "assigned"; partition: Partition; offset: bigint; highWatermark: bigint }
  | { type: "records"; partition: Partition; batch: Batch }
  /**
   * In queue mode (`SubscribeOptions.queue`): deliveries of the lease, each to answer
   * (`accept`, `retry`, `reject`, `renew`) before its deadline.
   */
  | { type: "deliveries"; partition: Partition; highWatermark: bigint; deliveries: Delivery[] }
  /** No records of the lease follow: commit what was processed before `deadline`. */
  | { type: "revoking"; partition: Partition; deadline: Date | null }
  /** The lease ended: `reason` is LEASE_REVOKED after `revoking`, else why. */
  | { type: "revoked"; partition: Partition; reason: string; message: string };

/** How `Subscription.consume` runs the handler. */
export interface SubscriptionConsumeOptions extends ConsumerOptions {
  /** Sees every event besides `deliveries` (assignments, revocations); what it throws is ignored. */
  onEvent?: (event: SubscriptionEvent) => void;
}

/**
 * How a subscription comes back after its stream broke: `open` subscribes again with the same
 * settings under `memberId`, for as long as `graceMs` (the session grace) lasts.
 */
export interface Resubscribe {
  open: (memberId: string) => ClientReadableStream<SubscribeResponse>;
  graceMs: number;
  onResubscribe?: (cause: KafkaLeaseError, attempt: number) => void;
}

const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 2000;
/**
 * How long after a break MEMBER_ACTIVE is taken for the old stream, not another one: the
 * gateway notices a connection that went away without a word within its HTTP/2 keepalive (20 s
 * plus 20 s by default), and holds the member as attached until then.
 */
const MEMBER_ACTIVE_RETRY_MS = 45_000;

async function firstEvent(call: ClientReadableStream<SubscribeResponse>) {
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
  return { iterator, joined: event.joined };
}

/**
 * A member of a group: an async iterator of {@link SubscriptionEvent}s. The member stays in the
 * group while the stream is open; `cancel()` (or leaving a `for await` loop) ends it, and the
 * member leaves the group and its leases are released.
 *
 * Records of a partition made stale by a `Partition.seek` (an older seek epoch) are dropped.
 * Ends when the gateway ends the stream with OK; any other end is thrown once.
 *
 * With a session grace (`sessionGraceMs` > 0), a stream that broke (a transport failure, or
 * UNAVAILABLE with the gateway's retry advice) is subscribed again by itself, with backoff,
 * under the same member id, topics and settings, for as long as the grace lasts: the gateway
 * hands the member over with its leases, and the events go on with `assigned` again for each
 * lease still held (the same {@link Partition}), whose records come again from its resume point
 * (the last commit). Any other error (INVALID_ARGUMENT, PERMISSION_DENIED, MEMBER_ACTIVE that
 * persists: another live stream has the member id) ends the subscription as before.
 */
export class Subscription implements AsyncIterableIterator<SubscriptionEvent> {
  readonly #partitions = new Map<string, Partition>();
  /** The answer batcher of each lease, in queue mode. */
  readonly #acks = new Map<string, Acknowledger>();
  #done = false;
  #call: ClientReadableStream<SubscribeResponse>;
  #iterator: AsyncIterator<SubscribeResponse>;
  #gateway: string;
  readonly #abort = new AbortController();
  /** How many times the subscription came back after its stream broke. */
  resubscribes = 0;

  private constructor(
    private readonly raw: PartitionLeaseServiceClient,
    call: ClientReadableStream<SubscribeResponse>,
    iterator: AsyncIterator<SubscribeResponse>,
    /** This member's id (the request's, or the one the gateway generated). */
    readonly memberId: string,
    gateway: string,
    private readonly resubscribe: Resubscribe | undefined,
    /** The queue's ack deadline, when the subscription set one. */
    private readonly ackDeadlineMs: number | undefined,
  ) {
    this.#call = call;
    this.#iterator = iterator;
    this.#gateway = gateway;
  }

  /** The gateway instance serving the subscription (it may change when it resubscribes). */
  get gateway(): string {
    return this.#gateway;
  }

  /**
   * Opens the stream and waits for `joined`; with `resubscribe`, comes back after a break.
   * `ackDeadlineMs` is the queue's (`SubscribeQueueOptions.ackDeadlineMs`), if set.
   */
  static async open(
    raw: PartitionLeaseServiceClient,
    call: ClientReadableStream<SubscribeResponse>,
    resubscribe?: Resubscribe,
    ackDeadlineMs?: number,
  ) {
    const { iterator, joined } = await firstEvent(call);
    return new Subscription(raw, call, iterator, joined.memberId, joined.gateway, resubscribe, ackDeadlineMs);
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
        item = await this.#iterator.next();
      } catch (e) {
        if (this.#done) break;
        const error = await this.#resubscribe(toKafkaLeaseError(e));
        if (error === undefined) continue;
        this.cancel();
        throw error;
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
        case "deliveries": {
          const d = event.deliveries;
          const partition = this.#partition(d.leaseId, d.topic, d.partition);
          let acks = this.#acks.get(d.leaseId);
          if (acks === undefined) {
            acks = new Acknowledger(this.raw, d.leaseId);
            this.#acks.set(d.leaseId, acks);
          }
          const deliveries: Delivery[] = [];
          for (const x of d.deliveries) {
            if (x.record === undefined) continue;
            const record = toRecord(x.record);
            deliveries.push(new Delivery(record, x.attempt, timestampToDate(x.deadline), acks, d.topic, d.partition));
          }
          if (deliveries.length === 0) continue;
          return { done: false, value: { type: "deliveries", partition, highWatermark: d.highWatermark, deliveries } };
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
          this.#acks.delete(r.leaseId);
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

  /**
   * Runs `handler` on every delivery of the member's leases, as `Lease.consume` does for one
   * lease, until `signal` aborts or the subscription ends; the subscription must have been
   * opened with `SubscribeOptions.queue` (set its `maxInFlight`, shared by the member's leases,
   * to about `concurrency`: deliveries beyond what runs wait, their deadlines running). The
   * gateway follows assignments and revocations: a revoked lease gets no more deliveries, its
   * deliveries in flight are still answered, and it moves once none is (or at its deadline).
   *
   * When `signal` aborts it stops taking deliveries (those received and not started go back at
   * once) but keeps the subscription open, so the member keeps its leases while running
   * handlers drain (`drainMs`; their deliveries renewed every third of the ack deadline, at
   * most 2 s) and their answers land; hands back the records of those still running (RETRY at
   * once); then ends the subscription: the member leaves the group, and its
   * leases are released, committing their progress (after the session grace, if it has one).
   * Resolves with what it did, or rejects (after the same drain) with the error that ended the
   * subscription. The subscription is not to be iterated meanwhile.
   */
  consume(handler: Handler, options: SubscriptionConsumeOptions = {}): Promise<ConsumeStats> {
    const ready: Delivery[] = [];
    let paused = false;
    const onEvent = options.onEvent;
    const source: DeliverySource = {
      next: async () => {
        for (;;) {
          const delivery = ready.shift();
          if (delivery !== undefined) return { done: false, value: delivery };
          const item = await this.next();
          if (item.done) return item;
          const event = item.value;
          if (event.type !== "deliveries") {
            try {
              onEvent?.(event);
            } catch {
              // the caller's hook: ignored
            }
          } else if (paused) {
            handBack(event.deliveries); // arrived during the shutdown
          } else {
            ready.push(...event.deliveries);
          }
        }
      },
      pause: () => {
        paused = true;
        handBack(ready.splice(0));
      },
      close: () => this.cancel(),
      renewEveryMs: subscriptionRenewEveryMs(this.ackDeadlineMs),
    };
    return runConsumer(source, handler, options);
  }

  /** Ends the subscription: the member leaves the group and its leases are released. */
  cancel(): void {
    if (this.#done) return;
    this.#done = true;
    this.#abort.abort();
    this.#call.cancel();
  }

  /**
   * Subscribes again after `cause` broke the stream, within the session grace: undefined once
   * the member is back (or the subscription was cancelled meanwhile), else the error to end
   * it with.
   */
  async #resubscribe(cause: KafkaLeaseError): Promise<KafkaLeaseError | undefined> {
    const r = this.resubscribe;
    if (r === undefined || !(r.graceMs > 0) || !streamBroke(cause)) return cause;
    const brokeAt = Date.now();
    let error = cause;
    for (let attempt = 1; ; attempt++) {
      const backoff = Math.min(FIRST_BACKOFF_MS * 2 ** (attempt - 1), MAX_BACKOFF_MS);
      if (Date.now() + backoff >= brokeAt + r.graceMs) return error;
      if (!(await sleep(backoff, this.#abort.signal)) || this.#done) return undefined;
      r.onResubscribe?.(error, attempt);
      let call: ClientReadableStream<SubscribeResponse>;
      try {
        call = r.open(this.memberId);
      } catch (e) {
        return toKafkaLeaseError(e); // not a break: the channel was closed
      }
      this.#call = call;
      try {
        const { iterator, joined } = await firstEvent(call);
        if (this.#done) return undefined;
        this.#iterator = iterator;
        this.#gateway = joined.gateway;
        this.resubscribes++;
        return undefined;
      } catch (e) {
        if (this.#done) return undefined;
        error = toKafkaLeaseError(e);
        // The gateway may not have seen the old stream end yet.
        const stale = error.reason === "MEMBER_ACTIVE" && Date.now() - brokeAt < MEMBER_ACTIVE_RETRY_MS;
        if (!streamBroke(error) && !stale) return error;
      }
    }
  }
}
