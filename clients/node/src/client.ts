// The connection to a gateway: acquiring leases, subscribing, listing.
import { type ChannelCredentials, type ClientOptions, credentials as grpcCredentials } from "@grpc/grpc-js";
import { Code, type KafkaLeaseError, toKafkaLeaseError } from "./errors";
import {
  type LeaseInfo,
  type MemberInfo,
  OffsetReset,
  PartitionLeaseServiceClient,
  type SubscribeRequest,
} from "./gen/kafka_lease/v1/partition_lease";
import { type CallOpts, msToDuration, sleep, unary } from "./convert";
import { Lease } from "./lease";
import { type SubscribeQueueOptions, queueSettings } from "./queue";
import { Subscription } from "./subscription";

/**
 * The largest response accepted by default: 64 MiB. grpc-js's own default (4 MiB) is too small
 * for the gateway's largest batches (a single record larger than max_bytes comes alone).
 */
export const DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH = 64 * 1024 * 1024;

export interface ConnectOptions {
  /** Default: plaintext (`credentials.createInsecure()`). */
  credentials?: ChannelCredentials;
  /** grpc-js channel options, over the client's defaults. */
  channelOptions?: Partial<ClientOptions>;
}

/** Where a lease starts when the group has no committed offset (default "earliest"). */
export type Reset = "earliest" | "latest";

export interface AcquireOptions {
  group: string;
  topic: string;
  /** The partition to lease; absent: the gateway picks a free one. */
  partition?: number;
  /** A label shown in ListLeases and in other clients' PARTITION_BUSY errors. */
  member?: string;
  /** Gateway default 10 s; allowed 1 s ..= 5 min. */
  ttlMs?: number;
  /** How long to wait for the partition to become free (gateway default 0). */
  waitMs?: number;
  offsetReset?: Reset;
  /**
   * Retries on UNAVAILABLE when the gateway attached RetryInfo, waiting its retry delay: at
   * most `attempts` calls in all (default 5) and no retry past `deadlineMs` (default 30 s).
   */
  retry?: { attempts?: number; deadlineMs?: number };
}

export interface SubscribeOptions {
  group: string;
  topics: string[];
  /** A stable member id; empty: the gateway makes one up (`Subscription.memberId`). */
  memberId?: string;
  member?: string;
  maxRecords?: number;
  /** Most bytes per records event of one lease (gateway default 1 MiB; at most 4 MiB). A bound:
   * the gateway sends at most 256 KiB of records per event whatever this allows. */
  maxBytes?: number;
  maxWaitMs?: number;
  offsetReset?: Reset;
  /** The most partitions of each topic this member holds (0: no cap). */
  maxPartitions?: number;
  /** How long a revoked lease waits for this member's commit (gateway default 5 s). */
  revokeGraceMs?: number;
  /**
   * How long the member keeps its leases after its stream ends (default 0; at most 5 min). Also
   * how long a subscription whose stream broke keeps subscribing again by itself: with 0 (the
   * default) it does not, and a break ends it.
   */
  sessionGraceMs?: number;
  /** Subscribe again by itself after a break, within `sessionGraceMs` (default true). */
  resubscribe?: boolean;
  /** Called before each attempt to subscribe again, with what broke the stream (or the last attempt). */
  onResubscribe?: (cause: KafkaLeaseError, attempt: number) => void;
  /**
   * Queue mode for every lease the member is assigned: `deliveries` events instead of
   * `records`, each delivery answered on its own, the gateway committing (see
   * `Subscription.consume`). `maxInFlight` and `maxInFlightBytes` are shared by the member's
   * leases; `deadLetterTopic` serves every topic (default `dlq.<group>.<topic>` per topic, each
   * of which must exist when the Subscribe starts).
   */
  queue?: SubscribeQueueOptions;
}

function reset(r: Reset | undefined): OffsetReset {
  return r === "latest" ? OffsetReset.OFFSET_RESET_LATEST : r === "earliest" ? OffsetReset.OFFSET_RESET_EARLIEST : 0;
}

const optionalDuration = (ms: number | undefined) => (ms === undefined ? undefined : msToDuration(ms));

