package kafkalease_test

// Queue mode against the in-process fake gateway: batched answers, reopened Delivers, the
// consumer's error policy.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// queueFake is fakeGateway (for Acquire) with Deliver and Acknowledge.
type queueFake struct {
	*fakeGateway
	mu       sync.Mutex
	delivers []*kafkaleasev1.DeliverRequest
	// deliver serves the n-th Deliver (from 0).
	deliver func(n int, stream kafkaleasev1.PartitionLeaseService_DeliverServer) error
	acks    [][]*kafkaleasev1.Acknowledgement
	ackCall chan int // the number of each Acknowledge call, as it arrives
	// hold, when set, is waited for by the first Acknowledge before it answers.
	hold chan struct{}
	// outcome is the outcome of an acknowledgement (default APPLIED).
	outcome func(*kafkaleasev1.Acknowledgement) kafkaleasev1.AckOutcome
}

func newQueueFake() *queueFake {
	return &queueFake{fakeGateway: &fakeGateway{}, ackCall: make(chan int, 100)}
}

func (f *queueFake) Deliver(req *kafkaleasev1.DeliverRequest, stream kafkaleasev1.PartitionLeaseService_DeliverServer) error {
	f.mu.Lock()
	n := len(f.delivers)
	f.delivers = append(f.delivers, req)
	f.mu.Unlock()
	return f.deliver(n, stream)
}

func (f *queueFake) Acknowledge(_ context.Context, req *kafkaleasev1.AcknowledgeRequest) (*kafkaleasev1.AcknowledgeResponse, error) {
	f.mu.Lock()
	n := len(f.acks)
	f.acks = append(f.acks, req.GetAcknowledgements())
	f.mu.Unlock()
	f.ackCall <- n
	if n == 0 && f.hold != nil {
		<-f.hold
	}
	resp := &kafkaleasev1.AcknowledgeResponse{}
	for _, a := range req.GetAcknowledgements() {
		outcome := kafkaleasev1.AckOutcome_ACK_OUTCOME_APPLIED
		if f.outcome != nil {
			outcome = f.outcome(a)
		}
		resp.Outcomes = append(resp.Outcomes, outcome)
	}
	return resp, nil
}

func (f *queueFake) allAcks() []*kafkaleasev1.Acknowledgement {
	f.mu.Lock()
	defer f.mu.Unlock()
	var all []*kafkaleasev1.Acknowledgement
	for _, call := range f.acks {
		all = append(all, call...)
	}
	return all
}

// deliveries is a DeliverResponse with a delivery of each offset, at the given attempt.
func deliveries(attempt uint32, offsets ...int64) *kafkaleasev1.DeliverResponse {
	resp := &kafkaleasev1.DeliverResponse{HighWatermark: 40}
	for _, o := range offsets {
		resp.Deliveries = append(resp.Deliveries, &kafkaleasev1.Delivery{
			Record:   &kafkaleasev1.KafkaRecord{Offset: o, Key: []byte("k"), Value: []byte(fmt.Sprint(o))},
			Attempt:  attempt,
			Deadline: timestamppb.New(time.Unix(2_000_000_000, 0)),
		})
	}
	return resp
}

