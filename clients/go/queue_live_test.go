package kafkalease_test

// Queue mode against a real gateway (KAFKA_LEASE_ADDR) with the fixture's queue topic
// (KAFKA_LEASE_FIXTURE); skipped when those are not set.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// queueFixture is the fixture's queue topic, or a skip when the fixture has none.
func queueFixture(t *testing.T, fx *fixture) {
	t.Helper()
	if fx.Queue.Topic == "" || fx.Queue.Records == 0 {
		t.Skip("the fixture has no queue topic")
	}
}

// checkQueueRecord checks a record of the queue topic against the fixture's rule.
func checkQueueRecord(fx *fixture, rec kafkalease.Record) error {
	o := rec.Offset
	wantKey, wantValue := fmt.Sprintf("k%d", o%int64(fx.Queue.Keys)), fmt.Sprintf("v%d", o)
	if o == fx.Queue.PoisonOffset {
		wantValue = "poison"
	}
	if string(rec.Key) != wantKey || string(rec.Value) != wantValue {
		return fmt.Errorf("offset %d: key %q value %q, want %q %q", o, rec.Key, rec.Value, wantKey, wantValue)
	}
	return nil
}

// handling is one call of a handler, in the order they started.
type handling struct {
	offset  int64
	attempt uint32
}

// handlings is a log of handler calls, safe for concurrent use.
type handlings struct {
	mu  sync.Mutex
	log []handling
	bad []error
}

func (h *handlings) add(fx *fixture, d *kafkalease.Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, handling{d.Offset(), d.Attempt})
	if err := checkQueueRecord(fx, d.Record); err != nil {
		h.bad = append(h.bad, err)
	}
}

func (h *handlings) snapshot() []handling {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.log)
}

func (h *handlings) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, err := range h.bad {
		t.Error(err)
	}
}

// queueInfo is the queue of the group's lease on partition 0 of the queue topic, as
// ListLeases shows it (nil if none).
func queueInfo(ctx context.Context, t *testing.T, client *kafkalease.Client, group, topic string) *kafkaleasev1.QueueInfo {
	t.Helper()
	leases, err := client.ListLeases(ctx, group, topic)
	if err != nil {
		t.Fatalf("list leases: %v", err)
	}
	for _, l := range leases {
		if l.GetPartition() == 0 {
			return l.GetQueue()
		}
	}
	return nil
}

type consumed struct {
	stats kafkalease.ConsumeStats
	err   error
}

// background is a Consume running in a goroutine.
type background struct {
	cancel context.CancelFunc
	done   chan consumed
	res    *consumed
}

// consumeInBackground runs lease.Consume until stop is called.
func consumeInBackground(ctx context.Context, lease *kafkalease.Lease, opts kafkalease.ConsumeOptions, handler kafkalease.Handler) *background {
	cctx, cancel := context.WithCancel(ctx)
	b := &background{cancel: cancel, done: make(chan consumed, 1)}
	go func() {
		stats, err := lease.Consume(cctx, opts, handler)
		b.done <- consumed{stats, err}
	}()
	return b
}

// ended reports whether the Consume returned (by itself: an error, or the lease's end).
func (b *background) ended() bool {
	if b.res != nil {
		return true
	}
	select {
	case res := <-b.done:
		b.res = &res
		return true
	default:
		return false
	}
}

// stop cancels the Consume and returns its result.
func (b *background) stop() consumed {
	b.cancel()
	if b.res == nil {
		res := <-b.done
		b.res = &res
	}
	return *b.res
}

// until polls cond until it holds, failing if the Consume ends first or the deadline
// passes.
func (b *background) until(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	eventually(t, what, deadline, func() bool {
		if b.ended() {
			t.Fatalf("%s: the consume ended first: %+v %v", what, b.res.stats, b.res.err)
		}
		return cond()
	})
}

