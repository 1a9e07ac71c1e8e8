package kafkalease_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
)

// fixture is the JSON file KAFKA_LEASE_FIXTURE names: a topic with known records.
type fixture struct {
	Group        string          `json:"group"`
	Topic        string          `json:"topic"`
	Partitions   int             `json:"partitions"`
	MissingTopic string          `json:"missing_topic"`
	Records      []fixtureRecord `json:"records"`
	// A topic with one record (offset 0) in each partition, for the one-channel test.
	Scale struct {
		Topic      string `json:"topic"`
		Partitions int    `json:"partitions"`
	} `json:"scale"`
	// A topic for queue mode: partition 0 holds Records records, key "k<i % Keys>" and
	// value "v<i>", except the one at PoisonOffset, whose value is "poison"; and an existing
	// dead letter topic.
	Queue struct {
		Topic           string `json:"topic"`
		DeadLetterTopic string `json:"dead_letter_topic"`
		Records         int    `json:"records"`
		Keys            int    `json:"keys"`
		PoisonOffset    int64  `json:"poison_offset"`
	} `json:"queue"`
	// The gateway's Prometheus endpoint.
	MetricsURL string `json:"metrics_url"`
}

type fixtureRecord struct {
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	KeyHex    *string `json:"key_hex"`
	ValueHex  *string `json:"value_hex"`
	Headers   []struct {
		Key      string  `json:"key"`
		ValueHex *string `json:"value_hex"`
	} `json:"headers"`
	TimestampMs int64 `json:"timestamp_ms"`
}

// live is the gateway and fixture to test against, or a skip saying how to get them.
func live(t *testing.T) (*kafkalease.Client, *fixture, string) {
	t.Helper()
	addr, path := os.Getenv("KAFKA_LEASE_ADDR"), os.Getenv("KAFKA_LEASE_FIXTURE")
	if addr == "" || path == "" {
		t.Skip("KAFKA_LEASE_ADDR and KAFKA_LEASE_FIXTURE are not set: run clients/go/test.sh " +
			"through `cargo test --test clients`, or start a gateway with `cargo test --test clients " +
			"-- --ignored serve_for_client_development` and `source target/tmp/client-dev.env`")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the fixture: %v", err)
	}
	var fx fixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("parse the fixture %s: %v", path, err)
	}
	client, err := kafkalease.NewClient(addr)
	if err != nil {
		t.Fatalf("client for %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client, &fx, addr
}

// partition is the fixture's records of p, in offset order.
func (f *fixture) partition(p int32) []fixtureRecord {
	var out []fixtureRecord
	for _, r := range f.Records {
		if r.Partition == p {
			out = append(out, r)
		}
	}
	return out
}

// freshGroup is a group no earlier run used: commits persist in Kafka.
func (f *fixture) freshGroup() string { return f.Group + "-" + randomSuffix() }

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// unhex decodes a fixture byte field: null stays nil (absent), "" is present and empty.
func unhex(t *testing.T, s *string) []byte {
	t.Helper()
	if s == nil {
		return nil
	}
	b, err := hex.DecodeString(*s)
	if err != nil {
		t.Fatalf("fixture hex %q: %v", *s, err)
	}
	return b
}

// sameBytes compares presence as well as content.
func sameBytes(want, got []byte) bool {
	return (want == nil) == (got == nil) && bytes.Equal(want, got)
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// asError is err as an *Error, or a fatal failure.
func asError(t *testing.T, err error) *kafkalease.Error {
	t.Helper()
	var e *kafkalease.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a *kafkalease.Error, got %T: %v", err, err)
	}
	return e
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, deadline)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// relay is a TCP relay on loopback to a target, whose connections the test can cut while
// it keeps accepting new ones.
type relay struct {
	ln       net.Listener
	target   string
	accepted atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relay listen: %v", err)
	}
	r := &relay{ln: ln, target: target}
	go r.serve()
	t.Cleanup(func() { _ = ln.Close(); r.cut() })
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	for {
		down, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.accepted.Add(1)
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = down.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, down, up)
		r.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(up, down)
		go pipe(down, up)
	}
}

// cut closes every connection made so far.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}
