package io.github.kafkalease.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.junit.jupiter.api.Assumptions;

/** The gateway address and the fixture records (KAFKA_LEASE_ADDR, KAFKA_LEASE_FIXTURE). */
final class Fixture {
  record Header(String key, byte[] value) {}

  record Rec(int partition, long offset, byte[] key, byte[] value, List<Header> headers, long ts) {}

  final String addr;
  final String group;
  final String topic;
  final String missingTopic;
  final int partitions;
  final List<Rec> records = new ArrayList<>();
  /** A topic with one record (offset 0) in each partition, for the one-channel test. */
  final String scaleTopic;
  final int scalePartitions;
  /** The gateway's Prometheus endpoint. */
  final String metricsUrl;
  /**
   * The queue-mode topic: partition 0 holds {@code queueRecords} records, key {@code k<i % keys>},
   * value {@code v<i>}, except the one at {@code poisonOffset}, whose value is {@code poison};
   * its dead letter topic exists. Null when the fixture has none.
   */
  final String queueTopic;
  final String deadLetterTopic;
  final int queueRecords;
  final int queueKeys;
  final long poisonOffset;

  private Fixture(String addr, Map<String, Object> json) {
    this.addr = addr;
    this.group = (String) json.get("group");
    this.topic = (String) json.get("topic");
    this.missingTopic = (String) json.get("missing_topic");
    this.partitions = ((Number) json.get("partitions")).intValue();
    Map<?, ?> scale = (Map<?, ?>) json.get("scale");
    this.scaleTopic = scale == null ? null : (String) scale.get("topic");
    this.scalePartitions = scale == null ? 0 : ((Number) scale.get("partitions")).intValue();
    this.metricsUrl = (String) json.get("metrics_url");
    Map<?, ?> queue = (Map<?, ?>) json.get("queue");
    this.queueTopic = queue == null ? null : (String) queue.get("topic");
    this.deadLetterTopic = queue == null ? null : (String) queue.get("dead_letter_topic");
    this.queueRecords = queue == null ? 0 : ((Number) queue.get("records")).intValue();
    this.queueKeys = queue == null ? 0 : ((Number) queue.get("keys")).intValue();
    this.poisonOffset = queue == null ? -1 : ((Number) queue.get("poison_offset")).longValue();
    for (Object o : (List<?>) json.get("records")) {
      Map<?, ?> r = (Map<?, ?>) o;
      List<Header> headers = new ArrayList<>();
      for (Object h : (List<?>) r.get("headers")) {
        Map<?, ?> hm = (Map<?, ?>) h;
        headers.add(new Header((String) hm.get("key"), hex(hm.get("value_hex"))));
      }
      records.add(
          new Rec(
              ((Number) r.get("partition")).intValue(),
              ((Number) r.get("offset")).longValue(),
              hex(r.get("key_hex")),
              hex(r.get("value_hex")),
              headers,
              ((Number) r.get("timestamp_ms")).longValue()));
    }
  }

  /** The fixture, or the test is skipped (with a message) when the environment lacks it. */
  @SuppressWarnings("unchecked")
  static Fixture load() {
    String addr = System.getenv("KAFKA_LEASE_ADDR");
    String path = System.getenv("KAFKA_LEASE_FIXTURE");
    Assumptions.assumeTrue(
        addr != null && !addr.isEmpty() && path != null && !path.isEmpty(),
        "KAFKA_LEASE_ADDR and KAFKA_LEASE_FIXTURE are not set: no gateway to test against");
    try {
      return new Fixture(addr, (Map<String, Object>) new Json(Files.readString(Path.of(path))).value());
    } catch (IOException e) {
      throw new IllegalStateException("cannot read the fixture " + path, e);
    }
  }

  /** A consumer group no earlier run used (commits persist in Kafka). */
  String freshGroup() {
    return group + "-" + UUID.randomUUID().toString().substring(0, 12);
  }

  List<Rec> partition(int p) {
    return records.stream().filter(r -> r.partition() == p).toList();
  }

  /** Asserts every field of {@code actual} against the fixture record. */
  static void assertRecord(Rec expected, ConsumedRecord actual) {
    String at = "partition " + expected.partition() + " offset " + expected.offset() + ": ";
    assertEquals(expected.offset(), actual.offset(), at + "offset");
    assertArrayEquals(expected.key(), actual.key(), at + "key (null vs empty vs bytes)");
    assertArrayEquals(expected.value(), actual.value(), at + "value (tombstone vs empty)");
    assertEquals(expected.headers().size(), actual.headers().size(), at + "header count");
    for (int i = 0; i < expected.headers().size(); i++) {
      assertEquals(expected.headers().get(i).key(), actual.headers().get(i).key(), at + "header key " + i);
      assertArrayEquals(
          expected.headers().get(i).value(), actual.headers().get(i).value(), at + "header value " + i);
    }
    assertEquals(expected.ts(), actual.timestampMillis(), at + "timestamp");
  }

  private static byte[] hex(Object o) {
    return o == null ? null : HexFormat.of().parseHex((String) o);
  }

  /** Just enough JSON for the fixture: objects, arrays, strings, integers, null, booleans. */
  private static final class Json {
    private final String s;
    private int i;

    Json(String s) {
      this.s = s;
    }

    Object value() {
      skip();
      char c = s.charAt(i);
      if (c == '{') {
        Map<String, Object> m = new LinkedHashMap<>();
        i++;
        skip();
        if (s.charAt(i) == '}') {
          i++;
          return m;
        }
        do {
          skip();
          String k = (String) value();
          skip();
          expect(':');
          m.put(k, value());
          skip();
        } while (s.charAt(i++) == ',');
        return m;
      }
      if (c == '[') {
        List<Object> l = new ArrayList<>();
        i++;
        skip();
        if (s.charAt(i) == ']') {
          i++;
          return l;
        }
        do {
          l.add(value());
          skip();
        } while (s.charAt(i++) == ',');
        return l;
      }
      if (c == '"') {
        StringBuilder b = new StringBuilder();
        for (i++; s.charAt(i) != '"'; i++) {
          char ch = s.charAt(i);
          if (ch == '\\') {
            char e = s.charAt(++i);
            switch (e) {
              case 'n' -> b.append('\n');
              case 't' -> b.append('\t');
              case 'u' -> {
                b.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16));
                i += 4;
              }
              default -> b.append(e);
            }
          } else {
            b.append(ch);
          }
        }
        i++;
        return b.toString();
      }
      for (String lit : new String[] {"null", "true", "false"}) {
        if (s.startsWith(lit, i)) {
          i += lit.length();
          return lit.equals("null") ? null : Boolean.valueOf(lit);
        }
      }
      int start = i;
      while (i < s.length() && "-+0123456789.eE".indexOf(s.charAt(i)) >= 0) {
        i++;
      }
      return Long.parseLong(s.substring(start, i));
    }

    private void skip() {
      while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
        i++;
      }
    }

    private void expect(char c) {
      if (s.charAt(i++) != c) {
        throw new IllegalArgumentException("expected " + c + " at " + (i - 1));
      }
    }
  }
}
