package io.github.kafkalease.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * One channel at the scale the gateway allows (issue 31), against the live gateway at
 * KAFKA_LEASE_ADDR: one client (one gRPC channel, one connection) holds 1,000 leases with a
 * Read open on each and has 500 Acquires waiting for held partitions; a Commit, a Seek, a
 * ListLeases and a Release through the same client still answer within {@link #SHORT_CALL}.
 *
 * <p>grpc-java (Netty) sets no cap of its own on the streams of a channel: it keeps to the
 * gateway's SETTINGS_MAX_CONCURRENT_STREAMS (buffering streams past it), which leaves short calls
 * room past the long ones. A RecordStream holds no thread (the async stub feeds it); a waiting
 * Acquire blocks its caller's thread, so the waiters take 500 threads. Takes 10 to 15 s.
 */
@Timeout(300)
@ExtendWith(Progress.class)
class OneChannelTest {
  /** Groups leasing every partition of the scale topic (250): 4 x 250 = 1,000 leases. */
  private static final int GROUPS = 4;

  /** Acquires waiting for held partitions, on the same client. */
  private static final int WAITERS = 500;

  /** How long a short call is given on the full channel: far beyond its usual milliseconds. */
  private static final Duration SHORT_CALL = Duration.ofSeconds(10);

  private record Key(String group, int partition) {}

  /** The sum of a metric's series on the gateway's Prometheus endpoint. */
  private static double scrapeMetric(String url, String name) throws Exception {
    HttpResponse<String> response =
        HttpClient.newHttpClient()
            .send(
                HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(10)).build(),
                HttpResponse.BodyHandlers.ofString());
    double sum = 0;
    for (String line : response.body().split("\n")) {
      int space = line.lastIndexOf(' ');
      if (line.startsWith("#") || space < 0) {
        continue;
      }
      if (line.substring(0, space).split("\\{", 2)[0].equals(name)) {
        sum += Double.parseDouble(line.substring(space + 1));
      }
    }
    return sum;
  }

  /** Runs a short call, failing unless it answers within SHORT_CALL; its latency in ms. */
  private static double timed(String what, Supplier<Object> call) {
    long started = System.nanoTime();
    assertTimeoutPreemptively(SHORT_CALL, call::get, what + " on the full channel");
    return (System.nanoTime() - started) / 1e6;
  }

  private static <T> List<T> all(List<Future<T>> futures) throws InterruptedException {
    List<T> out = new ArrayList<>();
    for (Future<T> f : futures) {
      try {
        out.add(f.get());
      } catch (ExecutionException e) {
        fail(e.getCause());
      }
    }
    return out;
  }

  @Test
  void oneChannelCarriesLongCallsAndShortCallsAnswer() throws Exception {
    Fixture fx = Fixture.load();
    assertNotNull(fx.scaleTopic, "the fixture has no scale topic: run it through tests/clients.rs");
    long started = System.nanoTime();
    List<Key> keys = new ArrayList<>();
    for (int g = 0; g < GROUPS; g++) {
      String group = fx.freshGroup();
      for (int p = 0; p < fx.scalePartitions; p++) {
        keys.add(new Key(group, p));
      }
    }
    ExecutorService pool = Executors.newFixedThreadPool(32);
    ExecutorService waitingPool = Executors.newFixedThreadPool(WAITERS);
    List<RecordStream> streams = new ArrayList<>();
    try (KafkaLeaseClient client = KafkaLeaseClient.connect(fx.addr)) {
      List<Future<Lease>> acquiring = new ArrayList<>();
      for (Key k : keys) {
        acquiring.add(
            pool.submit(
                () ->
                    client.acquire(
                        AcquireOptions.of(k.group(), fx.scaleTopic)
                            .partition(k.partition())
                            .ttl(Duration.ofMinutes(1))
                            .member("java-scale"))));
      }
      List<Lease> leases = all(acquiring);
      System.out.printf(
          "[java] %d leases acquired in %d ms%n", leases.size(), (System.nanoTime() - started) / 1_000_000);

      // A Read open on each, through the client's RecordStream: each hands out the
      // partition's record at offset 0 (so it is open at the gateway), then stays open.
      long readsStarted = System.nanoTime();
      for (Lease lease : leases) {
        streams.add(lease.records());
      }
      long readsDeadline = readsStarted + TimeUnit.MINUTES.toNanos(1);
      for (int i = 0; i < streams.size(); i++) {
        Duration left = Duration.ofNanos(Math.max(0, readsDeadline - System.nanoTime()));
        ConsumedRecord first = streams.get(i).poll(left);
        assertNotNull(first, "the Read of lease " + i + " had no record within a minute");
        assertEquals(0, first.offset(), "the Read of lease " + i + " starts at offset 0");
      }
      System.out.printf(
          "[java] %d Reads open (each with its first record) in %d ms%n",
          streams.size(), (System.nanoTime() - readsStarted) / 1_000_000);

      // 500 Acquires waiting for the first 500 leases' partitions, through the same client.
      long waitersStarted = System.nanoTime();
      List<Future<Lease>> waiters = new ArrayList<>();
      for (Key k : keys.subList(0, WAITERS)) {
        waiters.add(
            waitingPool.submit(
                () ->
                    client.acquire(
                        AcquireOptions.of(k.group(), fx.scaleTopic)
                            .partition(k.partition())
                            .waitFor(Duration.ofMinutes(2))
                            .retry(1, Duration.ZERO))));
      }
      double waiting = 0;
      long waitDeadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(1);
      while ((waiting = scrapeMetric(fx.metricsUrl, "kafka_lease_acquires_waiting")) < WAITERS) {
        assertTrue(System.nanoTime() < waitDeadline, "only " + waiting + " Acquires wait at the gateway");
        Thread.sleep(100);
      }
      System.out.printf(
          "[java] %.0f Acquires waiting after %d ms%n",
          waiting, (System.nanoTime() - waitersStarted) / 1_000_000);

      // The short calls, on a lease of the last group (nobody waits for it), its Read open.
      Lease probe = leases.get(leases.size() - 1);
      RecordStream probeStream = streams.get(streams.size() - 1);
      double commit = timed("Commit", () -> { probe.commit(1); return null; });
      double seek = timed("Seek", () -> probe.seek(SeekTo.earliest()));
      List<Object> listed = new ArrayList<>();
      double list = timed("ListLeases", () -> listed.addAll(client.listLeases(probe.group())));
      assertEquals(fx.scalePartitions, listed.size(), "the probe's group's leases");
      double release = timed("Release", () -> { probe.release(); return null; });
      System.out.printf(
          "[java] one channel with %d Reads and %d waiting Acquires: Commit %.1f ms, Seek %.1f ms,"
              + " ListLeases %.1f ms, Release %.1f ms%n",
          streams.size(), WAITERS, commit, seek, list, release);
      // The released lease's Read ends (after the sought record 0 again); nothing else did.
      ConsumedRecord again = probeStream.poll(SHORT_CALL);
      if (again != null) {
        assertEquals(0, again.offset());
        assertNull(probeStream.poll(SHORT_CALL), "the released lease's Read ends");
      }
      assertTrue(probeStream.isDone(), "the released lease's Read ended");
      for (Future<Lease> w : waiters) {
        assertFalse(w.isDone(), "a waiting Acquire ended");
      }
      for (RecordStream stream : streams.subList(0, streams.size() - 1)) {
        assertNull(stream.poll(Duration.ZERO), "nothing more on a Read");
        assertFalse(stream.isDone(), "a Read ended");
      }

      // Done: the waiters cancelled (interrupted), every Read closed, every lease released.
      waitingPool.shutdownNow();
      assertTrue(waitingPool.awaitTermination(30, TimeUnit.SECONDS), "the waiters ended");
      for (RecordStream stream : streams) {
        stream.close();
      }
      List<Future<Object>> releasing = new ArrayList<>();
      for (Lease lease : leases.subList(0, leases.size() - 1)) {
        releasing.add(pool.submit(() -> { lease.release(); return null; }));
      }
      all(releasing);
    } finally {
      waitingPool.shutdownNow();
      pool.shutdownNow();
      for (RecordStream stream : streams) {
        stream.close();
      }
    }
    System.out.printf("[java] test took %d ms%n", (System.nanoTime() - started) / 1_000_000);
  }
}
