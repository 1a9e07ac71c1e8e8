package kafkalease

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// defaultTTL is the contract's default, assumed when the gateway does not say which TTL it
// granted.
const defaultTTL = 10 * time.Second

// Lease is an exclusive, expiring lease on one partition, from Client.Acquire. It stays
// alive while a Read (Records or Batches) is open, and for TTL after the last call on it
// otherwise; dropping it does not release it. Its methods are safe for concurrent use: one
// goroutine may read while another seeks or commits.
type Lease struct {
	leaseCalls
	// The consumer group, topic and partition leased.
	Group     string
	Topic     string
	Partition int32
	// Greater than every token issued before for this (group, topic, partition).
	FencingToken uint64
	// Where reading starts: the group's committed offset, else the OffsetReset position.
	Offset int64
	// The partition's high watermark at Acquire.
	HighWatermark int64
	// When the lease expires if nothing renews it, as of Acquire (not updated).
	ExpiresAt time.Time
	// The gateway instance serving the lease (calls may reach any instance).
	Gateway string
	// The TTL as granted.
	TTL time.Duration

	acks *acker // its queue's answers (Deliveries, Consume)
}

func newLease(c *Client, r *kafkaleasev1.AcquireResponse, group string, ttl time.Duration) *Lease {
	l := &Lease{
		leaseCalls:    leaseCalls{client: c, id: r.GetLeaseId(), epochs: &epochFilter{}},
		Group:         r.GetGroup(),
		Topic:         r.GetTopic(),
		Partition:     r.GetPartition(),
		FencingToken:  r.GetFencingToken(),
		Offset:        r.GetOffset(),
		HighWatermark: r.GetHighWatermark(),
		Gateway:       r.GetGateway(),
		TTL:           ttl,
	}
	l.acks = &acker{client: c, leaseID: l.id}
	if l.Group == "" {
		l.Group = group
	}
	if r.GetExpiresAt() != nil {
		l.ExpiresAt = r.GetExpiresAt().AsTime()
	}
	if r.GetTtl() != nil {
		l.TTL = r.GetTtl().AsDuration()
	} else if l.TTL == 0 {
		l.TTL = defaultTTL
	}
	return l
}

// String describes the lease without its id, which is a bearer credential.
func (l *Lease) String() string {
	return fmt.Sprintf("lease on %s/%d for group %s (token %d, from offset %d)",
		l.Topic, l.Partition, l.Group, l.FencingToken, l.Offset)
}

// leaseCalls are the calls on a lease, shared by Lease and SubscribedLease.
type leaseCalls struct {
	client *Client
	id     string
	epochs *epochFilter
}

// ID is the opaque lease id. A bearer credential: whoever has it can commit and release,
// so do not log it.
func (l *leaseCalls) ID() string { return l.id }

// SeekEpoch is the newest seek epoch seen for this lease (0 until the first Seek).
func (l *leaseCalls) SeekEpoch() uint64 { return l.epochs.newest.Load() }

// Commit stores offset (the next offset to read: last processed + 1) as the group's
// committed offset, fenced by the lease. It also moves the lease's resume point there.
// FAILED_PRECONDITION (WRONG_MODE) on a lease in queue mode: the gateway commits for it.
func (l *leaseCalls) Commit(ctx context.Context, offset int64) error {
	return l.commit(ctx, offset, nil)
}

// CommitWithMetadata is Commit storing metadata with the offset (at most 4057 bytes).
func (l *leaseCalls) CommitWithMetadata(ctx context.Context, offset int64, metadata string) error {
	return l.commit(ctx, offset, &metadata)
}

func (l *leaseCalls) commit(ctx context.Context, offset int64, metadata *string) error {
	_, err := l.client.raw.Commit(ctx, &kafkaleasev1.CommitRequest{LeaseId: l.id, Offset: offset, Metadata: metadata})
	if err != nil {
		return wrap(ctx, err)
	}
	return nil
}

// SeekTo is where Seek goes: SeekOffset, SeekTimestamp, SeekEarliest, SeekLatest or
// SeekCommitted.
type SeekTo struct {
	set func(*kafkaleasev1.SeekRequest)
}

// SeekOffset goes to an absolute offset (log start ..= high watermark).
func SeekOffset(offset int64) SeekTo {
	return SeekTo{func(r *kafkaleasev1.SeekRequest) { r.Position = &kafkaleasev1.SeekRequest_Offset{Offset: offset} }}
}

