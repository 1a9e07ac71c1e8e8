// Queue mode: a lease's records as deliveries answered one by one (`Lease.deliveries`), and a
// consumer that runs a handler per record with a concurrency setting (`Lease.consume`).
//
// Answers are batched: each lease sends at most one Acknowledge at a time, and the answers
// made meanwhile go together in the next one, so a busy consumer sends few calls and an idle
// one answers at once.
import type { ClientReadableStream } from "@grpc/grpc-js";
import { type KafkaLeaseError, streamBroke, toKafkaLeaseError } from "./errors";
import {
  AckOutcome as ProtoAckOutcome,
  AckType,
  type Acknowledgement,
  type DeliverRequest,
  type DeliverResponse,
  DeliveryOrder,
  type PartitionLeaseServiceClient,
  type QueueSettings,
} from "./gen/kafka_lease/v1/partition_lease";
import { msToDuration, sleep, timestampToDate, unary } from "./convert";
import { type KafkaLeaseRecord, toRecord } from "./records";

/**
 * How a queue's records may be handed out relative to each other:
 * - `"partition"` (the default): one record at a time, in offset order;
 * - `"key"`: the records of one key one at a time, in offset order, keys in parallel (a record
 *   being retried holds back its key only; records without a key are ordered by nothing);
 * - `"unordered"`: any record, in parallel.
 */
export type Ordering = "partition" | "key" | "unordered";

/**
 * A queue's settings. Unset fields take the gateway's defaults; a lease keeps the settings of
 * its first Deliver (a later one with other settings is INVALID_ARGUMENT).
 */
export interface QueueOptions {
  /** Default "partition". */
  ordering?: Ordering;
  /** Most deliveries unanswered at once (1 ..= 10,000; gateway default 64). */
  maxInFlight?: number;
  /** Most bytes of records unanswered at once (gateway default 4 MiB; at most 64 MiB). */
  maxInFlightBytes?: number;
  /** How long a delivery may go unanswered before it is delivered again (1 s ..= 1 h; default 30 s). */
  ackDeadlineMs?: number;
  /** Deliveries after which a failing record goes to the dead letter topic (1 ..= 100; default 5). */
  maxDeliveries?: number;
  /** Where rejected records go (default `dlq.<group>.<topic>`); it must exist. */
  deadLetterTopic?: string;
  /** Consecutive failed reopens of a broken Deliver before the error reaches the caller (default 8; 0: never). */
  reconnectAttempts?: number;
  /** Called before each reopen of a broken Deliver. */
  onReconnect?: (cause: KafkaLeaseError) => void;
}

/**
 * What became of an answer: `"applied"`; `"stale"` (it changed nothing: the delivery was no
 * longer in flight, its deadline having passed or another answer having come first, or the
 * record is done; an accept of a record not done yet counts even when stale); or
 * `"notDelivered"` (it changed nothing: no record at its offset was ever delivered on the
 * partition, by this holder or an earlier one; usually a bug of the caller, such as an offset
 * off by one).
 */
export type AckOutcome = "applied" | "stale" | "notDelivered";

/** The gateway's outcome; "stale" for one this version does not know (it changed nothing this client can tell). */
function ackOutcome(outcome: ProtoAckOutcome | undefined): AckOutcome {
  switch (outcome) {
    case ProtoAckOutcome.ACK_OUTCOME_APPLIED:
      return "applied";
    case ProtoAckOutcome.ACK_OUTCOME_NOT_DELIVERED:
      return "notDelivered";
    default:
      return "stale";
  }
}

const ORDERING: Record<Ordering, DeliveryOrder> = {
  partition: DeliveryOrder.DELIVERY_ORDER_PARTITION,
  key: DeliveryOrder.DELIVERY_ORDER_KEY,
  unordered: DeliveryOrder.DELIVERY_ORDER_UNORDERED,
};

