// Package kafkalease is a small Go client for kafka-lease: exclusive, expiring leases on
// Kafka partitions for consumer groups, served by a kafka-lease gateway over gRPC.
//
// It wraps the generated stubs of package kafkaleasev1 (usable on their own, see
// [Client.Raw]) with what every caller otherwise writes by hand: Acquire retried while the
// gateway says a retry can succeed, a Read that drops batches made stale by a Seek and
// reopens itself after a broken connection without losing or repeating a record, errors
// with the gateway's machine-readable reason, and Subscribe as a stream of typed events.
//
//	client, err := kafkalease.NewClient("127.0.0.1:50051")
//	lease, err := client.Acquire(ctx, "demo-group", "demo", kafkalease.AcquireOptions{})
//	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
//		if err != nil { ... }
//		process(rec)
//		err = lease.Commit(ctx, rec.Offset+1)
//	}
//
// Queue mode hands a lease's records out one by one, each accepted, retried or rejected to
// a dead letter topic: Lease.Deliveries, or Lease.Consume with a handler.
//
// Cancelling the context given to Records or Subscribe ends the stream; ending a
// subscription leaves the group. A subscription with a SessionGrace resubscribes by itself
// when its stream breaks.
package kafkalease

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// DefaultMaxRecvMsgSize is the largest response the client accepts unless told otherwise:
// 64 MiB. gRPC's default (4 MiB) is too small for the gateway's largest batches, since a
// single record larger than ReadRequest.max_bytes is sent alone.
const DefaultMaxRecvMsgSize = 64 << 20

// DefaultAcquireAttempts is how many times Acquire sends its request when the gateway
// answers UNAVAILABLE with a RetryInfo (Kafka or Consul briefly unreachable, an instance
// shutting down behind a shared address).
const DefaultAcquireAttempts = 5

// Client is a connection to a kafka-lease gateway. It is safe for concurrent use.
type Client struct {
	raw  kafkaleasev1.PartitionLeaseServiceClient
	conn *grpc.ClientConn // nil when the caller owns the connection
}

// NewClient connects to the gateway at target ("host:port", or any gRPC target) in
// plaintext. Options are appended to the defaults (insecure credentials and a 64 MiB
// receive limit), so grpc.WithTransportCredentials, interceptors or a larger
// grpc.MaxCallRecvMsgSize can be passed to replace them. The connection is made lazily, on
// the first call. Close the client when done.
func NewClient(target string, opts ...grpc.DialOption) (*Client, error) {
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(DefaultMaxRecvMsgSize)),
	}, opts...)
	conn, err := grpc.NewClient(target, all...)
	if err != nil {
		return nil, err
	}
	return &Client{raw: kafkaleasev1.NewPartitionLeaseServiceClient(conn), conn: conn}, nil
}

// NewClientFromConn uses a connection the caller made and keeps owning: Close leaves it
// open.
func NewClientFromConn(conn grpc.ClientConnInterface) *Client {
	return &Client{raw: kafkaleasev1.NewPartitionLeaseServiceClient(conn)}
}

// Raw is the generated gRPC client, for calls and options this package does not cover.
func (c *Client) Raw() kafkaleasev1.PartitionLeaseServiceClient { return c.raw }

// Close closes the connection NewClient made. Open streams end.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Ptr returns a pointer to v, for the optional fields of the option structs:
// AcquireOptions{Partition: kafkalease.Ptr[int32](0)}.
func Ptr[T any](v T) *T { return &v }

// AcquireOptions are the optional settings of Acquire. The zero value leaves everything to
// the gateway.
type AcquireOptions struct {
	// The partition to lease; nil: the gateway picks a free one.
	Partition *int32
	// A free-text label of this client (at most 256 bytes), shown in ListLeases and in other
	// clients' PARTITION_BUSY errors.
	Member string
	// How long the lease survives with no open Read and no call on it. 0: the gateway's
	// default (10 s); allowed 1 s ..= 5 min.
	TTL time.Duration
	// How long to wait for the partition to become free. 0: answer at once; at most 5 min.
	Wait time.Duration
	// Where to start when the group has no committed offset (default earliest).
	OffsetReset kafkaleasev1.OffsetReset
	// How many times the request is sent while the gateway answers UNAVAILABLE with a
	// RetryInfo, waiting its retry_delay in between; 0: DefaultAcquireAttempts. The
	// context's deadline bounds the whole.
	MaxAttempts int
}

// Acquire takes an exclusive lease on a partition of topic for group.
//
// Errors are *Error: INVALID_ARGUMENT (INVALID_FIELD), NOT_FOUND (TOPIC_NOT_FOUND,
// PARTITION_NOT_FOUND), RESOURCE_EXHAUSTED (PARTITION_BUSY; Metadata names the holder),
// UNAVAILABLE once the retries are spent.
func (c *Client) Acquire(ctx context.Context, group, topic string, opts AcquireOptions) (*Lease, error) {
	req := &kafkaleasev1.AcquireRequest{
		Group:       group,
		Topic:       topic,
		Partition:   opts.Partition,
		Member:      opts.Member,
		OffsetReset: opts.OffsetReset,
	}
	if opts.TTL != 0 {
		req.Ttl = durationpb.New(opts.TTL)
	}
	if opts.Wait != 0 {
		req.Wait = durationpb.New(opts.Wait)
	}
	attempts := opts.MaxAttempts
	if attempts <= 0 {
		attempts = DefaultAcquireAttempts
	}
	for attempt := 1; ; attempt++ {
		resp, err := c.raw.Acquire(ctx, req)
		if err == nil {
			return newLease(c, resp, group, opts.TTL), nil
		}
		kerr := wrap(ctx, err)
		if kerr.Code != codes.Unavailable || !kerr.HasRetryDelay || attempt >= attempts {
			return nil, kerr
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < kerr.RetryDelay {
			return nil, kerr
		}
		if sleep(ctx, kerr.RetryDelay) != nil {
			return nil, kerr
		}
	}
}

// ListMembers lists the members subscribed to group (of every topic, or of topic when it is
// not empty), across every gateway instance, each with the partitions it holds.
func (c *Client) ListMembers(ctx context.Context, group, topic string) ([]*kafkaleasev1.MemberInfo, error) {
	req := &kafkaleasev1.ListMembersRequest{Group: group}
	if topic != "" {
		req.Topic = &topic
	}
	resp, err := c.raw.ListMembers(ctx, req)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	return resp.GetMembers(), nil
}

// ListLeases lists the held leases (of group and topic where not empty), every page of
// them, ordered by group, topic and partition.
func (c *Client) ListLeases(ctx context.Context, group, topic string) ([]*kafkaleasev1.LeaseInfo, error) {
	req := &kafkaleasev1.ListLeasesRequest{}
	if group != "" {
		req.Group = &group
	}
	if topic != "" {
		req.Topic = &topic
	}
	var all []*kafkaleasev1.LeaseInfo
	for {
		resp, err := c.raw.ListLeases(ctx, req)
		if err != nil {
			return nil, wrap(ctx, err)
		}
		all = append(all, resp.GetLeases()...)
		if resp.GetNextPageToken() == "" {
			return all, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// sleep waits d, or less if ctx ends first (then it returns ctx.Err()).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
