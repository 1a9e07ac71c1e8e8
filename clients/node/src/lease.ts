// A held lease: reading its partition (a RecordStream that drops stale seek epochs and reopens
// itself after a break), seeking, committing, releasing; or its records as a queue (queue.ts).
import type { ClientReadableStream } from "@grpc/grpc-js";
import { type KafkaLeaseError, streamBroke, toKafkaLeaseError } from "./errors";
import type {
  AcquireResponse,
  PartitionLeaseServiceClient,
  ReadResponse,
  SeekRequest,
} from "./gen/kafka_lease/v1/partition_lease";
import {
  type CallOpts,
  type OffsetLike,
  dateToTimestamp,
  durationToMs,
  msToDuration,
  sleep,
  timestampToDate,
  toOffset,
  unary,
} from "./convert";
import { type Batch, toBatch } from "./records";
import {
  Acknowledger,
  type ConsumeOptions,
  type ConsumeStats,
  DeliveryStream,
  type Handler,
  type QueueOptions,
  consume,
  deliverRequest,
} from "./queue";

/**
 * The newest seek epoch a lease's client has seen. Responses of an older epoch are dropped:
 * once a Seek answered epoch n, nothing of an epoch below n is handed out.
 */
export class EpochFilter {
  #newest = 0n;
  get newest(): bigint {
    return this.#newest;
  }
  /** Records a SeekResponse's epoch. Never lowers. */
  observe(epoch: bigint): void {
    if (epoch > this.#newest) this.#newest = epoch;
  }
  /** Whether a response of `epoch` is to be delivered (it then becomes the newest seen). */
  admit(epoch: bigint): boolean {
    const ok = epoch >= this.#newest;
    this.observe(epoch);
    return ok;
  }
}

/** Where a seek goes: an offset, the first record at or after a time, or a named position. */
export type SeekTo = OffsetLike | Date | "earliest" | "latest" | "committed";

export function seekPosition(to: SeekTo): SeekRequest["position"] {
  if (to instanceof Date) return { $case: "timestamp", timestamp: dateToTimestamp(to) };
  switch (to) {
    case "earliest":
      return { $case: "earliest", earliest: {} };
    case "latest":
      return { $case: "latest", latest: {} };
    case "committed":
      return { $case: "committed", committed: {} };
    default:
      return { $case: "offset", offset: toOffset(to) };
  }
}

/**
 * A lease usable for Commit, Seek and Release: a {@link Lease} from Acquire, or a partition
 * assigned by Subscribe. The lease id is a bearer credential and is kept out of `inspect`.
 */
export class LeaseHandle {
  readonly #id: string;
  readonly #raw: PartitionLeaseServiceClient;
  /** The newest seek epoch seen for this lease; shared with its record streams. */
  readonly epochs = new EpochFilter();

  constructor(
    raw: PartitionLeaseServiceClient,
    leaseId: string,
    readonly topic: string,
    readonly partition: number,
    /** Greater than every token issued before for this group, topic and partition. */
    readonly fencingToken: bigint,
  ) {
    this.#id = leaseId;
    this.#raw = raw;
  }

  /** The generated client this lease's calls go through. */
  protected get raw(): PartitionLeaseServiceClient {
    return this.#raw;
  }

  /** The opaque lease id (do not log it). */
  get leaseId(): string {
    return this.#id;
  }