func TestAnswersGoOneCallAtATimeAndBatchBehindIt(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := newQueueFake()
	f.hold = make(chan struct{})
	f.outcome = func(a *kafkaleasev1.Acknowledgement) kafkaleasev1.AckOutcome {
		switch {
		case a.GetOffset() == 5:
			return kafkaleasev1.AckOutcome_ACK_OUTCOME_NOT_DELIVERED
		case a.GetOffset()%2 == 1:
			return kafkaleasev1.AckOutcome_ACK_OUTCOME_STALE
		}
		return kafkaleasev1.AckOutcome_ACK_OUTCOME_APPLIED
	}
	f.deliver = func(_ int, s kafkaleasev1.PartitionLeaseService_DeliverServer) error {
		if err := s.Send(deliveries(2, 0, 1, 2, 3, 4, 5)); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	var ds []*kafkalease.Delivery
	for d, err := range lease.Deliveries(ctx, kafkalease.QueueOptions{Ordering: kafkalease.OrderUnordered}) {
		if err != nil {
			t.Fatalf("deliveries: %v", err)
		}
		if d.Attempt != 2 || !d.Deadline.Equal(time.Unix(2_000_000_000, 0)) || string(d.Record.Value) != fmt.Sprint(d.Offset()) {
			t.Fatalf("delivery %+v", d)
		}
		if ds = append(ds, d); len(ds) == 6 {
			break
		}
	}

	type answer struct {
		outcome kafkalease.AckOutcome
		err     error
	}
	answers := make([]chan answer, 6)
	answerAsync := func(i int, call func() (kafkalease.AckOutcome, error)) {
		answers[i] = make(chan answer, 1)
		go func() {
			o, err := call()
			answers[i] <- answer{o, err}
		}()
	}
	answerAsync(0, func() (kafkalease.AckOutcome, error) { return ds[0].Accept(ctx) })
	if n := <-f.ackCall; n != 0 {
		t.Fatalf("call %d first", n)
	}
	// While the first call is held, five more answers: they wait, then go in one call.
	long := strings.Repeat("é", 1000) // 2000 bytes
	answerAsync(1, func() (kafkalease.AckOutcome, error) { return ds[1].Retry(ctx, 2*time.Hour, long) })
	answerAsync(2, func() (kafkalease.AckOutcome, error) { return ds[2].Reject(ctx, "bad") })
	answerAsync(3, func() (kafkalease.AckOutcome, error) { return ds[3].Renew(ctx) })
	answerAsync(4, func() (kafkalease.AckOutcome, error) { return ds[4].Retry(ctx, -time.Second, "") })
	answerAsync(5, func() (kafkalease.AckOutcome, error) { return ds[5].Accept(ctx) })
	time.Sleep(300 * time.Millisecond)
	select {
	case n := <-f.ackCall:
		t.Fatalf("call %d while the first one is in flight", n)
	default:
	}
	close(f.hold)
	if n := <-f.ackCall; n != 1 {
		t.Fatalf("call %d second", n)
	}
	for i, ch := range answers {
		a := <-ch
		want := kafkalease.AckApplied
		switch {
		case i == 5:
			want = kafkalease.AckNotDelivered // not reported as stale
		case i%2 == 1:
			want = kafkalease.AckStale
		}
		if a.err != nil || a.outcome != want {
			t.Fatalf("answer %d: %v %v, want %v", i, a.outcome, a.err, want)
		}
	}
	if s := kafkalease.AckNotDelivered.String(); s != "NOT_DELIVERED" {
		t.Fatalf("AckNotDelivered is %q", s)
	}
	f.mu.Lock()
	calls := f.acks
	f.mu.Unlock()
	if len(calls) != 2 || len(calls[0]) != 1 || len(calls[1]) != 5 {
		t.Fatalf("calls %v", calls)
	}
	byOffset := map[int64]*kafkaleasev1.Acknowledgement{}
	for _, a := range calls[1] {
		byOffset[a.GetOffset()] = a
		if a.GetAttempt() != 2 {
			t.Fatalf("ack %v: the delivery's attempt is named", a)
		}
	}
	want := map[int64]*kafkaleasev1.Acknowledgement{
		1: {Offset: 1, Type: kafkaleasev1.AckType_ACK_TYPE_RETRY, Attempt: 2, RetryDelay: durationpb.New(time.Hour), Reason: strings.Repeat("é", 512)},
		2: {Offset: 2, Type: kafkaleasev1.AckType_ACK_TYPE_REJECT, Attempt: 2, Reason: "bad"},
		3: {Offset: 3, Type: kafkaleasev1.AckType_ACK_TYPE_RENEW, Attempt: 2},
		4: {Offset: 4, Type: kafkaleasev1.AckType_ACK_TYPE_RETRY, Attempt: 2, RetryDelay: durationpb.New(0)},
		5: {Offset: 5, Type: kafkaleasev1.AckType_ACK_TYPE_ACCEPT, Attempt: 2},
	}
	for o, w := range want {
		if !proto.Equal(byOffset[o], w) {
			t.Errorf("ack of %d: %v, want %v", o, byOffset[o], w)
		}
	}

	// A cancelled context gives up waiting (the answer goes anyway).
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ds[0].Accept(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("accept with a cancelled context: %v", err)
	}
}

func TestDeliverReopensWithTheSameSettingsUntilTheLeaseEnds(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := newQueueFake()
	f.deliver = func(n int, s kafkaleasev1.PartitionLeaseService_DeliverServer) error {
		switch n {
		case 0:
			if err := s.Send(deliveries(1, 0, 1)); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "connection reset") // as gRPC reports a cut
		case 1:
			return gatewayError(codes.Unavailable, "KAFKA_UNAVAILABLE", nil, time.Millisecond)
		case 2:
			if err := s.Send(deliveries(1, 2)); err != nil {
				return err
			}
			return gatewayError(codes.FailedPrecondition, "LEASE_LOST", map[string]string{"lease_ref": "ref"}, 0)
		}
		t.Errorf("deliver %d after the lease ended", n)
		return nil
	}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	opts := kafkalease.QueueOptions{Ordering: kafkalease.OrderKey, MaxInFlight: 7, MaxInFlightBytes: 1 << 20,
		AckDeadline: 3 * time.Second, MaxDeliveries: 4, DeadLetterTopic: "dlq"}
	var got []int64
	var end error
	for d, err := range lease.Deliveries(ctx, opts) {
		if err != nil {
			end = err
			continue
		}
		got = append(got, d.Offset())
	}
	if fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("got %v", got)
	}
	if e := asError(t, end); !e.IsLeaseEnded() || e.Reason != "LEASE_LOST" {
		t.Fatalf("the end: %v", end)
	}
	want := &kafkaleasev1.DeliverRequest{LeaseId: "ref.secret", Ordering: kafkaleasev1.DeliveryOrder_DELIVERY_ORDER_KEY,
		MaxInFlight: 7, MaxInFlightBytes: 1 << 20, AckDeadline: durationpb.New(3 * time.Second), MaxDeliveries: 4,
		DeadLetterTopic: "dlq"}
	if len(f.delivers) != 3 {
		t.Fatalf("%d delivers", len(f.delivers))
	}
	for i, req := range f.delivers {
		if !proto.Equal(req, want) {
			t.Fatalf("deliver %d: %v, want %v", i, req, want)
		}
	}
}