// a. Key order, 3 deliveries at most, a handler failing on the poison record: the 39 others
// are handled once each, in offset order per key; the poison record's key-mates after it
// only after its last attempt; it reaches the dead letter topic; Release commits the
// queue's progress, so the next lease of the group starts after the last record.
func TestQueuePoisonRecordGoesToTheDeadLettersHoldingBackOnlyItsKey(t *testing.T) {
	client, fx, _ := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, 2*time.Minute)
	group := fx.freshGroup()
	lease, err := client.Acquire(ctx, group, q.Topic, kafkalease.AcquireOptions{Partition: p0, Member: "go-queue"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	var h handlings
	opts := kafkalease.ConsumeOptions{
		Queue:       kafkalease.QueueOptions{Ordering: kafkalease.OrderKey, MaxDeliveries: 3, DeadLetterTopic: q.DeadLetterTopic},
		Concurrency: 4,
		Backoff:     50 * time.Millisecond,
	}
	bg := consumeInBackground(ctx, lease, opts, func(_ context.Context, d *kafkalease.Delivery) error {
		h.add(fx, d)
		if string(d.Record.Value) == "poison" {
			return errors.New("cannot handle poison")
		}
		return nil
	})
	bg.until(t, "39 records handled and one dead letter", 60*time.Second, func() bool {
		info := queueInfo(ctx, t, client, group, q.Topic)
		return len(h.snapshot()) >= q.Records-1+3 && info.GetDeadLetters() >= 1
	})
	res := bg.stop()
	if res.err != nil {
		t.Fatalf("consume: %v", res.err)
	}
	if res.stats != (kafkalease.ConsumeStats{Accepted: uint64(q.Records - 1), Retried: 3}) {
		t.Fatalf("stats %+v", res.stats)
	}
	info := queueInfo(ctx, t, client, group, q.Topic)
	if info.GetDeadLetters() != 1 || info.GetOrdering() != kafkalease.OrderKey || info.GetDeadLetterTopic() != q.DeadLetterTopic {
		t.Fatalf("queue %v", info)
	}

	h.check(t)
	log := h.snapshot()
	handled := map[int64][]uint32{}
	lastPoison := -1
	for i, c := range log {
		handled[c.offset] = append(handled[c.offset], c.attempt)
		if c.offset == q.PoisonOffset {
			lastPoison = i
		}
	}
	if fmt.Sprint(handled[q.PoisonOffset]) != "[1 2 3]" {
		t.Fatalf("the poison record's attempts: %v, want [1 2 3]", handled[q.PoisonOffset])
	}
	for o := int64(0); o < int64(q.Records); o++ {
		if o != q.PoisonOffset && fmt.Sprint(handled[o]) != "[1]" {
			t.Errorf("offset %d handled at attempts %v, want once", o, handled[o])
		}
	}
	keys := int64(q.Keys)
	last := map[int64]int64{}
	for i, c := range log {
		k := c.offset % keys
		if prev, ok := last[k]; ok && c.offset < prev {
			t.Errorf("key k%d: offset %d after %d", k, c.offset, prev)
		}
		last[k] = c.offset
		if k == q.PoisonOffset%keys && c.offset > q.PoisonOffset && i < lastPoison {
			t.Errorf("offset %d (key k%d) handled before the poison record's last attempt", c.offset, k)
		}
	}
	// The other keys were not held back: some of their records after the poison one were
	// handled before its last attempt (its retries wait 50 and 100 ms).
	overtook := 0
	for _, c := range log[:lastPoison] {
		if c.offset > q.PoisonOffset && c.offset%keys != q.PoisonOffset%keys {
			overtook++
		}
	}
	if overtook == 0 {
		t.Errorf("no record of another key was handled during the poison record's retries: %v", log)
	}

	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	again, err := client.Acquire(ctx, group, q.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire again: %v", err)
	}
	defer func() { _ = again.Release(context.Background()) }()
	if again.Offset != int64(q.Records) {
		t.Fatalf("the next lease starts at %d, want %d: Release commits the queue's progress", again.Offset, q.Records)
	}
}

// b. At shutdown, handlers still running after the drain time have their records handed
// back: the next Consume gets them again, at attempt 2.
func TestQueueShutdownHandsBackUnfinishedRecords(t *testing.T) {
	client, fx, _ := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, 2*time.Minute)
	lease, err := client.Acquire(ctx, fx.freshGroup(), q.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	drain := 300 * time.Millisecond
	opts := kafkalease.ConsumeOptions{
		Queue:       kafkalease.QueueOptions{Ordering: kafkalease.OrderUnordered, DeadLetterTopic: q.DeadLetterTopic},
		Concurrency: 3,
		Drain:       &drain,
	}
	started := make(chan int64, 10)
	bg := consumeInBackground(ctx, lease, opts, func(hctx context.Context, d *kafkalease.Delivery) error {
		started <- d.Offset()
		<-hctx.Done() // blocks until the drain time runs out
		return hctx.Err()
	})
	var running []int64
	for range 3 {
		select {
		case o := <-started:
			running = append(running, o)
		case <-ctx.Done():
			t.Fatalf("handlers started: %v", running)
		}
	}
	time.Sleep(200 * time.Millisecond) // no fourth: every slot is taken
	res := bg.stop()
	if res.err != nil || res.stats != (kafkalease.ConsumeStats{HandedBack: 3}) || len(started) != 0 {
		t.Fatalf("consume: %+v %v, %d more started; want 3 handed back", res.stats, res.err, len(started))
	}

	var h handlings
	seen := func() map[int64]uint32 {
		m := map[int64]uint32{}
		for _, c := range h.snapshot() {
			m[c.offset] = c.attempt
		}
		return m
	}
	bg = consumeInBackground(ctx, lease, opts, func(_ context.Context, d *kafkalease.Delivery) error {
		h.add(fx, d)
		return nil
	})
	bg.until(t, "the handed back records delivered again", 30*time.Second, func() bool {
		m := seen()
		for _, o := range running {
			if _, ok := m[o]; !ok {
				return false
			}
		}
		return true
	})
	res = bg.stop()
	if res.err != nil {
		t.Fatalf("second consume: %v", res.err)
	}
	h.check(t)
	for o, attempt := range seen() {
		want := uint32(1)
		if slices.Contains(running, o) {
			want = 2
		}
		if attempt != want {
			t.Errorf("offset %d at attempt %d, want %d (handed back: %v)", o, attempt, want, running)
		}
	}
}

// b2. While draining, Consume renews the running handlers' deliveries every third of the
// lease's TTL: with the Deliver closed, those calls are what keep the lease alive. A handler
// that runs for three TTLs after shutdown began still has its accept applied, nothing is
// handed back, and the lease is still held afterwards.
func TestQueueDrainRenewalsKeepTheLeaseAlive(t *testing.T) {
	client, fx, _ := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, time.Minute)
	group := fx.freshGroup()
	ttl := 2 * time.Second
	lease, err := client.Acquire(ctx, group, q.Topic, kafkalease.AcquireOptions{Partition: p0, TTL: ttl})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	if lease.TTL != ttl {
		t.Fatalf("TTL granted %v, want %v", lease.TTL, ttl)
	}
	type answer struct {
		offset  int64
		outcome kafkalease.AckOutcome
		err     error
	}
	accepts := make(chan answer, 10)
	drain := 10 * time.Second
	opts := kafkalease.ConsumeOptions{
		Queue: kafkalease.QueueOptions{DeadLetterTopic: q.DeadLetterTopic},
		Drain: &drain,
		OnAccept: func(d *kafkalease.Delivery, outcome kafkalease.AckOutcome, err error) {
			accepts <- answer{d.Offset(), outcome, err}
		},
	}
	started, shutdown := make(chan int64, 10), make(chan struct{})
	bg := consumeInBackground(ctx, lease, opts, func(hctx context.Context, d *kafkalease.Delivery) error {
		started <- d.Offset()
		<-shutdown
		select { // three TTLs into the drain
		case <-time.After(3 * ttl):
			return nil
		case <-hctx.Done():
			return hctx.Err()
		}
	})
	var first int64
	select {
	case first = <-started:
	case <-ctx.Done():
		t.Fatal("no handler started")
	}
	bg.cancel()
	close(shutdown)
	res := bg.stop()
	if res.err != nil || res.stats != (kafkalease.ConsumeStats{Accepted: 1}) || len(started) != 0 {
		t.Fatalf("consume: %+v %v, %d more started; want 1 accepted, nothing handed back", res.stats, res.err, len(started))
	}
	select {
	case a := <-accepts:
		if a.offset != first || a.err != nil || a.outcome != kafkalease.AckApplied {
			t.Fatalf("the accept of offset %d: %v %v, want offset %d APPLIED (did the lease expire while draining?)",
				a.offset, a.outcome, a.err, first)
		}
	default:
		t.Fatal("no accept answered")
	}
	if queueInfo(ctx, t, client, group, q.Topic) == nil {
		t.Fatal("the lease is no longer listed after the drain")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release after the drain: %v", err)
	}
}

