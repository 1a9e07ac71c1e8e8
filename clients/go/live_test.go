package kafkalease_test

// Tests against a real gateway (KAFKA_LEASE_ADDR) with the fixture's records
// (KAFKA_LEASE_FIXTURE); skipped when those are not set.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

var p0 = kafkalease.Ptr[int32](0)

// checkRecord compares every field of a record with the fixture's.
func checkRecord(t *testing.T, want fixtureRecord, got kafkalease.Record) {
	t.Helper()
	where := fmt.Sprintf("partition %d offset %d", want.Partition, want.Offset)
	if got.Offset != want.Offset {
		t.Fatalf("%s: got offset %d", where, got.Offset)
	}
	if k := unhex(t, want.KeyHex); !sameBytes(k, got.Key) {
		t.Errorf("%s: key %#v (nil: %t), want %#v (nil: %t)", where, got.Key, got.Key == nil, k, k == nil)
	}
	if v := unhex(t, want.ValueHex); !sameBytes(v, got.Value) {
		t.Errorf("%s: value %#v (nil: %t), want %#v (nil: %t)", where, got.Value, got.Value == nil, v, v == nil)
	}
	if got.IsTombstone() != (want.ValueHex == nil) {
		t.Errorf("%s: IsTombstone %t", where, got.IsTombstone())
	}
	if len(got.Headers) != len(want.Headers) {
		t.Fatalf("%s: headers %+v, want %d", where, got.Headers, len(want.Headers))
	}
	for i, h := range want.Headers {
		v := unhex(t, h.ValueHex)
		if got.Headers[i].Key != h.Key || !sameBytes(v, got.Headers[i].Value) {
			t.Errorf("%s: header %d is %q=%#v (nil: %t), want %q=%#v (nil: %t)", where, i,
				got.Headers[i].Key, got.Headers[i].Value, got.Headers[i].Value == nil, h.Key, v, v == nil)
		}
	}
	if got.Timestamp.UnixMilli() != want.TimestampMs {
		t.Errorf("%s: timestamp %v (%d ms), want %d ms", where, got.Timestamp, got.Timestamp.UnixMilli(), want.TimestampMs)
	}
	if got.TimestampType != kafkaleasev1.TimestampType_TIMESTAMP_TYPE_CREATE_TIME {
		t.Errorf("%s: timestamp type %v", where, got.TimestampType)
	}
}