func TestConsumeAnswersAsTheErrorPolicySays(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := newQueueFake()
	f.deliver = func(_ int, s kafkaleasev1.PartitionLeaseService_DeliverServer) error {
		for _, resp := range []*kafkaleasev1.DeliverResponse{deliveries(1, 0, 1), deliveries(3, 2), deliveries(1, 3, 4, 5)} {
			if err := s.Send(resp); err != nil {
				return err
			}
		}
		<-s.Context().Done()
		return nil
	}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	consumeCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for len(f.allAcks()) < 6 && consumeCtx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
	}()
	stats, err := lease.Consume(consumeCtx, kafkalease.ConsumeOptions{Concurrency: 2, Backoff: 50 * time.Millisecond, MaxBackoff: 150 * time.Millisecond},
		func(_ context.Context, d *kafkalease.Delivery) error {
			switch d.Offset() {
			case 1:
				return kafkalease.Reject("bad record")
			case 2:
				return errors.New("boom") // attempt 3: 50 ms doubled twice, capped at 150 ms
			case 3:
				return fmt.Errorf("later: %w", kafkalease.RetryAfter(5*time.Second, "busy"))
			case 4:
				return &kafkalease.HandlerError{Failure: kafkalease.Failure{Reject: true}, Err: errors.New("cause")}
			}
			return nil
		})
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	if stats != (kafkalease.ConsumeStats{Accepted: 2, Retried: 2, Rejected: 2}) {
		t.Fatalf("stats %+v", stats)
	}
	if f.delivers[0].GetMaxInFlight() != 2 {
		t.Fatalf("max in flight %d, want the concurrency", f.delivers[0].GetMaxInFlight())
	}
	byOffset := map[int64]*kafkaleasev1.Acknowledgement{}
	for _, a := range f.allAcks() {
		byOffset[a.GetOffset()] = a
	}
	want := map[int64]*kafkaleasev1.Acknowledgement{
		0: {Offset: 0, Type: kafkaleasev1.AckType_ACK_TYPE_ACCEPT, Attempt: 1},
		1: {Offset: 1, Type: kafkaleasev1.AckType_ACK_TYPE_REJECT, Attempt: 1, Reason: "bad record"},
		2: {Offset: 2, Type: kafkaleasev1.AckType_ACK_TYPE_RETRY, Attempt: 3, RetryDelay: durationpb.New(150 * time.Millisecond), Reason: "boom"},
		3: {Offset: 3, Type: kafkaleasev1.AckType_ACK_TYPE_RETRY, Attempt: 1, RetryDelay: durationpb.New(5 * time.Second), Reason: "busy"},
		4: {Offset: 4, Type: kafkaleasev1.AckType_ACK_TYPE_REJECT, Attempt: 1, Reason: "reject: cause"},
		5: {Offset: 5, Type: kafkaleasev1.AckType_ACK_TYPE_ACCEPT, Attempt: 1},
	}
	for o, w := range want {
		if !proto.Equal(byOffset[o], w) {
			t.Errorf("ack of %d: %v, want %v", o, byOffset[o], w)
		}
	}
}