// c. A queue-mode lease refuses Commit and Seek (WRONG_MODE), an answer after Release fails
// with the lease-ended error, and a missing dead letter topic fails the first Deliver.
func TestQueueAnswerAfterReleaseFailsAndWrongMode(t *testing.T) {
	client, fx, _ := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, time.Minute)
	lease, err := client.Acquire(ctx, fx.freshGroup(), q.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	var first *kafkalease.Delivery
	for d, err := range lease.Deliveries(ctx, kafkalease.QueueOptions{DeadLetterTopic: q.DeadLetterTopic}) {
		if err != nil {
			t.Fatalf("deliveries: %v", err)
		}
		first = d
		break
	}
	if first.Offset() != 0 || first.Attempt != 1 || !first.Deadline.After(time.Now()) {
		t.Fatalf("first delivery: offset %d attempt %d deadline %v", first.Offset(), first.Attempt, first.Deadline)
	}
	if err := checkQueueRecord(fx, first.Record); err != nil {
		t.Fatal(err)
	}
	err = lease.Commit(ctx, 1)
	if e := asError(t, err); e.Code != codes.FailedPrecondition || e.Reason != "WRONG_MODE" ||
		!kafkalease.IsReason(err, kafkaleasev1.ErrorReason_WRONG_MODE) {
		t.Fatalf("commit in queue mode: %v", err)
	}
	_, err = lease.Seek(ctx, kafkalease.SeekEarliest())
	if e := asError(t, err); e.Code != codes.FailedPrecondition || e.Reason != "WRONG_MODE" {
		t.Fatalf("seek in queue mode: %v", err)
	}
	if outcome, err := first.Renew(ctx); err != nil || outcome != kafkalease.AckApplied {
		t.Fatalf("renew: %v %v", outcome, err)
	}

	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	_, err = first.Accept(ctx)
	if e := asError(t, err); e.Code != codes.FailedPrecondition || !e.IsLeaseEnded() {
		t.Fatalf("accept after release: %v, want FAILED_PRECONDITION with a lease-ended reason", err)
	}

	other, err := client.Acquire(ctx, fx.freshGroup(), q.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer func() { _ = other.Release(context.Background()) }()
	for d, err := range other.Deliveries(ctx, kafkalease.QueueOptions{DeadLetterTopic: fx.MissingTopic}) {
		if e := asError(t, err); d != nil || e.Code != codes.NotFound || e.Reason != "TOPIC_NOT_FOUND" ||
			e.Metadata["topic"] != fx.MissingTopic {
			t.Fatalf("a missing dead letter topic: %v", err)
		}
	}
}

// d. Consume through a relay whose connections are cut mid-way: the Deliver reopens by
// itself and every record is handled.
func TestQueueDeliverReopensAfterTheConnectionIsCut(t *testing.T) {
	_, fx, addr := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, 2*time.Minute)
	r := startRelay(t, addr)
	client, err := kafkalease.NewClient(r.addr())
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer func() { _ = client.Close() }()
	lease, err := client.Acquire(ctx, fx.freshGroup(), q.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire through the relay: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	var h handlings
	var once sync.Once
	opts := kafkalease.ConsumeOptions{
		// Deliveries lost in the cut come again after the deadline. A window of 4: the records
		// past the 14th can only come after the cut, over a new connection (with the default
		// 64, all of them could be in hand before the 10th was handled).
		Queue:       kafkalease.QueueOptions{Ordering: kafkalease.OrderUnordered, AckDeadline: 2 * time.Second, DeadLetterTopic: q.DeadLetterTopic, MaxInFlight: 4},
		Concurrency: 4,
	}
	bg := consumeInBackground(ctx, lease, opts, func(_ context.Context, d *kafkalease.Delivery) error {
		h.add(fx, d)
		if len(h.snapshot()) == 10 {
			once.Do(r.cut)
		}
		return nil
	})
	distinct := func() int {
		m := map[int64]bool{}
		for _, c := range h.snapshot() {
			m[c.offset] = true
		}
		return len(m)
	}
	bg.until(t, "every record handled", 60*time.Second, func() bool { return distinct() == q.Records })
	res := bg.stop()
	h.check(t)
	if res.err != nil {
		t.Fatalf("consume: %v", res.err)
	}
	if r.accepted.Load() < 2 {
		t.Fatalf("the connection was not cut (%d connections)", r.accepted.Load())
	}
}