// SeekTimestamp goes to the first record whose timestamp is at or after t (the high
// watermark if none).
func SeekTimestamp(t time.Time) SeekTo {
	return SeekTo{func(r *kafkaleasev1.SeekRequest) {
		r.Position = &kafkaleasev1.SeekRequest_Timestamp{Timestamp: timestamppb.New(t)}
	}}
}

// SeekEarliest goes to the log start offset.
func SeekEarliest() SeekTo {
	return SeekTo{func(r *kafkaleasev1.SeekRequest) {
		r.Position = &kafkaleasev1.SeekRequest_Earliest{Earliest: &emptypb.Empty{}}
	}}
}

// SeekLatest goes to the high watermark: only records produced from now on.
func SeekLatest() SeekTo {
	return SeekTo{func(r *kafkaleasev1.SeekRequest) {
		r.Position = &kafkaleasev1.SeekRequest_Latest{Latest: &emptypb.Empty{}}
	}}
}

// SeekCommitted goes to the group's committed offset (else the OffsetReset position).
func SeekCommitted() SeekTo {
	return SeekTo{func(r *kafkaleasev1.SeekRequest) {
		r.Position = &kafkaleasev1.SeekRequest_Committed{Committed: &emptypb.Empty{}}
	}}
}

// SeekResult is what a Seek resolved to.
type SeekResult struct {
	// The first record of the new epoch is at or after this offset.
	Offset int64
	// The lease's new seek epoch.
	SeekEpoch uint64
}

// Seek repositions the lease. Once it returns, the lease's open Read hands out no record
// from before the seek: the next one is at SeekResult.Offset (or the next existing one).
// Commits nothing. OUT_OF_RANGE (OFFSET_OUT_OF_RANGE, Metadata "low" and "high") for an
// offset outside the log; FAILED_PRECONDITION (WRONG_MODE) on a lease in queue mode.
func (l *leaseCalls) Seek(ctx context.Context, to SeekTo) (SeekResult, error) {
	req := &kafkaleasev1.SeekRequest{LeaseId: l.id}
	if to.set != nil {
		to.set(req)
	}
	resp, err := l.client.raw.Seek(ctx, req)
	if err != nil {
		return SeekResult{}, wrap(ctx, err)
	}
	l.epochs.observe(resp.GetSeekEpoch())
	return SeekResult{Offset: resp.GetOffset(), SeekEpoch: resp.GetSeekEpoch()}, nil
}

// Release ends the lease: its open Read ends (the iteration stops with no error) and
// another client can acquire the partition at once. NOT_FOUND (LEASE_NOT_FOUND) if it had
// ended already. A lease in queue mode commits its queue's progress first (what is done),
// and its open Deliveries end with no error.
func (l *leaseCalls) Release(ctx context.Context) error {
	return l.release(ctx, nil)
}

// ReleaseWithCommit commits offset (fenced, as Commit) and then ends the lease. If the
// commit is rejected the lease is kept. Not for a lease in queue mode (WRONG_MODE): use
// Release.
func (l *leaseCalls) ReleaseWithCommit(ctx context.Context, offset int64) error {
	return l.release(ctx, &offset)
}

func (l *leaseCalls) release(ctx context.Context, commit *int64) error {
	_, err := l.client.raw.Release(ctx, &kafkaleasev1.ReleaseRequest{LeaseId: l.id, CommitOffset: commit})
	if err != nil {
		return wrap(ctx, err)
	}
	return nil
}

// epochFilter holds the newest seek epoch seen for a lease, shared by Seek (which raises
// it) and the lease's reads (which drop responses of older epochs).
type epochFilter struct {
	newest atomic.Uint64
}

// observe records an epoch from a SeekResponse; it never lowers the newest one.
func (f *epochFilter) observe(epoch uint64) {
	for {
		cur := f.newest.Load()
		if epoch <= cur || f.newest.CompareAndSwap(cur, epoch) {
			return
		}
	}
}

// admit reports whether a response of epoch may be handed out (no newer epoch seen), and
// makes it the newest seen.
func (f *epochFilter) admit(epoch uint64) bool {
	for {
		cur := f.newest.Load()
		if epoch < cur {
			return false
		}
		if epoch == cur || f.newest.CompareAndSwap(cur, epoch) {
			return true
		}
	}
}