// lateDeadline is a context whose deadline has been sent to the gateway with the calls
// made under it (as grpc-timeout) but whose own timer has not fired yet: Done and Err stay
// open until the test cancels it. It holds open the window, a few microseconds wide with a
// real context, in which the gateway ends a call at the caller's deadline before the
// caller's context sees that deadline.
type lateDeadline struct {
	context.Context
	deadline time.Time
}

func (c lateDeadline) Deadline() (time.Time, bool) { return c.deadline, true }

// newLateDeadline is a lateDeadline d from now, cancelled when the test ends.
func newLateDeadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return lateDeadline{Context: ctx, deadline: time.Now().Add(d)}
}

// endAtTheDeadline serves a stream as a gateway does at the caller's deadline: it waits for
// the stream's context (whose deadline is the caller's, from grpc-timeout) and ends the call
// with its error, DEADLINE_EXCEEDED.
func endAtTheDeadline(ctx context.Context) error {
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

func TestConsumeEndedByItsDeadlineReturnsNil(t *testing.T) {
	// The gateway's copy of the deadline ends the Deliver first: the status reaches the client
	// before its own context has ended.
	f := newQueueFake()
	f.deliver = func(_ int, s kafkaleasev1.PartitionLeaseService_DeliverServer) error {
		if err := s.Send(deliveries(1, 0)); err != nil {
			return err
		}
		return endAtTheDeadline(s.Context())
	}
	client := startFake(t, f)
	lease, err := client.Acquire(testContext(t, 20*time.Second), "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	ctx := newLateDeadline(t, 200*time.Millisecond)
	stats, err := lease.Consume(ctx, kafkalease.ConsumeOptions{}, func(context.Context, *kafkalease.Delivery) error { return nil })
	if err != nil {
		t.Fatalf("consume ended by its deadline, the gateway's side first: %v", err)
	}
	if stats.Accepted != 1 {
		t.Fatalf("stats %+v", stats)
	}
	// What the deliveries end with unwraps to the deadline, as when the context saw it first.
	for _, err := range lease.Deliveries(newLateDeadline(t, 100*time.Millisecond), kafkalease.QueueOptions{}) {
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("deliveries ended by the gateway at the deadline: %v", err)
			}
			break
		}
	}

	// The same with real contexts, the two ends racing: nil every time.
	for i := range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := lease.Consume(ctx, kafkalease.ConsumeOptions{}, func(context.Context, *kafkalease.Delivery) error { return nil })
		cancel()
		if err != nil {
			t.Fatalf("run %d: consume ended by its deadline: %v", i, err)
		}
	}
}