  /** Repositions the lease; later batches start at the resolved offset. Commits nothing. */
  async seek(to: SeekTo, options?: CallOpts): Promise<{ offset: bigint; seekEpoch: bigint }> {
    const request = { leaseId: this.#id, position: seekPosition(to) };
    const response = await unary(this.raw.seek.bind(this.raw), request, options);
    this.epochs.observe(response.seekEpoch);
    return { offset: response.offset, seekEpoch: response.seekEpoch };
  }

  /** Commits `offset` (the next offset to read: last processed + 1), fenced by the lease. */
  async commit(offset: OffsetLike, metadata?: string, options?: CallOpts): Promise<void> {
    await unary(this.raw.commit.bind(this.raw), { leaseId: this.#id, offset: toOffset(offset), metadata }, options);
  }

  /** Ends the lease, committing `commitOffset` first if given (a rejected commit keeps it). */
  async release(commitOffset?: OffsetLike, options?: CallOpts): Promise<void> {
    const request = { leaseId: this.#id, commitOffset: commitOffset === undefined ? undefined : toOffset(commitOffset) };
    await unary(this.raw.release.bind(this.raw), request, options);
  }
}

/** How a Read batches records and reopens. Unset fields take the gateway's defaults. */
export interface ReadOptions {
  maxRecords?: number;
  /** Most bytes per batch (gateway default 1 MiB; at most 4 MiB). A bound: the gateway sends at
   * most 256 KiB of records per batch whatever this allows (a single larger record comes alone). */
  maxBytes?: number;
  maxWaitMs?: number;
  /** Start here (as a seek would) instead of at the lease's resume point. */
  fromOffset?: OffsetLike;
  /** Consecutive failed reopens before the error reaches the caller (default 8; 0: never). */
  reconnectAttempts?: number;
  /** Called before each reopen with its `from_offset` (undefined: the resume point). */
  onReconnect?: (fromOffset: bigint | undefined, cause: KafkaLeaseError) => void;
}

const DEFAULT_RECONNECT_ATTEMPTS = 8;
const DEFAULT_TTL_MS = 10_000;

/** An exclusive, expiring lease on one partition, from `Client.acquire`. */
export class Lease extends LeaseHandle {
  readonly group: string;
  /** Where reading started at Acquire: the committed offset, else the reset position. */
  readonly offset: bigint;
  /** The partition's high watermark at Acquire. */
  readonly highWatermark: bigint;
  /** When the lease expires if nothing renews it, as of Acquire. */
  readonly expiresAt: Date | null;
  /** The gateway instance serving the lease. */
  readonly gateway: string;
  /** The TTL the gateway granted. */
  readonly ttlMs: number;

  constructor(raw: PartitionLeaseServiceClient, r: AcquireResponse, group: string, ttlMs: number | undefined) {
    super(raw, r.leaseId, r.topic, r.partition, r.fencingToken);
    this.group = r.group || group;
    this.offset = r.offset;
    this.highWatermark = r.highWatermark;
    this.expiresAt = timestampToDate(r.expiresAt);
    this.gateway = r.gateway;
    this.ttlMs = durationToMs(r.ttl) ?? ttlMs ?? DEFAULT_TTL_MS;
  }

  /** The newest seek epoch seen (0 until the first seek). */
  get seekEpoch(): bigint {
    return this.epochs.newest;
  }

  /**
   * Opens a Read: the partition's batches in order, no gaps, no repeats. Iterate it with
   * `for await`; leaving the loop (or `cancel()`) closes the Read. A new Read supersedes the
   * previous one, which then fails with ABORTED (SUPERSEDED).
   */
  records(options: ReadOptions = {}): RecordStream {
    const template = {
      leaseId: this.leaseId,
      maxRecords: options.maxRecords ?? 0,
      maxBytes: options.maxBytes ?? 0,
      maxWait: options.maxWaitMs === undefined ? undefined : msToDuration(options.maxWaitMs),
    };
    const open = (fromOffset: bigint | undefined, ifSeekEpoch?: bigint) =>
      this.raw.read({ ...template, fromOffset, ifSeekEpoch });
    const from = options.fromOffset === undefined ? undefined : toOffset(options.fromOffset);
    return new RecordStream(open, this.epochs, from, options);
  }

  #acks: Acknowledger | undefined;

  /**
   * Puts the lease in queue mode (on the first Deliver) and opens its deliveries: records
   * handed out one by one, each answered on its own (`accept`, `retry`, `reject`, `renew`); a
   * record that fails its `maxDeliveries`-th delivery goes to the dead letter topic. The
   * gateway commits for the client (the lowest record not done, and the done ones above it
   * in the commit's metadata); `release()` commits the queue's progress.
   *
   * From the first Deliver on, `records()`, `seek()`, `commit()` and `release(offset)` fail
   * with FAILED_PRECONDITION (`WRONG_MODE`). Errors of the Deliver itself come out of the
   * stream's first `next()`: INVALID_ARGUMENT for settings out of range (or not the queue's),
   * NOT_FOUND (`TOPIC_NOT_FOUND`) when the dead letter topic does not exist, the lease errors
   * as for every call. A new Deliver of the lease supersedes the open one.
   */
  deliveries(options: QueueOptions = {}): DeliveryStream {
    const request = deliverRequest(this.leaseId, options);
    this.#acks ??= new Acknowledger(this.raw, this.leaseId);
    const where = { topic: this.topic, partition: this.partition };
    return new DeliveryStream(() => this.raw.deliver(request), this.#acks, options, where);
  }

  /**
   * Runs `handler` on every record of the lease in queue mode, up to `concurrency` at once,
   * until `signal` aborts or the lease ends. Resolving accepts the record; throwing retries it
   * (after a `RetryError`'s delay, or the backoff: 100 ms doubling with each attempt up
   * to 30 s) or, for a `RejectError`, rejects it to the dead letter topic (`onError`
   * decides otherwise); after the queue's `maxDeliveries` a failing record goes there too.
   *
   * When `signal` aborts it stops taking deliveries, gives running handlers the drain time
   * (`drainMs`, 10 s), renewing their deliveries every third of the lease's TTL (with the
   * Deliver closed, these keep the lease alive), then hands back the records of those still
   * running (RETRY at once; their handler's `signal` aborts) and resolves with what it did.
   * Then release the lease: Release commits the queue's progress. It resolves as well when the
   * lease is released meanwhile, and rejects (after the same drain) with the error that ended
   * the deliveries: the lease ended, or a broken stream could not be reopened.
   */
  consume(handler: Handler, options: ConsumeOptions = {}): Promise<ConsumeStats> {
    return consume((queue) => this.deliveries(queue), this.ttlMs, handler, options);
  }
}

const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 2000;

/**
 * An open Read: an async iterator of {@link Batch}es.
 * - batches of a seek epoch older than the lease's newest are dropped;
 * - a broken stream (transport failure, or UNAVAILABLE with retry advice) is reopened with
 *   `from_offset` = the offset after the last record handed out and `if_seek_epoch` = its
 *   epoch, so a seek racing the reopen wins (or at the resume point if a seek is known to have
 *   happened since), with backoff, at most `reconnectAttempts` times in a row;
 * - it ends when the gateway ends the Read with OK (after Release); any other end is thrown
 *   once as a KafkaLeaseError.
 */
export class RecordStream implements AsyncIterableIterator<Batch> {
  #call!: ClientReadableStream<ReadResponse>;
  #iterator!: AsyncIterator<ReadResponse>;
  /** Where a reopen starts: after the last record handed out (`handedOut`), else where asked. */
  #delivered: { next: bigint; epoch: bigint; handedOut: boolean } | undefined;
  #failures = 0;
  #done = false;
  readonly #abort = new AbortController();
  readonly #attempts: number;
  /** How many times the stream was reopened. */
  reconnects = 0;

  constructor(
    private readonly open: (fromOffset: bigint | undefined, ifSeekEpoch?: bigint) => ClientReadableStream<ReadResponse>,
    private readonly epochs: EpochFilter,
    fromOffset: bigint | undefined,
    private readonly options: ReadOptions,
  ) {
    this.#attempts = options.reconnectAttempts ?? DEFAULT_RECONNECT_ATTEMPTS;
    // A first Read that breaks before delivering anything is reopened where it was asked to start.
    if (fromOffset !== undefined) this.#delivered = { next: fromOffset, epoch: epochs.newest, handedOut: false };
    this.#start(fromOffset);
  }

  #start(fromOffset: bigint | undefined, ifSeekEpoch?: bigint) {
    this.#call = this.open(fromOffset, ifSeekEpoch);
    this.#iterator = this.#call[Symbol.asyncIterator]();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Batch, undefined>> {
    while (!this.#done) {
      let item: IteratorResult<ReadResponse>;
      try {
        item = await this.#iterator.next();
      } catch (e) {
        if (this.#done) break;
        const error = toKafkaLeaseError(e);
        if (await this.#reopen(error)) continue;
        this.cancel();
        throw error;
      }
      if (item.done) break;
      // Checked when handed out, so a batch buffered before a seek returned is dropped too.
      if (!this.epochs.admit(item.value.seekEpoch)) continue;
      const batch = toBatch(item.value);
      if (batch.nextOffset !== undefined) {
        this.#delivered = { next: batch.nextOffset, epoch: batch.seekEpoch, handedOut: true };
      }
      this.#failures = 0;
      return { value: batch, done: false };
    }
    this.cancel();
    return { value: undefined, done: true };
  }

  async return(): Promise<IteratorResult<Batch, undefined>> {
    this.cancel();
    return { value: undefined, done: true };
  }

  /** Closes the Read (the lease stays held until its TTL runs out or it is released). */
  cancel(): void {
    if (this.#done) return;
    this.#done = true;
    this.#abort.abort();
    this.#call.cancel();
  }

  async #reopen(error: KafkaLeaseError): Promise<boolean> {
    if (!streamBroke(error) || this.#failures >= this.#attempts) return false;
    const backoff = Math.min(FIRST_BACKOFF_MS * 2 ** this.#failures, MAX_BACKOFF_MS);
    this.#failures++;
    if (!(await sleep(backoff, this.#abort.signal)) || this.#done) return true;
    // After the last record handed out, while the lease is still at its epoch (the gateway
    // checks, so a seek racing the reopen wins), unless a seek is known to have happened
    // since: then the resume point.
    const d = this.#delivered;
    const resume = d !== undefined && this.epochs.newest <= d.epoch ? d : undefined;
    this.reconnects++;
    this.options.onReconnect?.(resume?.next, error);
    this.#start(resume?.next, resume?.handedOut ? resume.epoch : undefined);
    return true;
  }
}
