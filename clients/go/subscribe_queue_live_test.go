package kafkalease_test

// A subscription in queue mode against a real gateway (KAFKA_LEASE_ADDR) with the fixture's
// queue topic (KAFKA_LEASE_FIXTURE); skipped when those are not set.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
)

// Subscription.Consume over the queue topic: the handler rejects the poison record and
// handles the 39 others, each accept applied; the lease's queue counts one dead letter; once
// the consumer stops, the member has left and its lease was released with the queue's
// progress committed, so the group's next lease starts after the last record.
func TestSubscriptionConsumeRejectsThePoisonRecordAndCommitsOnLeaving(t *testing.T) {
	client, fx, _ := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, 2*time.Minute)
	group := fx.freshGroup()
	sub, err := client.Subscribe(ctx, group, []string{q.Topic}, kafkalease.SubscribeOptions{
		Member: "go-sub-queue",
		Queue:  &kafkalease.QueueOptions{Ordering: kafkalease.OrderKey, MaxInFlight: 4, DeadLetterTopic: q.DeadLetterTopic},
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() { _ = sub.Close() }()

	var (
		mu      sync.Mutex
		handled = map[int64]int{}
		applied = map[int64]int{}
		bad     []error
	)
	opts := kafkalease.ConsumeOptions{
		Concurrency: 4,
		OnAccept: func(d *kafkalease.Delivery, outcome kafkalease.AckOutcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil && outcome == kafkalease.AckApplied {
				applied[d.Offset()]++
			}
		},
	}
	cctx, stop := context.WithCancel(ctx)
	type result struct {
		stats kafkalease.ConsumeStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		stats, err := sub.Consume(cctx, opts, func(_ context.Context, d *kafkalease.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if d.Topic != q.Topic || d.Partition != 0 {
				bad = append(bad, fmt.Errorf("offset %d: delivered as %s/%d", d.Offset(), d.Topic, d.Partition))
			}
			if err := checkQueueRecord(fx, d.Record); err != nil {
				bad = append(bad, err)
			}
			if string(d.Record.Value) == "poison" {
				return kafkalease.Reject("poison")
			}
			handled[d.Offset()]++
			return nil
		})
		done <- result{stats, err}
	}()
	eventually(t, "39 records handled and one dead letter", 60*time.Second, func() bool {
		select {
		case res := <-done:
			t.Fatalf("the consume ended first: %+v %v", res.stats, res.err)
		default:
		}
		mu.Lock()
		n := len(applied)
		mu.Unlock()
		return n >= q.Records-1 && queueInfo(ctx, t, client, group, q.Topic).GetDeadLetters() >= 1
	})
	info := queueInfo(ctx, t, client, group, q.Topic)
	if info.GetDeadLetters() != 1 || info.GetOrdering() != kafkalease.OrderKey || info.GetDeadLetterTopic() != q.DeadLetterTopic {
		t.Fatalf("queue %v", info)
	}
	stop()
	res := <-done
	if res.err != nil {
		t.Fatalf("consume: %v", res.err)
	}
	if res.stats != (kafkalease.ConsumeStats{Accepted: uint64(q.Records - 1), Rejected: 1}) {
		t.Fatalf("stats %+v", res.stats)
	}
	mu.Lock()
	for _, err := range bad {
		t.Error(err)
	}
	for o := int64(0); o < int64(q.Records); o++ {
		want := 1
		if o == q.PoisonOffset {
			want = 0
		}
		if handled[o] != want || applied[o] != want {
			t.Errorf("offset %d handled %d times, accept applied %d times, want %d", o, handled[o], applied[o], want)
		}
	}
	mu.Unlock()

	// The member left with the stream: its lease is released, the queue's progress committed.
	again, err := client.Acquire(ctx, group, q.Topic, kafkalease.AcquireOptions{Partition: p0, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire after the member left: %v", err)
	}
	defer func() { _ = again.Release(context.Background()) }()
	if again.Offset != int64(q.Records) {
		t.Fatalf("the next lease starts at %d, want %d: leaving commits the queue's progress", again.Offset, q.Records)
	}
}

// At shutdown Subscription.Consume keeps the stream open while running handlers finish:
// their accepts are applied (the member still holds its lease), and only then does the
// member leave, committing them.
func TestSubscriptionConsumeDrainsBeforeLeaving(t *testing.T) {
	client, fx, _ := live(t)
	queueFixture(t, fx)
	q := fx.Queue
	ctx := testContext(t, time.Minute)
	group := fx.freshGroup()
	sub, err := client.Subscribe(ctx, group, []string{q.Topic}, kafkalease.SubscribeOptions{
		Queue: &kafkalease.QueueOptions{Ordering: kafkalease.OrderUnordered, MaxInFlight: 2, DeadLetterTopic: q.DeadLetterTopic},
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() { _ = sub.Close() }()
	var (
		mu      sync.Mutex
		applied []int64
	)
	started, finish := make(chan int64, 10), make(chan struct{})
	opts := kafkalease.ConsumeOptions{
		Concurrency: 2,
		OnAccept: func(d *kafkalease.Delivery, outcome kafkalease.AckOutcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil && outcome == kafkalease.AckApplied {
				applied = append(applied, d.Offset())
			}
		},
	}
	cctx, stop := context.WithCancel(ctx)
	type result struct {
		stats kafkalease.ConsumeStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		stats, err := sub.Consume(cctx, opts, func(_ context.Context, d *kafkalease.Delivery) error {
			started <- d.Offset()
			<-finish
			return nil
		})
		done <- result{stats, err}
	}()
	for range 2 {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("two handlers did not start")
		}
	}
	stop()
	time.Sleep(300 * time.Millisecond) // draining: the handlers still run
	close(finish)
	res := <-done
	if res.err != nil || res.stats != (kafkalease.ConsumeStats{Accepted: 2}) {
		t.Fatalf("consume: %+v %v, want 2 accepted", res.stats, res.err)
	}
	mu.Lock()
	if len(applied) != 2 {
		t.Errorf("accepts applied for %v, want 2", applied)
	}
	mu.Unlock()
	again, err := client.Acquire(ctx, group, q.Topic, kafkalease.AcquireOptions{Partition: p0, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire after the member left: %v", err)
	}
	defer func() { _ = again.Release(context.Background()) }()
	if again.Offset != 2 {
		t.Fatalf("the next lease starts at %d, want 2", again.Offset)
	}
}