/** A connection to a kafka-lease gateway (one HTTP/2 channel). */
export class Client {
  /** Wraps a generated client (to reuse its channel and options). */
  constructor(readonly raw: PartitionLeaseServiceClient) {}

  /** Connects (lazily) to `address`, e.g. "127.0.0.1:50051". */
  static connect(address: string, options: ConnectOptions = {}): Client {
    const channelOptions = {
      "grpc.max_receive_message_length": DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH,
      ...options.channelOptions,
    };
    const creds = options.credentials ?? grpcCredentials.createInsecure();
    return new Client(new PartitionLeaseServiceClient(address, creds, channelOptions));
  }

  /** Closes the channel. */
  close(): void {
    this.raw.close();
  }

  /** Takes an exclusive lease on a partition, retrying as {@link AcquireOptions.retry} says. */
  async acquire(options: AcquireOptions, callOptions?: CallOpts): Promise<Lease> {
    const request = {
      group: options.group,
      topic: options.topic,
      partition: options.partition,
      member: options.member ?? "",
      ttl: optionalDuration(options.ttlMs),
      wait: optionalDuration(options.waitMs),
      offsetReset: reset(options.offsetReset),
    };
    const attempts = options.retry?.attempts ?? 5;
    const deadline = Date.now() + (options.retry?.deadlineMs ?? 30_000);
    for (let attempt = 1; ; attempt++) {
      try {
        const response = await unary(this.raw.acquire.bind(this.raw), request, callOptions);
        return new Lease(this.raw, response, options.group, options.ttlMs);
      } catch (e) {
        const error = toKafkaLeaseError(e);
        const delay = error.retryAfterMs;
        const retry =
          error.code === Code.UNAVAILABLE && delay !== undefined && attempt < attempts && Date.now() + delay <= deadline;
        if (!retry) throw error;
        await sleep(delay);
      }
    }
  }

  /**
   * Joins a group as a member for some topics; resolves once the member has joined. With a
   * `sessionGraceMs`, the subscription comes back by itself after its stream broke (see
   * {@link Subscription}).
   */
  async subscribe(options: SubscribeOptions, callOptions?: CallOpts): Promise<Subscription> {
    const request: SubscribeRequest = {
      group: options.group,
      topics: options.topics,
      member: options.member ?? "",
      memberId: options.memberId ?? "",
      maxRecords: options.maxRecords ?? 0,
      maxBytes: options.maxBytes ?? 0,
      maxWait: optionalDuration(options.maxWaitMs),
      offsetReset: reset(options.offsetReset),
      maxPartitions: options.maxPartitions ?? 0,
      revokeGrace: optionalDuration(options.revokeGraceMs),
      sessionGrace: optionalDuration(options.sessionGraceMs),
      queue: options.queue === undefined ? undefined : queueSettings(options.queue),
    };
    const graceMs = options.sessionGraceMs ?? 0;
    const resubscribe =
      options.resubscribe === false || !(graceMs > 0)
        ? undefined
        : {
            // The same settings, under the member id `joined` gave (the caller's, or the gateway's).
            open: (memberId: string) => this.raw.subscribe({ ...request, memberId }, callOptions),
            graceMs,
            onResubscribe: options.onResubscribe,
          };
    const call = this.raw.subscribe(request, callOptions);
    return Subscription.open(this.raw, call, resubscribe, options.queue?.ackDeadlineMs);
  }

  /** The members subscribed to `group` (or only to `topic`), across every gateway instance. */
  async listMembers(group: string, topic?: string, callOptions?: CallOpts): Promise<MemberInfo[]> {
    return (await unary(this.raw.listMembers.bind(this.raw), { group, topic }, callOptions)).members;
  }

  /** Every held lease (all pages), optionally of one group and/or topic. */
  async listLeases(filter: { group?: string; topic?: string } = {}, callOptions?: CallOpts): Promise<LeaseInfo[]> {
    const all: LeaseInfo[] = [];
    let pageToken = "";
    do {
      const request = { group: filter.group, topic: filter.topic, pageSize: 0, pageToken };
      const page = await unary(this.raw.listLeases.bind(this.raw), request, callOptions);
      all.push(...page.leases);
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    return all;
  }
}
