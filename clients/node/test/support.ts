// Helpers of the gateway tests: the fixture, fresh group names, bounded waits, a TCP relay.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import * as net from "node:net";
import { setTimeout as delay } from "node:timers/promises";

export interface FixtureRecord {
  partition: number;
  offset: number;
  key_hex: string | null;
  value_hex: string | null;
  headers: { key: string; value_hex: string | null }[];
  timestamp_ms: number;
}

export interface Fixture {
  group: string;
  topic: string;
  partitions: number;
  missing_topic: string;
  records: FixtureRecord[];
  /** A topic with one record (offset 0) in each partition, for the one-channel test. */
  scale: { topic: string; partitions: number };
  /**
   * Queue mode's topic: partition 0 holds `records` records, key `k<i % keys>` and value `v<i>`,
   * except the one at `poison_offset`, whose value is `poison`; and its dead letter topic.
   */
  queue: { topic: string; dead_letter_topic: string; records: number; keys: number; poison_offset: number };
  /** The gateway's Prometheus endpoint. */
  metrics_url: string;
}

function required(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the tests through test.sh with a gateway`);
  return value;
}

export const ADDR = required("KAFKA_LEASE_ADDR");
export const FIXTURE: Fixture = JSON.parse(readFileSync(required("KAFKA_LEASE_FIXTURE"), "utf8"));

/** The fixture's records of one partition, in offset order. */
export function fixtureRecords(partition: number): FixtureRecord[] {
  return FIXTURE.records.filter((r) => r.partition === partition).sort((a, b) => a.offset - b.offset);
}

/** A group nobody used: commits persist in Kafka, so every test takes its own. */
export function freshGroup(suffix = ""): string {
  return `${FIXTURE.group}-${suffix}${randomBytes(6).toString("hex")}`;
}

export function hex(bytes: Buffer | null): string | null {
  return bytes === null ? null : bytes.toString("hex");
}

/** `promise`, or a rejection naming `what` after `ms`. */
export async function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  const timeout = new AbortController();
  try {
    return await Promise.race([
      promise,
      delay(ms, undefined, { signal: timeout.signal }).then(() => {
        throw new Error(`timed out after ${ms} ms waiting for ${what}`);
      }),
    ]);
  } finally {
    timeout.abort();
  }
}

/** Polls `check` every 100 ms until it returns a value other than undefined, for at most `ms`. */
export async function pollUntil<T>(ms: number, what: string, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await delay(100);
  }
}

/** A TCP relay to the gateway whose connections can all be cut while it keeps accepting. */
export class Relay {
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();
  cuts = 0;

  private constructor(server: net.Server) {
    this.#server = server;
  }

  static async start(target: string): Promise<Relay> {
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    const relay: Relay = new Relay(
      net.createServer((client) => {
        const upstream = net.connect(port, host);
        for (const s of [client, upstream]) {
          relay.#sockets.add(s);
          s.on("close", () => relay.#sockets.delete(s));
          s.on("error", () => {});
        }
        client.pipe(upstream).on("error", () => {});
        upstream.pipe(client).on("error", () => {});
        client.on("close", () => upstream.destroy());
        upstream.on("close", () => client.destroy());
      }),
    );
    await new Promise<void>((resolve) => relay.#server.listen(0, "127.0.0.1", resolve));
    return relay;
  }

  get address(): string {
    return `127.0.0.1:${(this.#server.address() as net.AddressInfo).port}`;
  }

  /** Closes every open connection at once (the listener stays up). Returns how many were cut. */
  cut(): number {
    const n = this.#sockets.size;
    for (const s of this.#sockets) s.destroy();
    this.cuts += n;
    return n;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