// a. Acquire, read all of partition 0 with every field as produced, release: the Read ends.
func TestFullCycleWithFidelity(t *testing.T) {
	client, fx, _ := live(t)
	ctx := testContext(t, time.Minute)
	want := fx.partition(0)
	if len(want) != 10 {
		t.Fatalf("the fixture has %d records in partition 0, want 10", len(want))
	}
	lease, err := client.Acquire(ctx, fx.freshGroup(), fx.Topic, kafkalease.AcquireOptions{Partition: p0, Member: "go-test", TTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if lease.ID() == "" || lease.Topic != fx.Topic || lease.Partition != 0 || lease.FencingToken == 0 ||
		lease.Offset != 0 || lease.HighWatermark != 10 || lease.TTL != 30*time.Second ||
		!lease.ExpiresAt.After(time.Now()) || lease.Gateway == "" {
		t.Fatalf("lease %+v", lease)
	}
	var got []kafkalease.Record
	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
		if err != nil {
			t.Fatalf("read after %d records: %v", len(got), err)
		}
		got = append(got, rec)
		if len(got) > len(want) {
			t.Fatalf("a record after the last one: %+v", rec)
		}
		if len(got) == len(want) {
			// The Read ends with OK once the lease is released: the loop must end by itself.
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("read %d records, want %d", len(got), len(want))
	}
	for i := range want {
		checkRecord(t, want[i], got[i])
	}
}

// b. Seek while reading: the next record handed out is the sought one, nothing of the old
// epoch leaks (not even the rest of a batch in hand); earliest, latest, timestamp and
// committed resolve as they should.
func TestSeek(t *testing.T) {
	client, fx, _ := live(t)
	ctx := testContext(t, time.Minute)
	want := fx.partition(0)
	lease, err := client.Acquire(ctx, fx.freshGroup(), fx.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()

	var epoch uint64
	seek := func(to kafkalease.SeekTo, wantOffset int64) {
		t.Helper()
		res, err := lease.Seek(ctx, to)
		if err != nil {
			t.Fatalf("seek: %v", err)
		}
		if res.Offset != wantOffset || res.SeekEpoch <= epoch || lease.SeekEpoch() != res.SeekEpoch {
			t.Fatalf("seek resolved to %+v (lease epoch %d), want offset %d and an epoch above %d",
				res, lease.SeekEpoch(), wantOffset, epoch)
		}
		epoch = res.SeekEpoch
	}
	// The offsets handed out, and what the test does after the i-th of them.
	wantSeen := []int64{0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 0, 6, 4, 5}
	actions := map[int]func(){
		// The batch in hand holds 5..9 too: they must not leak.
		4:  func() { seek(kafkalease.SeekOffset(2), 2) },
		12: func() { seek(kafkalease.SeekEarliest(), 0) },
		13: func() {
			seek(kafkalease.SeekLatest(), 10)
			seek(kafkalease.SeekTimestamp(time.UnixMilli(want[6].TimestampMs)), 6)
		},
		14: func() {
			if err := lease.Commit(ctx, 4); err != nil {
				t.Fatalf("commit: %v", err)
			}
			seek(kafkalease.SeekCommitted(), 4)
		},
	}
	var seen []int64
	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
		if err != nil {
			t.Fatalf("read after %v: %v", seen, err)
		}
		i := len(seen)
		seen = append(seen, rec.Offset)
		if rec.Offset != wantSeen[i] {
			t.Fatalf("offsets %v, want %v", seen, wantSeen[:i+1])
		}
		checkRecord(t, want[rec.Offset], rec)
		if action := actions[i]; action != nil {
			action()
		}
		if len(seen) == len(wantSeen) {
			break
		}
	}
	if len(seen) != len(wantSeen) {
		t.Fatalf("the read ended after %v", seen)
	}
}

// c. Commit 7, release, acquire again in the same group: the lease starts at 7. A commit on
// the released lease is fenced, and a second release finds nothing.
func TestCommitReleaseReacquire(t *testing.T) {
	client, fx, _ := live(t)
	ctx := testContext(t, time.Minute)
	group := fx.freshGroup()
	lease, err := client.Acquire(ctx, group, fx.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if rec.Offset == 6 {
			if err := lease.CommitWithMetadata(ctx, 7, "go-test"); err != nil {
				t.Fatalf("commit: %v", err)
			}
			break
		}
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	err = lease.Commit(ctx, 8)
	if e := asError(t, err); e.Code != codes.FailedPrecondition || !e.IsLeaseEnded() {
		t.Fatalf("commit after release: %v, want FAILED_PRECONDITION with a lease-ended reason", err)
	}
	err = lease.Release(ctx)
	if e := asError(t, err); e.Code != codes.NotFound || e.Reason != "LEASE_NOT_FOUND" {
		t.Fatalf("second release: %v, want NOT_FOUND LEASE_NOT_FOUND", err)
	}

	again, err := client.Acquire(ctx, group, fx.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire again: %v", err)
	}
	if again.Offset != 7 || again.FencingToken <= lease.FencingToken {
		t.Fatalf("second lease starts at %d with token %d, want 7 and a token above %d",
			again.Offset, again.FencingToken, lease.FencingToken)
	}
	for rec, err := range again.Records(ctx, kafkalease.ReadOptions{}) {
		if err != nil {
			t.Fatalf("read again: %v", err)
		}
		if rec.Offset != 7 {
			t.Fatalf("first record after re-acquire: %d, want 7", rec.Offset)
		}
		break
	}
	if err := again.ReleaseWithCommit(ctx, 8); err != nil {
		t.Fatalf("release with commit: %v", err)
	}
}

// d. A Read through a relay whose connections are cut after 3 records goes on at offset 3,
// with no gap and no repeat, over a new connection.
func TestReadReopensAfterTheConnectionIsCut(t *testing.T) {
	_, fx, addr := live(t)
	ctx := testContext(t, time.Minute)
	r := startRelay(t, addr)
	client, err := kafkalease.NewClient(r.addr())
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer func() { _ = client.Close() }()
	lease, err := client.Acquire(ctx, fx.freshGroup(), fx.Topic, kafkalease.AcquireOptions{Partition: p0})
	if err != nil {
		t.Fatalf("acquire through the relay: %v", err)
	}
	defer func() { _ = lease.Release(context.Background()) }()

	readCtx, stop := context.WithCancel(ctx)
	defer stop()
	reconnected := make(chan bool, 1)
	var got []int64
	var end error
	for rec, err := range lease.Records(readCtx, kafkalease.ReadOptions{MaxRecords: 1}) {
		if err != nil {
			end = err
			break
		}
		if rec.Offset != int64(len(got)) {
			t.Fatalf("offset %d after %v: a gap or a repeat", rec.Offset, got)
		}
		got = append(got, rec.Offset)
		if len(got) == 3 {
			r.cut()
		}
		if len(got) == 10 {
			// grpc-go has usually received all ten (small) records before the cut and hands
			// them out before the error; the broken stream must then be reopened over a new
			// connection at offset 10. A reopen anywhere else (the lease's resume point, 0)
			// would repeat records at once, so after the reconnection the read must stay
			// quiet: any record in that second fails the test above.
			go func() {
				end := time.Now().Add(20 * time.Second)
				for r.accepted.Load() < 2 && time.Now().Before(end) {
					time.Sleep(20 * time.Millisecond)
				}
				ok := r.accepted.Load() >= 2
				if ok {
					time.Sleep(time.Second)
				}
				reconnected <- ok
				stop()
			}()
		}
	}
	if len(got) != 10 {
		t.Fatalf("read %v, then %v", got, end)
	}
	if !<-reconnected {
		t.Fatalf("the client did not reconnect through the relay (%d connections)", r.accepted.Load())
	}
	if !errors.Is(end, context.Canceled) {
		t.Fatalf("the read ended with %v, want our cancellation", end)
	}
}

// e. Errors carry the gateway's reason and metadata.
func TestErrorReasons(t *testing.T) {
	client, fx, _ := live(t)
	ctx := testContext(t, time.Minute)
	group := fx.freshGroup()

	_, err := client.Acquire(ctx, group, fx.MissingTopic, kafkalease.AcquireOptions{})
	if e := asError(t, err); e.Code != codes.NotFound || e.Reason != "TOPIC_NOT_FOUND" || e.Metadata["topic"] != fx.MissingTopic {
		t.Fatalf("missing topic: %#v", e)
	}
	if !kafkalease.IsReason(err, kafkaleasev1.ErrorReason_TOPIC_NOT_FOUND) {
		t.Fatalf("IsReason(%v, TOPIC_NOT_FOUND) is false", err)
	}

	holder, err := client.Acquire(ctx, group, fx.Topic, kafkalease.AcquireOptions{Partition: p0, Member: "go-holder"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	defer func() { _ = holder.Release(context.Background()) }()
	_, err = client.Acquire(ctx, group, fx.Topic, kafkalease.AcquireOptions{Partition: p0, Member: "go-second"})
	e := asError(t, err)
	if e.Code != codes.ResourceExhausted || e.Reason != "PARTITION_BUSY" ||
		e.Metadata["holder_member"] != "go-holder" || e.Metadata["partition"] != "0" || e.IsRetryable() {
		t.Fatalf("busy partition: %#v", e)
	}

	_, err = holder.Seek(ctx, kafkalease.SeekOffset(1000))
	if e := asError(t, err); e.Code != codes.OutOfRange || e.Reason != "OFFSET_OUT_OF_RANGE" ||
		e.Metadata["low"] != "0" || e.Metadata["high"] != "10" {
		t.Fatalf("seek out of range: %#v", e)
	}

	_, err = client.Acquire(ctx, group, fx.Topic, kafkalease.AcquireOptions{Partition: kafkalease.Ptr[int32](1), TTL: 500 * time.Millisecond})
	if e := asError(t, err); e.Code != codes.InvalidArgument || e.Reason != "INVALID_FIELD" || e.Metadata["field"] != "ttl" {
		t.Fatalf("ttl 0.5 s: %#v", e)
	}
	_, err = client.Acquire(ctx, "", fx.Topic, kafkalease.AcquireOptions{})
	if e := asError(t, err); e.Code != codes.InvalidArgument || e.Reason != "INVALID_FIELD" || e.Metadata["field"] != "group" {
		t.Fatalf("empty group: %#v", e)
	}
}

// f. One member gets both partitions and all 15 records, commits them, and leaves the group
// when its subscription ends.
func TestSubscribe(t *testing.T) {
	client, fx, _ := live(t)
	ctx := testContext(t, time.Minute)
	group := fx.freshGroup()
	memberID := "go-member-" + randomSuffix()
	sub, err := client.Subscribe(ctx, group, []string{fx.Topic}, kafkalease.SubscribeOptions{MemberID: memberID, Member: "go-test"})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() { _ = sub.Close() }()
	if sub.MemberID() != memberID {
		t.Fatalf("member id %q, want %q", sub.MemberID(), memberID)
	}
	assigned := map[int32]*kafkalease.SubscribedLease{}
	read := map[int32][]int64{}
	total := 0
	for ev, err := range sub.Events() {
		if err != nil {
			t.Fatalf("subscription after %d records: %v", total, err)
		}
		switch ev := ev.(type) {
		case *kafkalease.Assigned:
			if ev.Lease.Topic != fx.Topic || ev.Offset != 0 || ev.Lease.FencingToken == 0 {
				t.Fatalf("assigned %v from %d", ev.Lease, ev.Offset)
			}
			assigned[ev.Lease.Partition] = ev.Lease
		case *kafkalease.Records:
			if assigned[ev.Lease.Partition] != ev.Lease {
				t.Fatalf("records of %v before its assignment", ev.Lease)
			}
			want := fx.partition(ev.Lease.Partition)
			for _, rec := range ev.Records {
				if rec.Offset != int64(len(read[ev.Lease.Partition])) {
					t.Fatalf("partition %d: offset %d after %v", ev.Lease.Partition, rec.Offset, read[ev.Lease.Partition])
				}
				checkRecord(t, want[rec.Offset], rec)
				read[ev.Lease.Partition] = append(read[ev.Lease.Partition], rec.Offset)
				total++
			}
			next, _ := ev.NextOffset()
			if err := ev.Lease.Commit(ctx, next); err != nil {
				t.Fatalf("commit %d on %v: %v", next, ev.Lease, err)
			}
		default:
			t.Fatalf("unexpected event %#v", ev)
		}
		if len(assigned) == 2 && total == 15 {
			break
		}
	}
	if len(read[0]) != 10 || len(read[1]) != 5 {
		t.Fatalf("read %v", read)
	}

	members := func() []*kafkaleasev1.MemberInfo {
		m, err := client.ListMembers(ctx, group, "")
		if err != nil {
			t.Fatalf("list members: %v", err)
		}
		return m
	}
	eventually(t, "the member listed with both partitions", 10*time.Second, func() bool {
		m := members()
		return len(m) == 1 && m[0].GetMemberId() == memberID && len(m[0].GetPartitions()) == 2
	})
	_ = sub.Close()
	if _, err := sub.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("next after close: %v, want context.Canceled", err)
	}
	eventually(t, "the member gone from the group", 10*time.Second, func() bool { return len(members()) == 0 })

	// Its commits are the group's: new leases start after the last record.
	for p, want := range map[int32]int64{0: 10, 1: 5} {
		lease, err := client.Acquire(ctx, group, fx.Topic, kafkalease.AcquireOptions{Partition: kafkalease.Ptr(p), Wait: 10 * time.Second})
		if err != nil {
			t.Fatalf("acquire %d after the subscription: %v", p, err)
		}
		if lease.Offset != want {
			t.Errorf("partition %d starts at %d, want %d (committed by the member)", p, lease.Offset, want)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
}

// g. A subscription through a relay whose connections are cut goes on by itself: it
// resubscribes as the same member (the id the gateway gave it), the gateway announces its
// leases again at their resume points (the commit made before the cut), and their records
// come again from there to the end.
func TestSubscriptionResubscribesAfterTheConnectionIsCut(t *testing.T) {
	_, fx, addr := live(t)
	ctx := testContext(t, time.Minute)
	r := startRelay(t, addr)
	client, err := kafkalease.NewClient(r.addr())
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer func() { _ = client.Close() }()
	group := fx.freshGroup()
	sub, err := client.Subscribe(ctx, group, []string{fx.Topic}, kafkalease.SubscribeOptions{Member: "go-resubscribe", SessionGrace: 30 * time.Second})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() { _ = sub.Close() }()
	memberID := sub.MemberID()
	if memberID == "" {
		t.Fatal("no member id from `joined`")
	}

	ends := map[int32]int64{0: int64(len(fx.partition(0))), 1: int64(len(fx.partition(1)))}
	leases := map[int32]*kafkalease.SubscribedLease{}
	committed := map[int32]int64{}
	cut := false
	// After the cut: the offset each lease was announced again at, and the next offset of
	// its records since.
	again := map[int32]int64{}
	next := map[int32]int64{}
	done := func() bool {
		for p, end := range ends {
			if n, ok := next[p]; !ok || n != end {
				return false
			}
		}
		return true
	}
	for ev, err := range sub.Events() {
		if err != nil {
			t.Fatalf("the subscription ended (cut: %t): %v", cut, err)
		}
		switch ev := ev.(type) {
		case *kafkalease.Assigned:
			p := ev.Lease.Partition
			if !cut {
				leases[p] = ev.Lease
				continue
			}
			if leases[p] != ev.Lease || ev.Offset != committed[p] {
				t.Fatalf("after the cut: %v assigned at %d, want the same lease at %d", ev.Lease, ev.Offset, committed[p])
			}
			again[p], next[p] = ev.Offset, ev.Offset
		case *kafkalease.Records:
			p := ev.Lease.Partition
			want := fx.partition(p)
			for _, rec := range ev.Records {
				checkRecord(t, want[rec.Offset], rec)
			}
			if !cut {
				if len(leases) == 2 {
					// Commit this batch, then cut every connection: the rest of the old stream
					// (records gRPC had received already) comes first, then the new one's.
					n, _ := ev.NextOffset()
					if err := ev.Lease.Commit(ctx, n); err != nil {
						t.Fatalf("commit: %v", err)
					}
					committed[p] = n
					r.cut()
					cut = true
				}
				continue
			}
			if _, ok := again[p]; !ok {
				continue // the old stream's
			}
			if ev.Records[0].Offset != next[p] {
				t.Fatalf("partition %d: records from %d, want %d", p, ev.Records[0].Offset, next[p])
			}
			next[p], _ = ev.NextOffset()
		default:
			t.Fatalf("unexpected event %#v", ev)
		}
		if done() {
			break
		}
	}
	if !done() {
		t.Fatalf("the events stopped: announced again at %v, read up to %v", again, next)
	}
	if r.accepted.Load() < 2 || sub.MemberID() != memberID {
		t.Fatalf("%d connections, member %q (was %q)", r.accepted.Load(), sub.MemberID(), memberID)
	}
	members, err := client.ListMembers(ctx, group, "")
	if err != nil {
		t.Fatalf("list members: %v", err)
	}
	if len(members) != 1 || members[0].GetMemberId() != memberID || len(members[0].GetPartitions()) != 2 {
		t.Fatalf("members %v", members)
	}
	// One join, one epoch of the group's target, which gives the member what it holds.
	if members[0].GetGroupEpoch() != 1 || len(members[0].GetTargetPartitions()) != 2 {
		t.Fatalf("epoch %d, target %v", members[0].GetGroupEpoch(), members[0].GetTargetPartitions())
	}
}