/** The Deliver request of `options` for a lease. */
export function deliverRequest(leaseId: string, options: QueueOptions): DeliverRequest {
  const ordering = options.ordering === undefined ? DeliveryOrder.DELIVERY_ORDER_UNSPECIFIED : ORDERING[options.ordering];
  if (ordering === undefined) throw new RangeError(`unknown ordering ${String(options.ordering)}: partition, key or unordered`);
  return {
    leaseId,
    ordering,
    maxInFlight: options.maxInFlight ?? 0,
    maxInFlightBytes: options.maxInFlightBytes ?? 0,
    ackDeadline: options.ackDeadlineMs === undefined ? undefined : msToDuration(options.ackDeadlineMs),
    maxDeliveries: options.maxDeliveries ?? 0,
    deadLetterTopic: options.deadLetterTopic ?? "",
  };
}

/**
 * A subscription's queue settings (`SubscribeOptions.queue`): a queue's, for every lease the
 * member is assigned, with `maxInFlight` and `maxInFlightBytes` shared by all of them.
 */
export type SubscribeQueueOptions = Omit<QueueOptions, "reconnectAttempts" | "onReconnect">;

/** The Subscribe's QueueSettings of `options`. */
export function queueSettings(options: SubscribeQueueOptions): QueueSettings {
  const { leaseId: _, ...settings } = deliverRequest("", options);
  return settings;
}

/** Most acknowledgements in one Acknowledge (the gateway's limit). */
const MAX_ACKS_PER_CALL = 10_000;
/** The longest retry delay the gateway takes. */
const MAX_RETRY_DELAY_MS = 3_600_000;
/** The longest reason the gateway takes, in UTF-8 bytes. */
const MAX_REASON_BYTES = 1024;

interface PendingAck {
  ack: Acknowledgement;
  resolve: (outcome: AckOutcome) => void;
  reject: (error: KafkaLeaseError) => void;
}

/**
 * A lease's answers on their way: one Acknowledge at a time, the answers made meanwhile (and
 * those made in the same tick) batched into the next.
 */
export class Acknowledger {
  readonly #raw: PartitionLeaseServiceClient;
  readonly #leaseId: string;
  #queue: PendingAck[] = [];
  #busy = false;
  /** Acknowledge calls sent so far. */
  calls = 0;

  constructor(raw: PartitionLeaseServiceClient, leaseId: string) {
    this.#raw = raw;
    this.#leaseId = leaseId;
  }

  send(ack: Acknowledgement): Promise<AckOutcome> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ ack, resolve, reject });
      if (!this.#busy) {
        this.#busy = true;
        queueMicrotask(() => void this.#flush());
      }
    });
  }

  async #flush(): Promise<void> {
    while (this.#queue.length > 0) {
      const batch = this.#queue.splice(0, MAX_ACKS_PER_CALL);
      const request = { leaseId: this.#leaseId, acknowledgements: batch.map((p) => p.ack) };
      this.calls++;
      try {
        const response = await unary(this.#raw.acknowledge.bind(this.#raw), request);
        batch.forEach((p, i) => p.resolve(ackOutcome(response.outcomes[i])));
      } catch (e) {
        const error = toKafkaLeaseError(e);
        for (const p of batch) p.reject(error);
      }
    }
    this.#busy = false;
  }
}

/** `reason` cut to the gateway's limit (1024 UTF-8 bytes), on a character boundary. */
export function truncateReason(reason: string): string {
  if (Buffer.byteLength(reason) <= MAX_REASON_BYTES) return reason;
  let out = "";
  let bytes = 0;
  for (const ch of reason) {
    const n = Buffer.byteLength(ch);
    if (bytes + n > MAX_REASON_BYTES) break;
    out += ch;
    bytes += n;
  }
  return out;
}

/**
 * One hand-out of a record: answer it with {@link accept}, {@link retry} or {@link reject}, or
 * {@link renew} it, before its {@link deadline}. Each answer resolves to its outcome, or rejects
 * with a KafkaLeaseError when the Acknowledge failed (after the lease ended: a lease-ended
 * error, `leaseEnded`). A delivery not answered by its deadline is delivered again.
 */
export class Delivery {
  readonly #acks: Acknowledger;

