package kafkalease_test

// One channel at the scale the gateway allows (issue 31), against a real gateway.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
)

const (
	// Groups leasing every partition of the fixture's scale topic (250): 4 x 250 = 1,000
	// leases, the most one connection may hold (the gateway's --max-leases-per-connection).
	scaleGroups = 4
	// Acquires waiting for held partitions, on the same channel.
	scaleWaiters = 500
	// How long a short call is given on the full channel: far beyond its usual milliseconds.
	shortCall = 10 * time.Second
)

// scrapeMetric sums the series of a metric on the gateway's Prometheus endpoint.
func scrapeMetric(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	sum := 0.0
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.SplitN(line[:i], "{", 2)[0] != name {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			sum += v
		}
	}
	return sum, lines.Err()
}

// One client (one gRPC channel, one connection) holds 1,000 leases with a Read open on each
// and has 500 Acquires waiting for held partitions; a Commit, a Seek, a ListLeases and a
// Release through the same client still answer within shortCall. grpc-go sets no cap of
// its own on the streams of a connection: it keeps to the gateway's
// SETTINGS_MAX_CONCURRENT_STREAMS, which leaves short calls room past the long ones. Against
// a gateway with the old limit (200 streams, 150 long calls) the 151st Read is refused
// RESOURCE_EXHAUSTED. Takes 5 to 15 s.
func TestOneChannelCarriesLongCallsAndShortCallsAnswer(t *testing.T) {
	client, fx, _ := live(t)
	if fx.Scale.Topic == "" || fx.MetricsURL == "" {
		t.Fatal("the fixture has no scale topic or metrics_url: run it through tests/clients.rs")
	}
	ctx := testContext(t, 4*time.Minute)
	started := time.Now()
	type key struct {
		group     string
		partition int32
	}
	var keys []key
	for g := 0; g < scaleGroups; g++ {
		group := fx.freshGroup()
		for p := 0; p < fx.Scale.Partitions; p++ {
			keys = append(keys, key{group, int32(p)})
		}
	}

	// 1,000 leases, 32 Acquires at a time.
	leases := make([]*kafkalease.Lease, len(keys))
	errs := make(chan error, len(keys))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			lease, err := client.Acquire(ctx, k.group, fx.Scale.Topic, kafkalease.AcquireOptions{
				Partition: kafkalease.Ptr(k.partition), TTL: time.Minute, Member: "go-scale",
			})
			if err != nil {
				errs <- fmt.Errorf("acquire %s/%d: %w", k.group, k.partition, err)
				return
			}
			leases[i] = lease
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d leases acquired in %v", len(leases), time.Since(started).Round(time.Millisecond))

	// A Read open on each, through the client's record iterator: each hands out the
	// partition's record at offset 0 (so it is open at the gateway), then stays open. A
	// Read's error, or its end, is reported on ended.
	readsStarted := time.Now()
	readCtx, stopReads := context.WithCancel(ctx)
	defer stopReads()
	first := make(chan error, len(leases))
	ended := make([]chan error, len(leases))
	for i, lease := range leases {
		ended[i] = make(chan error, 1)
		go func() {
			got := false
			for rec, err := range lease.Records(readCtx, kafkalease.ReadOptions{}) {
				if err != nil {
					if !got {
						first <- fmt.Errorf("the Read of %s: %w", lease, err)
					}
					ended[i] <- err
					return
				}
				if !got {
					got = true
					if rec.Offset != 0 {
						first <- fmt.Errorf("the Read of %s started at offset %d", lease, rec.Offset)
					} else {
						first <- nil
					}
				}
			}
			if !got {
				first <- fmt.Errorf("the Read of %s ended before its first record", lease)
			}
			ended[i] <- nil
		}()
	}
	firstDeadline := time.After(time.Minute)
	for n := 0; n < len(leases); n++ {
		select {
		case err := <-first:
			if err != nil {
				t.Fatalf("after %d Reads had their first record: %v", n, err)
			}
		case <-firstDeadline:
			t.Fatalf("only %d of %d Reads had their first record within a minute", n, len(leases))
		}
	}
	t.Logf("%d Reads open (each with its first record) in %v", len(leases), time.Since(readsStarted).Round(time.Millisecond))

	// 500 Acquires waiting for the first 500 leases' partitions, on the same client.
	waitersStarted := time.Now()
	waitCtx, stopWaiters := context.WithCancel(ctx)
	defer stopWaiters()
	waited := make(chan error, scaleWaiters)
	for _, k := range keys[:scaleWaiters] {
		go func() {
			lease, err := client.Acquire(waitCtx, k.group, fx.Scale.Topic, kafkalease.AcquireOptions{
				Partition: kafkalease.Ptr(k.partition), Wait: 2 * time.Minute, MaxAttempts: 1,
			})
			if err == nil {
				err = fmt.Errorf("%s was granted while held", lease)
			}
			waited <- err
		}()
	}
	var waiting float64
	eventually(t, "every Acquire to wait at the gateway", time.Minute, func() bool {
		n, err := scrapeMetric(ctx, fx.MetricsURL, "kafka_lease_acquires_waiting")
		if err != nil {
			t.Fatalf("metrics: %v", err)
		}
		waiting = n
		return n >= scaleWaiters
	})
	t.Logf("%v Acquires waiting after %v", waiting, time.Since(waitersStarted).Round(time.Millisecond))

	// The short calls, on a lease of the last group (nobody waits for it) with its Read open.
	probe := len(leases) - 1
	lease := leases[probe]
	timed := func(what string, call func(ctx context.Context) error) time.Duration {
		t.Helper()
		callCtx, cancel := context.WithTimeout(ctx, shortCall)
		defer cancel()
		start := time.Now()
		if err := call(callCtx); err != nil {
			t.Fatalf("%s on a channel with %d Reads and %d waiting Acquires: %v", what, len(leases), scaleWaiters, err)
		}
		return time.Since(start)
	}
	commit := timed("Commit", func(ctx context.Context) error { return lease.Commit(ctx, 1) })
	seek := timed("Seek", func(ctx context.Context) error {
		res, err := lease.Seek(ctx, kafkalease.SeekEarliest())
		if err == nil && res.Offset != 0 {
			err = fmt.Errorf("resolved to offset %d, want 0", res.Offset)
		}
		return err
	})
	list := timed("ListLeases", func(ctx context.Context) error {
		listed, err := client.ListLeases(ctx, lease.Group, "")
		if err == nil && len(listed) != fx.Scale.Partitions {
			err = fmt.Errorf("%d leases listed, want %d", len(listed), fx.Scale.Partitions)
		}
		return err
	})
	release := timed("Release", func(ctx context.Context) error { return lease.Release(ctx) })
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	t.Logf("one channel with %d Reads and %d waiting Acquires: Commit %s, Seek %s, ListLeases %s, Release %s",
		len(leases), scaleWaiters, ms(commit), ms(seek), ms(list), ms(release))
	select {
	case err := <-ended[probe]:
		if err != nil {
			t.Fatalf("the released lease's Read ended with %v", err)
		}
	case <-time.After(shortCall):
		t.Fatalf("the released lease's Read did not end within %v", shortCall)
	}
	select {
	case err := <-waited:
		t.Fatalf("a waiting Acquire ended: %v", err)
	default:
	}
	for i := range leases[:probe] {
		select {
		case err := <-ended[i]:
			t.Fatalf("the Read of %s ended: %v", leases[i], err)
		default:
		}
	}

	// Done: the waiters cancelled, then every lease released (their Reads end with no error).
	stopWaiters()
	for range scaleWaiters {
		<-waited
	}
	var failed atomic.Int32
	for _, lease := range leases[:probe] {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := lease.Release(ctx); err != nil {
				failed.Add(1)
				t.Errorf("release %s: %v", lease, err)
			}
		}()
	}
	wg.Wait()
	for i := range leases[:probe] {
		if err := <-ended[i]; err != nil && failed.Load() == 0 {
			t.Errorf("the Read of %s ended with %v after its release", leases[i], err)
		}
	}
	t.Logf("test took %v", time.Since(started).Round(time.Millisecond))
}
