// Command consume reads a topic as a member of a consumer group through a kafka-lease
// gateway and prints `processed <topic> <partition> <offset>` for each record it handled.
//
// With KAFKA_LEASE_DEAD_LETTER_TOPIC set (an existing topic, other than the one consumed),
// the member is in queue mode: a handler runs on each delivery, each partition's records in
// offset order, and a record is printed once its accept was applied; the gateway commits.
// On SIGTERM or SIGINT it stops taking records, lets running handlers finish (their
// accepts land while the member still holds its leases), then leaves the group: its leases
// are released, committing what was done, and it exits 0.
//
// Without it (queue mode needs a dead letter topic that exists), it reads batches and
// commits after each, and when a partition is revoked; on SIGTERM or SIGINT it commits what
// it processed, leaves the group (releasing its partitions) and exits 0.
//
//	KAFKA_LEASE_ADDR=127.0.0.1:50051 KAFKA_LEASE_GROUP=demo-group KAFKA_LEASE_TOPIC=demo \
//	KAFKA_LEASE_DEAD_LETTER_TOPIC=demo-dead-letters consume
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
)

func main() {
	if err := run(); err != nil {
		log.Printf("consume: %v", err)
		os.Exit(1)
	}
}

// event is one step of the subscription, as read by the goroutine that waits for them.
type event struct {
	ev  kafkalease.Event
	err error
}

func run() error {
	addr, group, topic := os.Getenv("KAFKA_LEASE_ADDR"), os.Getenv("KAFKA_LEASE_GROUP"), os.Getenv("KAFKA_LEASE_TOPIC")
	if addr == "" || group == "" || topic == "" {
		return fmt.Errorf("set KAFKA_LEASE_ADDR, KAFKA_LEASE_GROUP and KAFKA_LEASE_TOPIC")
	}
	stopped, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	client, err := kafkalease.NewClient(addr)
	if err != nil {
		return err
	}
	defer func() { _ = client.Close() }()

	if deadLetters := os.Getenv("KAFKA_LEASE_DEAD_LETTER_TOPIC"); deadLetters != "" {
		return consumeQueue(stopped, client, group, topic, deadLetters)
	}
	log.Printf("KAFKA_LEASE_DEAD_LETTER_TOPIC is not set: queue mode needs an existing dead letter topic, so reading batches and committing instead")
	return consumeBatches(stopped, client, group, topic)
}

// concurrency is how many records are handled at once, across the member's partitions.
const concurrency = 8

// consumeQueue is a member in queue mode until stopped ends.
func consumeQueue(stopped context.Context, client *kafkalease.Client, group, topic, deadLetters string) error {
	// The subscription outlives the signal: Consume drains with it open, then closes it.
	// No session grace: the member leaves as soon as its stream ends.
	sub, err := client.Subscribe(context.Background(), group, []string{topic}, kafkalease.SubscribeOptions{
		Member: "go-example",
		Queue: &kafkalease.QueueOptions{
			Ordering:        kafkalease.OrderPartition, // each partition in offset order
			MaxInFlight:     concurrency,
			DeadLetterTopic: deadLetters,
		},
	})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }()
	log.Printf("joined %s as %s (queue mode, dead letters to %s)", group, sub.MemberID(), deadLetters)

	var out sync.Mutex
	opts := kafkalease.ConsumeOptions{
		Concurrency: concurrency,
		OnAccept: func(d *kafkalease.Delivery, outcome kafkalease.AckOutcome, err error) {
			switch {
			case err != nil:
				log.Printf("accept %s/%d@%d: %v", d.Topic, d.Partition, d.Offset(), err)
			case outcome == kafkalease.AckApplied:
				out.Lock()
				defer out.Unlock()
				fmt.Printf("processed %s %d %d\n", d.Topic, d.Partition, d.Offset())
			}
		},
	}
	stats, err := sub.Consume(stopped, opts, func(context.Context, *kafkalease.Delivery) error {
		return nil // the handling of a record; an error would retry it (or kafkalease.Reject)
	})
	if err != nil {
		return err
	}
	log.Printf("stopping: left %s (%d accepted, %d handed back)", group, stats.Accepted, stats.HandedBack)
	return nil
}

// consumeBatches is a member reading batches until stopped ends.
func consumeBatches(stopped context.Context, client *kafkalease.Client, group, topic string) error {
	// The subscription lives until Close, not until the signal: what was processed is
	// committed first, while the member still holds its leases.
	sub, err := client.Subscribe(context.Background(), group, []string{topic}, kafkalease.SubscribeOptions{Member: "go-example"})
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }() // leaves the group; its leases are released
	log.Printf("joined %s as %s", group, sub.MemberID())

	events := make(chan event)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for ev, err := range sub.Events() {
			select {
			case events <- event{ev, err}:
			case <-done:
				return
			}
		}
		close(events)
	}()

	// Per lease: the offset after the last record processed, and whether it is committed.
	processed := map[*kafkalease.SubscribedLease]int64{}
	committed := map[*kafkalease.SubscribedLease]int64{}
	commit := func(lease *kafkalease.SubscribedLease, always bool) {
		next, ok := processed[lease]
		if !ok || (committed[lease] == next && !always) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lease.Commit(ctx, next); err != nil {
			log.Printf("commit %d on %s/%d: %v", next, lease.Topic, lease.Partition, err)
			return
		}
		committed[lease] = next
	}

	for {
		select {
		case <-stopped.Done():
			// Everything processed is committed after each batch; this is for a batch cut
			// short in a longer-running program. Then the subscription ends (deferred Close).
			for lease := range processed {
				commit(lease, false)
			}
			log.Printf("stopping: left %s", group)
			return nil
		case e, ok := <-events:
			if !ok {
				return fmt.Errorf("the gateway ended the subscription")
			}
			if e.err != nil {
				return e.err
			}
			switch ev := e.ev.(type) {
			case *kafkalease.Assigned:
				log.Printf("assigned %s/%d from offset %d", ev.Lease.Topic, ev.Lease.Partition, ev.Offset)
				processed[ev.Lease], committed[ev.Lease] = ev.Offset, ev.Offset
			case *kafkalease.Records:
				for _, rec := range ev.Records {
					// os.Stdout is unbuffered: each line is written at once.
					fmt.Printf("processed %s %d %d\n", ev.Lease.Topic, ev.Lease.Partition, rec.Offset)
				}
				processed[ev.Lease], _ = ev.NextOffset()
				commit(ev.Lease, false)
			case *kafkalease.Revoking:
				log.Printf("revoking %s/%d", ev.Lease.Topic, ev.Lease.Partition)
				commit(ev.Lease, true) // even if nothing changed: the commit lets the lease move at once
			case *kafkalease.Revoked:
				log.Printf("revoked %s/%d: %s", ev.Lease.Topic, ev.Lease.Partition, ev.Reason)
				delete(processed, ev.Lease)
				delete(committed, ev.Lease)
			}
		}
	}
}