  /** Made by a {@link DeliveryStream}, or a subscription's `deliveries` event. */
  constructor(
    /** The record. */
    readonly record: KafkaLeaseRecord,
    /** 1 for the first delivery, one more for each after it (carried over handovers). */
    readonly attempt: number,
    /** When the gateway delivers the record again unless it is answered (as of the delivery). */
    readonly deadline: Date | null,
    /** Where its answers go: the batcher of its lease. */
    acks: Acknowledger,
    /** The record's topic. */
    readonly topic: string,
    /** The record's partition. */
    readonly partition: number,
  ) {
    this.#acks = acks;
  }

  /** The record's offset. */
  get offset(): bigint {
    return this.record.offset;
  }

  #answer(type: AckType, extra: Partial<Acknowledgement> = {}): Promise<AckOutcome> {
    return this.#acks.send({ offset: this.record.offset, type, attempt: this.attempt, reason: "", ...extra });
  }

  /** Handled: the record is done. */
  accept(): Promise<AckOutcome> {
    return this.#answer(AckType.ACK_TYPE_ACCEPT);
  }

  /**
   * Not handled: deliver it again, not before `delayMs` (0 ..= 1 h; default 0). At its last
   * delivery (`maxDeliveries`) it goes to the dead letter topic instead, with `reason` (cut to
   * 1024 UTF-8 bytes).
   */
  retry(delayMs = 0, reason = ""): Promise<AckOutcome> {
    if (!(delayMs >= 0 && delayMs <= MAX_RETRY_DELAY_MS)) {
      return Promise.reject(new RangeError(`retry delay ${delayMs} ms: allowed 0 ..= ${MAX_RETRY_DELAY_MS}`));
    }
    return this.#answer(AckType.ACK_TYPE_RETRY, { retryDelay: msToDuration(delayMs), reason: truncateReason(reason) });
  }

  /** Never to be handled: to the dead letter topic now, with `reason` (cut to 1024 UTF-8 bytes). */
  reject(reason = ""): Promise<AckOutcome> {
    return this.#answer(AckType.ACK_TYPE_REJECT, { reason: truncateReason(reason) });
  }

  /** Still working: the delivery's deadline moves to now + the queue's ack deadline. */
  renew(): Promise<AckOutcome> {
    return this.#answer(AckType.ACK_TYPE_RENEW);
  }
}

const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 3_200;
const DEFAULT_RECONNECT_ATTEMPTS = 8;
const CLOSED_REASON = "the delivery stream was closed before handing it out";

/** Gives deliveries received but not handed out back to the gateway (RETRY at once). */
export function handBack(deliveries: Delivery[]): void {
  for (const d of deliveries) d.retry(0, CLOSED_REASON).catch(() => {});
}

/**
 * A lease's deliveries (`Lease.deliveries`): an async iterator of {@link Delivery}s.
 * - a broken stream (transport failure, or UNAVAILABLE with retry advice) is reopened with the
 *   same settings, with backoff, at most `reconnectAttempts` times in a row; deliveries in flight
 *   stay in flight meanwhile and can still be answered;
 * - it ends when the gateway ends the Deliver with OK (after Release); any other end is thrown
 *   once as a KafkaLeaseError (a newer Deliver of the lease ends this one: `SUPERSEDED`);
 * - `cancel()` (or leaving a `for await` loop) closes it, and hands back (RETRY at once) the
 *   deliveries received but not handed out yet, rather than leave them to their deadline.
 */
export class DeliveryStream implements AsyncIterableIterator<Delivery> {
  #call!: ClientReadableStream<DeliverResponse>;
  #iterator!: AsyncIterator<DeliverResponse>;
  readonly #ready: Delivery[] = [];
  #failures = 0;
  #done = false;
  readonly #abort = new AbortController();
  readonly #attempts: number;
  /** How many times the stream was reopened. */
  reconnects = 0;

  /** Made by `Lease.deliveries`. */
  constructor(
    private readonly open: () => ClientReadableStream<DeliverResponse>,
    private readonly acks: Acknowledger,
    private readonly options: QueueOptions,
    /** The lease's topic and partition. */
    private readonly where: { topic: string; partition: number },
  ) {
    this.#attempts = options.reconnectAttempts ?? DEFAULT_RECONNECT_ATTEMPTS;
    this.#start();
  }

