package kafkalease_test

// Resubscribing against the in-process fake gateway.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// subscribeFake is fakeGateway with Subscribe.
type subscribeFake struct {
	*fakeGateway
	mu   sync.Mutex
	reqs []*kafkaleasev1.SubscribeRequest
	// subscribe serves the n-th Subscribe (from 0).
	subscribe func(n int, stream kafkaleasev1.PartitionLeaseService_SubscribeServer) error
}

func (f *subscribeFake) Subscribe(req *kafkaleasev1.SubscribeRequest, stream kafkaleasev1.PartitionLeaseService_SubscribeServer) error {
	f.mu.Lock()
	n := len(f.reqs)
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	return f.subscribe(n, stream)
}

func (f *subscribeFake) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

func joined(member, gateway string) *kafkaleasev1.SubscribeResponse {
	return &kafkaleasev1.SubscribeResponse{Event: &kafkaleasev1.SubscribeResponse_Joined{
		Joined: &kafkaleasev1.Joined{MemberId: member, Gateway: gateway}}}
}

func assigned(lease string, offset int64) *kafkaleasev1.SubscribeResponse {
	return &kafkaleasev1.SubscribeResponse{Event: &kafkaleasev1.SubscribeResponse_Assigned{
		Assigned: &kafkaleasev1.Assigned{LeaseId: lease, Topic: "t", FencingToken: 5, Offset: offset, HighWatermark: 10}}}
}

func subscribedRecords(lease string, offsets ...int64) *kafkaleasev1.SubscribeResponse {
	r := &kafkaleasev1.SubscribedRecords{LeaseId: lease, Topic: "t", HighWatermark: 10}
	for _, o := range offsets {
		r.Records = append(r.Records, &kafkaleasev1.KafkaRecord{Offset: o})
	}
	return &kafkaleasev1.SubscribeResponse{Event: &kafkaleasev1.SubscribeResponse_Records{Records: r}}
}

