package kafkalease

import (
	"context"
	"fmt"
	"io"
	"iter"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// SubscribeOptions are the optional settings of Subscribe. The zero value leaves
// everything to the gateway.
type SubscribeOptions struct {
	// This member's stable id ([A-Za-z0-9._-], at most 128 characters); empty: the gateway
	// makes one up (Subscription.MemberID).
	MemberID string
	// A free-text label, shown in ListLeases.
	Member string
	// Read limits of each records event, as in ReadOptions.
	MaxRecords uint32
	MaxBytes   uint32
	MaxWait    *time.Duration
	// Where a lease starts when the group has no committed offset (default earliest).
	OffsetReset kafkaleasev1.OffsetReset
	// The most partitions of each topic this member holds; 0: no cap.
	MaxPartitions uint32
	// How long a revoked lease waits for this member's commit; nil: the gateway's default
	// (5 s); allowed 0 ..= 60 s.
	RevokeGrace *time.Duration
	// How long the member keeps its leases after its stream ends, for a Subscribe with the
	// same MemberID and topics to take it over (at most 5 min); 0 (the default): leave at
	// once. It is also how long the subscription resubscribes by itself after its stream
	// broke: with 0 it does not, and a broken stream ends it.
	SessionGrace time.Duration
	// Queue mode for every lease the member is assigned: their records come as Deliveries
	// events, to answer one by one (or run Subscription.Consume), and the gateway commits.
	// MaxInFlight and MaxInFlightBytes are shared by all the member's leases (set
	// MaxInFlight to Consume's concurrency: deliveries waiting for a handler spend their ack
	// deadline); ReconnectAttempts does not apply (SessionGrace says how long to resubscribe).
	// The dead letter topic (DeadLetterTopic, or "dlq.<group>.<topic>" for each topic) must
	// exist. nil: Records events, as a Read.
	Queue *QueueOptions
}

// memberActiveWindow is how long after its stream broke a subscription retries a resubscribe
// refused with MEMBER_ACTIVE: the gateway may not have noticed yet that the old stream, its
// own, is gone (at once for a closed connection, at its next keepalive for a silent one).
// Past it, another live stream holds the member.
const memberActiveWindow = 30 * time.Second

// Subscription is a member of a group, from Client.Subscribe: the gateways share the
// topics' partitions among the group's members and send this one its leases, their records
// and the leases it must give up. The member stays in the group until the subscription
// ends: Close, or the cancellation of the context given to Subscribe (its leases are then
// released, after SessionGrace).
//
// When its stream breaks (the connection drops, or the gateway answers UNAVAILABLE with a
// RetryInfo, as when an instance shuts down) and SessionGrace is set, the subscription
// subscribes again by itself, with the same member id and settings, with backoff, for as
// long as the grace lasts, and its events go on: the gateway takes the member over with the
// leases it still holds, each announced again (Assigned at its resume point, the last
// commit, so records after it come again; or Revoking). See Next.
//
// Next (or Events) is for one goroutine; the leases it hands out may be used from any.
type Subscription struct {
	ctx    context.Context
	cancel context.CancelFunc
	stream grpc.ServerStreamingClient[kafkaleasev1.SubscribeResponse]
	// Ends the stream (Close ends them all).
	endStream context.CancelFunc
	client    *Client
	// The request, with the member id of `joined`, for a resubscribe.
	req      *kafkaleasev1.SubscribeRequest
	grace    time.Duration
	memberID string
	gateway  atomic.Pointer[string]
	leases   map[string]*SubscribedLease
	// The error that ended the subscription, returned by every later Next.
	err error
}

// Event is one event of a subscription: *Assigned, *Records, *Deliveries (in queue mode),
// *Revoking or *Revoked.
type Event interface{ event() }

// Assigned: the member now holds a lease; its records follow.
type Assigned struct {
	Lease *SubscribedLease
	// Where its records start: the group's committed offset, else the reset position.
	Offset        int64
	HighWatermark int64
}

// Records is a batch of one of the member's leases (stale epochs already dropped).
type Records struct {
	Lease *SubscribedLease
	Batch
}

// Deliveries are deliveries of one of the member's leases, in queue mode
// (SubscribeOptions.Queue): answer each (Accept, Retry, Reject) before its deadline; the
// answers go to the lease's own batcher. At Revoking the lease gets no more, and it moves
// once none of its deliveries is in flight (or at the revoke deadline).
type Deliveries struct {
	Lease *SubscribedLease
	// The partition's high watermark as last seen by the gateway.
	HighWatermark int64
	Deliveries    []*Delivery
}

// Revoking: the lease is moving to another member and no records of it follow. Commit what
// was processed before Deadline; the lease is released after that commit, or then.
type Revoking struct {
	Lease    *SubscribedLease
	Deadline time.Time
}

// Revoked: the lease has ended. Reason is an ErrorReason name (LEASE_REVOKED after
// Revoking, LEASE_RELEASED, LEASE_LOST, LEASE_EXPIRED, SHUTTING_DOWN).
type Revoked struct {
	Lease   *SubscribedLease
	Reason  string
	Message string
}

func (*Assigned) event()   {}
func (*Records) event()    {}
func (*Deliveries) event() {}
func (*Revoking) event()   {}
func (*Revoked) event()    {}

// SubscribedLease is one of a member's leases: commit, seek or release it like a Lease.
// Every event of the lease carries the same *SubscribedLease.
type SubscribedLease struct {
	leaseCalls
	Topic        string
	Partition    int32
	FencingToken uint64

	acks *acker // its deliveries' answers, in queue mode
}

// String describes the lease without its id, which is a bearer credential.
func (l *SubscribedLease) String() string {
	return fmt.Sprintf("subscribed lease on %s/%d (token %d)", l.Topic, l.Partition, l.FencingToken)
}

// Subscribe joins group as a member for topics and returns once the gateway confirmed it
// (the `joined` event). Errors: INVALID_ARGUMENT (INVALID_FIELD), NOT_FOUND
// (TOPIC_NOT_FOUND), ALREADY_EXISTS (MEMBER_ACTIVE), UNAVAILABLE.
func (c *Client) Subscribe(ctx context.Context, group string, topics []string, opts SubscribeOptions) (*Subscription, error) {
	req := &kafkaleasev1.SubscribeRequest{
		Group:         group,
		Topics:        topics,
		Member:        opts.Member,
		MemberId:      opts.MemberID,
		MaxRecords:    opts.MaxRecords,
		MaxBytes:      opts.MaxBytes,
		OffsetReset:   opts.OffsetReset,
		MaxPartitions: opts.MaxPartitions,
	}
	if opts.MaxWait != nil {
		req.MaxWait = durationpb.New(*opts.MaxWait)
	}
	if opts.RevokeGrace != nil {
		req.RevokeGrace = durationpb.New(*opts.RevokeGrace)
	}
	if opts.SessionGrace != 0 {
		req.SessionGrace = durationpb.New(opts.SessionGrace)
	}
	if opts.Queue != nil {
		req.Queue = opts.Queue.settings()
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &Subscription{ctx: sctx, cancel: cancel, client: c, req: req, grace: opts.SessionGrace,
		leases: map[string]*SubscribedLease{}}
	if err := s.open(); err != nil {
		cancel()
		return nil, wrap(ctx, err)
	}
	return s, nil
}

// open sends the Subscribe and waits for `joined`; the member id it names is the one a
// resubscribe asks for.
func (s *Subscription) open() error {
	ctx, cancel := context.WithCancel(s.ctx)
	stream, err := s.client.raw.Subscribe(ctx, s.req)
	if err == nil {
		var first *kafkaleasev1.SubscribeResponse
		if first, err = stream.Recv(); err == nil {
			if joined := first.GetJoined(); joined != nil {
				if s.endStream != nil {
					s.endStream()
				}
				s.stream, s.endStream = stream, cancel
				if s.memberID == "" { // a resubscribe asks for it: it stays
					s.memberID = joined.GetMemberId()
					s.req.MemberId = s.memberID
				}
				gateway := joined.GetGateway()
				s.gateway.Store(&gateway)
				return nil
			}
			err = status.Errorf(codes.Internal, "the subscription's first event was not `joined`: %v", first)
		} else if err == io.EOF {
			err = status.Error(codes.Internal, "the subscription ended before `joined`")
		}
	}
	cancel()
	return err
}

// resubscribe subscribes again after the stream broke with cause, with backoff, within the
// session grace; the error that ends the subscription otherwise.
func (s *Subscription) resubscribe(cause error) error {
	if s.ctx.Err() != nil {
		return ctxError(s.ctx)
	}
	if s.grace <= 0 || !streamBroke(cause) {
		return wrap(s.ctx, cause)
	}
	broke := time.Now()
	until := broke.Add(s.grace)
	last := cause
	for failures := 0; ; failures++ {
		backoff := min(firstBackoff<<min(failures, 6), maxBackoff)
		if time.Now().Add(backoff).After(until) {
			return wrap(s.ctx, last)
		}
		if sleep(s.ctx, backoff) != nil {
			return ctxError(s.ctx)
		}
		err := s.open()
		if err == nil {
			return nil
		}
		if s.ctx.Err() != nil {
			return ctxError(s.ctx)
		}
		last = err
		// MEMBER_ACTIVE early on: the gateway has not seen the old stream, ours, end yet.
		ownStream := IsReason(ParseError(err), kafkaleasev1.ErrorReason_MEMBER_ACTIVE) && time.Since(broke) < memberActiveWindow
		if !streamBroke(err) && !ownStream {
			return wrap(s.ctx, err)
		}
	}
}

// MemberID is this member's id (the one asked for, or the gateway's).
func (s *Subscription) MemberID() string { return s.memberID }

// Gateway is the gateway instance serving the subscription (the newest, after a
// resubscribe).
func (s *Subscription) Gateway() string { return *s.gateway.Load() }

// Close ends the subscription: the member leaves the group and its leases are released
// (after SessionGrace). Next then fails with an error that unwraps to context.Canceled.
func (s *Subscription) Close() error {
	s.cancel()
	return nil
}

// Next waits for the next event. It returns io.EOF when the gateway ended the stream with
// OK, an *Error when it ended otherwise, or one that unwraps to context.Canceled after
// Close; the subscription is over then.
//
// A broken stream is not an error while SessionGrace allows a resubscribe (see
// Subscription): Next subscribes again and goes on with the new stream's events. The
// leases still held come again as Assigned (the same *SubscribedLease, Offset at its resume
// point: records after the last commit are delivered again) or Revoking; a lease that
// ended while the stream was down is not announced (calls on it fail with a lease-ended
// error). A resubscribe refused for other reasons than the connection ends the
// subscription with that error: INVALID_ARGUMENT, PERMISSION_DENIED, ALREADY_EXISTS
// (MEMBER_ACTIVE: another live stream holds the member; retried for 30 s at most, as the
// gateway may not have seen the old stream end), as does the end of the grace (the last
// error).
func (s *Subscription) Next() (Event, error) {
	if s.err != nil {
		return nil, s.err
	}
	for {
		resp, err := s.stream.Recv()
		if err == io.EOF {
			s.err = io.EOF
			return nil, io.EOF
		}
		if err != nil {
			if err := s.resubscribe(err); err != nil {
				s.err = err
				return nil, err
			}
			continue
		}
		switch ev := resp.GetEvent().(type) {
		case *kafkaleasev1.SubscribeResponse_Assigned:
			a := ev.Assigned
			l := s.lease(a.GetLeaseId(), a.GetTopic(), a.GetPartition())
			l.FencingToken = a.GetFencingToken()
			return &Assigned{Lease: l, Offset: a.GetOffset(), HighWatermark: a.GetHighWatermark()}, nil
		case *kafkaleasev1.SubscribeResponse_Records:
			r := ev.Records
			l := s.lease(r.GetLeaseId(), r.GetTopic(), r.GetPartition())
			if !l.epochs.admit(r.GetSeekEpoch()) || len(r.GetRecords()) == 0 {
				continue
			}
			return &Records{Lease: l, Batch: batchFromProto(r.GetRecords(), r.GetHighWatermark(), r.GetSeekEpoch(), 0)}, nil
		case *kafkaleasev1.SubscribeResponse_Deliveries:
			r := ev.Deliveries
			l := s.lease(r.GetLeaseId(), r.GetTopic(), r.GetPartition())
			ds := make([]*Delivery, 0, len(r.GetDeliveries()))
			for _, p := range r.GetDeliveries() {
				if d := deliveryFromProto(p, l.Topic, l.Partition, l.acks); d != nil {
					ds = append(ds, d)
				}
			}
			if len(ds) == 0 {
				continue
			}
			return &Deliveries{Lease: l, HighWatermark: r.GetHighWatermark(), Deliveries: ds}, nil
		case *kafkaleasev1.SubscribeResponse_Revoking:
			r := ev.Revoking
			return &Revoking{Lease: s.lease(r.GetLeaseId(), r.GetTopic(), r.GetPartition()), Deadline: r.GetDeadline().AsTime()}, nil
		case *kafkaleasev1.SubscribeResponse_Revoked:
			r := ev.Revoked
			l := s.lease(r.GetLeaseId(), r.GetTopic(), r.GetPartition())
			delete(s.leases, r.GetLeaseId())
			return &Revoked{Lease: l, Reason: r.GetReason(), Message: r.GetMessage()}, nil
		}
		// An event this version does not know: skipped.
	}
}

// Events is Next as an iterator: it stops after io.EOF, and yields any other error once
// before stopping.
func (s *Subscription) Events() iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		for {
			ev, err := s.Next()
			if err == io.EOF {
				return
			}
			if !yield(ev, err) || err != nil {
				return
			}
		}
	}
}

// lease is the handle of a lease id, made on its first event.
func (s *Subscription) lease(id, topic string, partition int32) *SubscribedLease {
	l, ok := s.leases[id]
	if !ok {
		l = &SubscribedLease{leaseCalls: leaseCalls{client: s.client, id: id, epochs: &epochFilter{}},
			Topic: topic, Partition: partition, acks: &acker{client: s.client, leaseID: id}}
		s.leases[id] = l
	}
	return l
}