  #start() {
    this.#call = this.open();
    this.#iterator = this.#call[Symbol.asyncIterator]();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Delivery, undefined>> {
    while (!this.#done) {
      const ready = this.#ready.shift();
      if (ready !== undefined) return { value: ready, done: false };
      let item: IteratorResult<DeliverResponse>;
      try {
        item = await this.#iterator.next();
      } catch (e) {
        if (this.#done) break;
        let error = toKafkaLeaseError(e);
        try {
          if (await this.#reopen(error)) continue;
        } catch (reopening) {
          error = toKafkaLeaseError(reopening); // the channel was closed
        }
        this.cancel();
        throw error;
      }
      if (item.done) break;
      this.#failures = 0;
      for (const d of item.value.deliveries) {
        if (d.record === undefined) continue;
        const { topic, partition } = this.where;
        this.#ready.push(
          new Delivery(toRecord(d.record), d.attempt, timestampToDate(d.deadline), this.acks, topic, partition),
        );
      }
      // Closed while this response was on its way: its deliveries go back too.
      if (this.#done) this.#handBack();
    }
    this.cancel();
    return { value: undefined, done: true };
  }

  async return(): Promise<IteratorResult<Delivery, undefined>> {
    this.cancel();
    return { value: undefined, done: true };
  }

  /**
   * Closes the Deliver (the lease stays in queue mode, held until its TTL runs out or it is
   * released) and hands back the deliveries received but not handed out yet.
   */
  cancel(): void {
    if (this.#done) return;
    this.#done = true;
    this.#abort.abort();
    this.#call.cancel();
    this.#handBack();
  }

  #handBack() {
    handBack(this.#ready.splice(0));
  }

  async #reopen(error: KafkaLeaseError): Promise<boolean> {
    if (!streamBroke(error) || this.#failures >= this.#attempts) return false;
    const backoff = Math.min(FIRST_BACKOFF_MS * 2 ** this.#failures, MAX_BACKOFF_MS);
    this.#failures++;
    if (!(await sleep(backoff, this.#abort.signal)) || this.#done) return true;
    this.reconnects++;
    this.options.onReconnect?.(error);
    this.#start();
    return true;
  }
}

/** What a handler is told besides its record. */
export interface HandlerContext {
  /** The record's topic. */
  readonly topic: string;
  /** The record's partition. */
  readonly partition: number;
  /** 1 for the first delivery, one more for each after it. */
  readonly attempt: number;
  /** When the gateway delivers the record again unless it is answered (as of the delivery). */
  readonly deadline: Date | null;
  /**
   * Aborted when the consumer gives up on this handler (its drain time at shutdown ran out) and
   * hands the record back: stop working on it; what it returns then is ignored.
   */
  readonly signal: AbortSignal;
  /** Moves the delivery's deadline to now + the queue's ack deadline (a long handler). */
  renew(): Promise<AckOutcome>;
}

/** Handles one record: resolving accepts it; throwing (or rejecting) fails it (see {@link ErrorPolicy}). */
export type Handler = (record: KafkaLeaseRecord, context: HandlerContext) => unknown;

/** What to do with a record whose handler failed. */
export type Failure =
  /** Deliver it again after `delayMs`, or after the consumer's backoff for its attempt. */
  | { action: "retry"; delayMs?: number; reason?: string }
  /** To the dead letter topic now. */
  | { action: "reject"; reason?: string };

/**
 * Decides what a handler's error means; `undefined` falls back to {@link defaultErrorPolicy}.
 */
export type ErrorPolicy = (error: unknown, record: KafkaLeaseRecord, attempt: number) => Failure | undefined;

/** Thrown by a handler: deliver the record again, after `delayMs` (else the consumer's backoff). */
export class RetryError extends Error {
  override readonly name = "RetryError";
  readonly delayMs: number | undefined;
  constructor(reason: string, options: { delayMs?: number; cause?: unknown } = {}) {
    super(reason, { cause: options.cause });
    this.delayMs = options.delayMs;
  }
}

/** Thrown by a handler: the record is never to be handled; to the dead letter topic with `reason`. */
export class RejectError extends Error {
  override readonly name = "RejectError";
  constructor(reason: string, options: { cause?: unknown } = {}) {
    super(reason, { cause: options.cause });
  }
}

const messageOf = (error: unknown) => (error instanceof Error ? error.message : String(error));

/**
 * The default policy: a {@link RejectError} rejects, a {@link RetryError} retries after its delay
 * (or the backoff), any other error retries after the backoff; the error's message is the reason.
 */
export function defaultErrorPolicy(error: unknown): Failure {
  if (error instanceof RejectError) return { action: "reject", reason: error.message };
  if (error instanceof RetryError) return { action: "retry", delayMs: error.delayMs, reason: error.message };
  return { action: "retry", reason: messageOf(error) };
}

/** What a consumer did with a delivery, and what became of the answer (`onAnswer`). */
export interface Answer {
  /** `"handBack"`: given back at shutdown, its handler unfinished (a retry at once). */
  action: "accept" | "retry" | "reject" | "handBack";
  record: KafkaLeaseRecord;
  topic: string;
  partition: number;
  attempt: number;
  /** The answer's outcome; undefined when the Acknowledge failed (`error`). */
  outcome?: AckOutcome;
  error?: KafkaLeaseError;
}

/** How a consumer (`Lease.consume`, `Subscription.consume`) runs the handler. */
export interface ConsumerOptions {
  /**
   * Handlers running at once (default 1). For `Lease.consume`, also the queue's `maxInFlight`
   * when that is unset, so that the gateway hands out no more than the consumer runs.
   */
  concurrency?: number;
  /** Aborting it shuts the consumer down (see `Lease.consume`). */
  signal?: AbortSignal;
  /** The delay of a retry without one: `initialMs` (100) doubling with each attempt, at most `maxMs` (30 s). */
  backoff?: { initialMs?: number; maxMs?: number };
  /**
   * At shutdown, how long running handlers may take to finish (default 10 s); their deliveries
   * are renewed meanwhile (see `Lease.consume`, `Subscription.consume`).
   */
  drainMs?: number;
  /** What a handler's error means (default {@link defaultErrorPolicy}). */
  onError?: ErrorPolicy;
  /**
   * Called once each answer the consumer sent has its outcome (or failed): e.g. to act on a
   * record only once its accept was applied. What it throws is ignored.
   */
  onAnswer?: (answer: Answer) => void;
}

/** How `Lease.consume` runs the handler, and the queue's settings. */
export interface ConsumeOptions extends QueueOptions, ConsumerOptions {}

/** What a `Lease.consume` did. */
export interface ConsumeStats {
  /** Records handled (accepted). */
  accepted: number;
  /** Handler failures answered with a retry. */
  retried: number;
  /** Records rejected to the dead letter topic. */
  rejected: number;
  /** Records handed back at shutdown, their handlers unfinished after the drain time. */
  handedBack: number;
}

const HANDED_BACK_REASON = "the consumer shut down before handling it";
const STOP = Symbol("stop");

interface Task {
  readonly delivery: Delivery;
  readonly abort: AbortController;
  /** The handler has not returned yet. */
  handling: boolean;
  /** Given up at shutdown: the handler's result is ignored. */
  handedBack: boolean;
  done?: Promise<void>;
}

/**
 * Where a consumer takes its deliveries from: a lease's Deliver, or a subscription's
 * `deliveries` events.
 */
export interface DeliverySource {
  /** The next delivery; done when there are no more. Never called again before it settles. */
  next(): Promise<IteratorResult<Delivery, undefined>>;
  /**
   * Stops taking deliveries as the consumer's shutdown begins, handing back those received
   * but not taken (and any that arrive later: a pending `next()` then yields none).
   */
  pause(): void;
  /** Ends the source once the handlers are done and their answers have landed. */
  close(): void;
  /** How often the running handlers' deliveries are renewed while draining, in ms. */
  readonly renewEveryMs: number;
}

/** The shortest period of the renewals while draining. */
const MIN_RENEW_EVERY_MS = 100;
/** The gateway's default ack deadline. */
const DEFAULT_ACK_DEADLINE_MS = 30_000;

/**
 * A lease consumer's renewals while draining: every third of the lease's TTL (at least 100 ms).
 * With its Deliver closed, these calls on the lease are what keep it alive.
 */
export function leaseRenewEveryMs(ttlMs: number): number {
  return Math.max(ttlMs / 3, MIN_RENEW_EVERY_MS);
}

/**
 * A subscription consumer's renewals while draining: every third of the ack deadline (default
 * 30 s), at most 2 s, at least 100 ms. The open stream keeps the leases; the renewals keep the
 * deliveries' deadlines ahead.
 */
export function subscriptionRenewEveryMs(ackDeadlineMs = DEFAULT_ACK_DEADLINE_MS): number {
  return Math.max(Math.min(ackDeadlineMs / 3, 2_000), MIN_RENEW_EVERY_MS);
}

/** Runs `handler` over the deliveries of a lease whose TTL is `ttlMs`: see `Lease.consume`. */
export async function consume(
  open: (options: QueueOptions) => DeliveryStream,
  ttlMs: number,
  handler: Handler,
  options: ConsumeOptions = {},
): Promise<ConsumeStats> {
  if (options.signal?.aborted) return { accepted: 0, retried: 0, rejected: 0, handedBack: 0 };
  const concurrency = concurrencyOf(options);
  const { concurrency: _c, signal: _s, backoff: _b, drainMs: _d, onError: _e, onAnswer: _a, ...queue } = options;
  const stream = open({ ...queue, maxInFlight: queue.maxInFlight ?? Math.min(concurrency, 10_000) });
  // Closing the Deliver is what stops the deliveries; the lease stays held until released.
  const source: DeliverySource = {
    next: () => stream.next(),
    pause: () => stream.cancel(),
    close: () => {},
    renewEveryMs: leaseRenewEveryMs(ttlMs),
  };
  return runConsumer(source, handler, options);
}

const concurrencyOf = (options: ConsumerOptions) => Math.max(1, Math.floor(options.concurrency ?? 1) || 1);

/**
 * Runs `handler` over `source`'s deliveries until `options.signal` aborts or the source ends;
 * then pauses the source, drains the running handlers (renewing their deliveries every
 * `source.renewEveryMs`), hands back the unfinished ones, and closes the source.
 */
export async function runConsumer(
  source: DeliverySource,
  handler: Handler,
  options: ConsumerOptions = {},
): Promise<ConsumeStats> {
  const concurrency = concurrencyOf(options);
  const initialMs = options.backoff?.initialMs ?? 100;
  const maxMs = options.backoff?.maxMs ?? 30_000;
  const drainMs = options.drainMs ?? 10_000;
  const policy = options.onError;
  const onAnswer = options.onAnswer;
  const backoff = (attempt: number) =>
    Math.min(initialMs * 2 ** Math.min(Math.max(attempt - 1, 0), 20), maxMs, MAX_RETRY_DELAY_MS);
  const stats: ConsumeStats = { accepted: 0, retried: 0, rejected: 0, handedBack: 0 };
  const signal = options.signal;
  if (signal?.aborted) {
    source.pause();
    source.close();
    return stats;
  }

  const running = new Set<Task>();
  let wake: (() => void) | undefined;
  const slotFreed = () => new Promise<void>((resolve) => (wake = resolve));

  let onAbort: (() => void) | undefined;
  const stopped = new Promise<typeof STOP>((resolve) => {
    onAbort = () => resolve(STOP);
    signal?.addEventListener("abort", onAbort, { once: true });
  });

  const decide = (error: unknown, delivery: Delivery): Failure => {
    try {
      return policy?.(error, delivery.record, delivery.attempt) ?? defaultErrorPolicy(error);
    } catch {
      return defaultErrorPolicy(error);
    }
  };

  /** Sends an answer and reports it; its outcome (undefined if it failed). Never rejects. */
  const answer = async (delivery: Delivery, action: Answer["action"], sent: Promise<AckOutcome>) => {
    const { record, topic, partition, attempt } = delivery;
    let report: Answer;
    try {
      report = { action, record, topic, partition, attempt, outcome: await sent };
    } catch (e) {
      report = { action, record, topic, partition, attempt, error: toKafkaLeaseError(e) };
    }
    try {
      onAnswer?.(report);
    } catch {
      // the caller's hook: ignored
    }
    return report.outcome;
  };

  const start = (delivery: Delivery) => {
    const task: Task = { delivery, abort: new AbortController(), handling: true, handedBack: false };
    const context: HandlerContext = {
      topic: delivery.topic,
      partition: delivery.partition,
      attempt: delivery.attempt,
      deadline: delivery.deadline,
      signal: task.abort.signal,
      renew: () => delivery.renew(),
    };
    running.add(task);
    task.done = (async () => {
      let failure: Failure | undefined;
      try {
        await handler(delivery.record, context);
      } catch (e) {
        failure = decide(e, delivery);
      }
      task.handling = false;
      if (task.handedBack) return;
      // A lost answer costs a redelivery after the deadline, never a record: nothing to do.
      if (failure === undefined) {
        stats.accepted++;
        await answer(delivery, "accept", delivery.accept());
      } else if (failure.action === "reject") {
        stats.rejected++;
        await answer(delivery, "reject", delivery.reject(failure.reason ?? ""));
      } else {
        stats.retried++;
        const delay = Math.min(Math.max(failure.delayMs ?? backoff(delivery.attempt), 0), MAX_RETRY_DELAY_MS);
        await answer(delivery, "retry", delivery.retry(delay, failure.reason ?? ""));
      }
    })().finally(() => {
      running.delete(task);
      wake?.();
    });
  };

  let failure: KafkaLeaseError | undefined;
  let pending: Promise<IteratorResult<Delivery, undefined>> | undefined;
  try {
    for (;;) {
      if (running.size >= concurrency) {
        if ((await Promise.race([slotFreed(), stopped])) === STOP) break;
        continue;
      }
      pending ??= source.next();
      const next = await Promise.race([pending, stopped]);
      if (next === STOP) break;
      pending = undefined;
      if (next.done) break;
      start(next.value);
    }
  } catch (e) {
    failure = toKafkaLeaseError(e);
    pending = undefined;
  } finally {
    if (onAbort !== undefined) signal?.removeEventListener("abort", onAbort);
  }

  // Shutdown: take no more deliveries (those received and not started go back at once).
  source.pause();
  // A delivery the source yielded as the shutdown won the race goes back too.
  const late = pending?.then(
    (item) => {
      if (!item.done) handBack([item.value]);
    },
    () => {},
  );
  // Running handlers get the drain time, their deliveries renewed meanwhile (for a lease, whose
  // Deliver is closed now, that is what keeps it alive); then the records of those still
  // running go back.
  const drained = new AbortController();
  const renewing = setInterval(() => {
    for (const task of running) {
      // Only those not answered yet; a lost renewal costs nothing.
      if (task.handling && !task.handedBack) task.delivery.renew().catch(() => {});
    }
  }, Math.max(source.renewEveryMs, MIN_RENEW_EVERY_MS));
  try {
    await Promise.race([Promise.all([...running].map((t) => t.done)), sleep(drainMs, drained.signal)]);
  } finally {
    clearInterval(renewing);
    drained.abort();
  }
  const handbacks: Promise<void>[] = [];
  const answering: Promise<void>[] = [];
  for (const task of running) {
    if (task.handling) {
      task.handedBack = true;
      task.abort.abort();
      const d = task.delivery;
      handbacks.push(answer(d, "handBack", d.retry(0, HANDED_BACK_REASON)).then((outcome) => {
        if (outcome !== undefined) stats.handedBack++;
      }));
    } else if (task.done !== undefined) {
      answering.push(task.done);
    }
  }
  await Promise.all([...handbacks, ...answering]);
  // Only now, the answers having landed, the source ends (a subscription's member leaves).
  source.close();
  await late;
  if (failure !== undefined) throw failure;
  return stats;
}