func sendAll(s kafkaleasev1.PartitionLeaseService_SubscribeServer, events ...*kafkaleasev1.SubscribeResponse) error {
	for _, ev := range events {
		if err := s.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

// describe renders an event for comparisons.
func describe(ev kafkalease.Event) string {
	switch ev := ev.(type) {
	case *kafkalease.Assigned:
		return fmt.Sprintf("assigned %s@%d", ev.Lease.ID(), ev.Offset)
	case *kafkalease.Records:
		var offsets []int64
		for _, r := range ev.Records {
			offsets = append(offsets, r.Offset)
		}
		return fmt.Sprintf("records %s %v", ev.Lease.ID(), offsets)
	}
	return fmt.Sprintf("%T", ev)
}

func TestSubscriptionResubscribesAfterABrokenStream(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := &subscribeFake{fakeGateway: &fakeGateway{}}
	f.subscribe = func(n int, s kafkaleasev1.PartitionLeaseService_SubscribeServer) error {
		switch n {
		case 0:
			if err := sendAll(s, joined("gen-1", "gw-a"), assigned("L1", 0), subscribedRecords("L1", 0, 1, 2)); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "connection reset") // as gRPC reports a cut
		case 1:
			return gatewayError(codes.Unavailable, "SHUTTING_DOWN", nil, time.Millisecond)
		case 2:
			// The gateway has not seen the first stream end yet.
			return gatewayError(codes.AlreadyExists, "MEMBER_ACTIVE", map[string]string{"member_id": "gen-1"}, 0)
		case 3:
			if err := sendAll(s, joined("gen-1", "gw-b"), assigned("L1", 2), subscribedRecords("L1", 2, 3, 4)); err != nil {
				return err
			}
			return gatewayError(codes.InvalidArgument, "INVALID_FIELD", map[string]string{"field": "topics"}, 0)
		}
		t.Errorf("subscribe %d after an error that ends the subscription", n)
		return nil
	}
	client := startFake(t, f)
	grace := 10 * time.Second
	sub, err := client.Subscribe(ctx, "g", []string{"t"}, kafkalease.SubscribeOptions{Member: "m", SessionGrace: grace, MaxRecords: 3})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() { _ = sub.Close() }()
	if sub.MemberID() != "gen-1" || sub.Gateway() != "gw-a" {
		t.Fatalf("member %q on %q", sub.MemberID(), sub.Gateway())
	}
	var got []string
	var lease *kafkalease.SubscribedLease
	var end error
	for ev, err := range sub.Events() {
		if err != nil {
			end = err
			break
		}
		got = append(got, describe(ev))
		if a, ok := ev.(*kafkalease.Assigned); ok {
			if lease != nil && a.Lease != lease {
				t.Fatalf("a new handle for the same lease after the resubscribe")
			}
			lease = a.Lease
		}
	}
	if fmt.Sprint(got) != "[assigned L1@0 records L1 [0 1 2] assigned L1@2 records L1 [2 3 4]]" {
		t.Fatalf("events %v", got)
	}
	if e := asError(t, end); e.Code != codes.InvalidArgument || e.Reason != "INVALID_FIELD" {
		t.Fatalf("the end: %v", end)
	}
	if _, err := sub.Next(); err != end {
		t.Fatalf("next after the end: %v, want %v again", err, end)
	}
	if f.calls() != 4 || sub.Gateway() != "gw-b" {
		t.Fatalf("%d subscribes, gateway %q", f.calls(), sub.Gateway())
	}
	// The same member, the same settings: only the member id, the gateway's, is filled in.
	want := &kafkaleasev1.SubscribeRequest{Group: "g", Topics: []string{"t"}, Member: "m", MaxRecords: 3,
		SessionGrace: durationpb.New(grace)}
	if !proto.Equal(f.reqs[0], want) {
		t.Fatalf("first subscribe %v, want %v", f.reqs[0], want)
	}
	want.MemberId = "gen-1"
	for _, req := range f.reqs[1:] {
		if !proto.Equal(req, want) {
			t.Fatalf("resubscribe %v, want %v", req, want)
		}
	}
}

func TestSubscriptionEndsWhenItCannotResubscribe(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	broken := func(n int, s kafkaleasev1.PartitionLeaseService_SubscribeServer) error {
		if n == 0 {
			if err := sendAll(s, joined("m1", "gw")); err != nil {
				return err
			}
		}
		return status.Error(codes.Unavailable, "connection reset")
	}
	cases := []struct {
		name      string
		grace     time.Duration
		subscribe func(int, kafkaleasev1.PartitionLeaseService_SubscribeServer) error
		calls     func(int) bool
		code      codes.Code
	}{
		{"no session grace", 0, broken, func(n int) bool { return n == 1 }, codes.Unavailable},
		{"the grace runs out", 300 * time.Millisecond, broken, func(n int) bool { return n > 2 && n < 8 }, codes.Unavailable},
		{"refused", 10 * time.Second, func(n int, s kafkaleasev1.PartitionLeaseService_SubscribeServer) error {
			if n == 0 {
				return broken(n, s)
			}
			return gatewayError(codes.PermissionDenied, "ACTION_DENIED", nil, 0)
		}, func(n int) bool { return n == 2 }, codes.PermissionDenied},
	}
	for _, c := range cases {
		f := &subscribeFake{fakeGateway: &fakeGateway{}, subscribe: c.subscribe}
		sub, err := startFake(t, f).Subscribe(ctx, "g", []string{"t"}, kafkalease.SubscribeOptions{MemberID: "m1", SessionGrace: c.grace})
		if err != nil {
			t.Fatalf("%s: subscribe: %v", c.name, err)
		}
		start := time.Now()
		_, err = sub.Next()
		if e := asError(t, err); e.Code != c.code || !c.calls(f.calls()) {
			t.Fatalf("%s: %v after %d subscribes", c.name, err, f.calls())
		}
		if took := time.Since(start); took > c.grace+time.Second {
			t.Fatalf("%s: ended after %v", c.name, took)
		}
		_ = sub.Close()
	}

	// Close while resubscribing: the error is the cancellation.
	f := &subscribeFake{fakeGateway: &fakeGateway{}, subscribe: broken}
	sub, err := startFake(t, f).Subscribe(ctx, "g", []string{"t"}, kafkalease.SubscribeOptions{SessionGrace: time.Minute})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	go func() {
		for f.calls() < 3 {
			time.Sleep(10 * time.Millisecond)
		}
		_ = sub.Close()
	}()
	if _, err := sub.Next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("next after close while resubscribing: %v", err)
	}
}

func TestSubscriptionConsumeEndedByItsDeadlineReturnsNil(t *testing.T) {
	// The member's stream ends at the caller's deadline, the gateway's side first (see
	// lateDeadline).
	f := &subscribeFake{fakeGateway: &fakeGateway{}}
	f.subscribe = func(_ int, s kafkaleasev1.PartitionLeaseService_SubscribeServer) error {
		if err := sendAll(s, joined("m1", "gw")); err != nil {
			return err
		}
		return endAtTheDeadline(s.Context())
	}
	client := startFake(t, f)
	queue := &kafkalease.QueueOptions{}
	handler := func(context.Context, *kafkalease.Delivery) error { return nil }
	ctx := newLateDeadline(t, 200*time.Millisecond)
	sub, err := client.Subscribe(ctx, "g", []string{"t"}, kafkalease.SubscribeOptions{Queue: queue})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if _, err := sub.Consume(ctx, kafkalease.ConsumeOptions{}, handler); err != nil {
		t.Fatalf("consume ended by its deadline, the gateway's side first: %v", err)
	}

	// With real contexts, the subscription's stream and the consumer both end with the
	// context, in either order: nil every time.
	for i := range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		sub, err := client.Subscribe(ctx, "g", []string{"t"}, kafkalease.SubscribeOptions{Queue: queue})
		if err != nil {
			cancel()
			t.Fatalf("run %d: subscribe: %v", i, err)
		}
		_, err = sub.Consume(ctx, kafkalease.ConsumeOptions{}, handler)
		cancel()
		if err != nil {
			t.Fatalf("run %d: consume ended by its deadline: %v", i, err)
		}
	}
}
