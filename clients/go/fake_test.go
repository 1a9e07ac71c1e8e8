package kafkalease_test

// Tests against an in-process fake gateway on loopback, which fails exactly where a test
// needs it to: they always run.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

type fakeGateway struct {
	kafkaleasev1.UnimplementedPartitionLeaseServiceServer
	mu       sync.Mutex
	acquires int
	// acquireErrs are answered to the first Acquires, in order; then a lease.
	acquireErrs []error
	reads       []*kafkaleasev1.ReadRequest
	// read serves the n-th Read (from 0).
	read  func(n int, req *kafkaleasev1.ReadRequest, stream kafkaleasev1.PartitionLeaseService_ReadServer) error
	seeks chan int64
}

func (f *fakeGateway) Acquire(_ context.Context, req *kafkaleasev1.AcquireRequest) (*kafkaleasev1.AcquireResponse, error) {
	f.mu.Lock()
	n := f.acquires
	f.acquires++
	f.mu.Unlock()
	if n < len(f.acquireErrs) {
		return nil, f.acquireErrs[n]
	}
	return &kafkaleasev1.AcquireResponse{LeaseId: "ref.secret", Topic: req.GetTopic(), Partition: req.GetPartition(),
		FencingToken: 42, Offset: 0, HighWatermark: 10, Group: req.GetGroup(), Gateway: "fake",
		ExpiresAt: timestamppb.New(time.Unix(2_000_000_000, 0)), Ttl: durationpb.New(7 * time.Second)}, nil
}

func (f *fakeGateway) Read(req *kafkaleasev1.ReadRequest, stream kafkaleasev1.PartitionLeaseService_ReadServer) error {
	f.mu.Lock()
	n := len(f.reads)
	f.reads = append(f.reads, req)
	f.mu.Unlock()
	return f.read(n, req, stream)
}

func (f *fakeGateway) Seek(_ context.Context, req *kafkaleasev1.SeekRequest) (*kafkaleasev1.SeekResponse, error) {
	offset := req.GetOffset()
	f.seeks <- offset
	return &kafkaleasev1.SeekResponse{Offset: offset, SeekEpoch: 1}, nil
}

// startFake serves f on loopback and connects a client to it.
func startFake(t *testing.T, f kafkaleasev1.PartitionLeaseServiceServer) *kafkalease.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	kafkaleasev1.RegisterPartitionLeaseServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	client, err := kafkalease.NewClient(ln.Addr().String())
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() { _ = client.Close(); srv.Stop() })
	return client
}

// gatewayError is a status as the gateway sends it: ErrorInfo, and RetryInfo when retry > 0.
func gatewayError(code codes.Code, reason string, metadata map[string]string, retry time.Duration) error {
	st, _ := status.New(code, "fake: "+reason).WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: "kafka-lease", Metadata: metadata})
	if retry > 0 {
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	return st.Err()
}

func send(stream kafkaleasev1.PartitionLeaseService_ReadServer, epoch uint64, offsets ...int64) error {
	resp := &kafkaleasev1.ReadResponse{HighWatermark: 10, SeekEpoch: epoch}
	for _, o := range offsets {
		resp.Records = append(resp.Records, &kafkaleasev1.KafkaRecord{Offset: o, Value: []byte(fmt.Sprint(o))})
	}
	return stream.Send(resp)
}

func TestAcquireRetriesOnlyWhileTheGatewaySaysItCanSucceed(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	kafkaDown := gatewayError(codes.Unavailable, "KAFKA_UNAVAILABLE", nil, 10*time.Millisecond)
	f := &fakeGateway{acquireErrs: []error{kafkaDown, kafkaDown}}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{Partition: p0})
	if err != nil || f.acquires != 3 {
		t.Fatalf("acquire after two retryable errors: %v after %d calls", err, f.acquires)
	}
	if lease.ID() != "ref.secret" || lease.FencingToken != 42 || lease.TTL != 7*time.Second ||
		!lease.ExpiresAt.Equal(time.Unix(2_000_000_000, 0)) || lease.Group != "g" {
		t.Fatalf("lease %+v", lease)
	}

	f = &fakeGateway{acquireErrs: []error{kafkaDown, kafkaDown, kafkaDown, kafkaDown}}
	_, err = startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{MaxAttempts: 3})
	if e := asError(t, err); e.Reason != "KAFKA_UNAVAILABLE" || !e.IsRetryable() || e.RetryDelay != 10*time.Millisecond || f.acquires != 3 {
		t.Fatalf("bounded attempts: %v after %d calls", err, f.acquires)
	}

	for _, refusal := range []error{
		gatewayError(codes.Unavailable, "SHUTTING_DOWN", map[string]string{"lease_ref": "r"}, 0),
		gatewayError(codes.ResourceExhausted, "PARTITION_BUSY", map[string]string{"holder_member": "m"}, time.Second),
		status.Error(codes.Unavailable, "no details"),
	} {
		f = &fakeGateway{acquireErrs: []error{refusal}}
		_, err = startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
		if e := asError(t, err); f.acquires != 1 || e.Code != status.Code(refusal) {
			t.Fatalf("%v: %v after %d calls, want no retry", refusal, err, f.acquires)
		}
	}
}

func TestReadReopensRightAfterTheLastRecordHandedOut(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := &fakeGateway{read: func(n int, req *kafkaleasev1.ReadRequest, s kafkaleasev1.PartitionLeaseService_ReadServer) error {
		switch n {
		case 0:
			if err := send(s, 0, 0, 1, 2); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "connection reset") // as gRPC reports a cut
		case 1:
			return gatewayError(codes.Unavailable, "KAFKA_UNAVAILABLE", nil, time.Millisecond)
		default:
			for _, b := range [][]int64{{3, 4, 5}, {6, 7, 8, 9}} {
				if err := send(s, 1, b...); err != nil {
					return err
				}
			}
			return nil // the lease was released
		}
	}}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	var got []int64
	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{MaxRecords: 3}) {
		if err != nil {
			t.Fatalf("read after %v: %v", got, err)
		}
		got = append(got, rec.Offset)
	}
	if fmt.Sprint(got) != "[0 1 2 3 4 5 6 7 8 9]" || len(f.reads) != 3 {
		t.Fatalf("got %v in %d reads", got, len(f.reads))
	}
	if f.reads[0].FromOffset != nil || f.reads[1].GetFromOffset() != 3 || f.reads[2].GetFromOffset() != 3 ||
		f.reads[1].FromOffset == nil || f.reads[2].FromOffset == nil || f.reads[2].GetMaxRecords() != 3 {
		t.Fatalf("reads %v", f.reads)
	}
	// Only while the lease is still at the epoch of the last record handed out.
	if f.reads[0].IfSeekEpoch != nil || f.reads[1].IfSeekEpoch == nil || f.reads[2].IfSeekEpoch == nil ||
		f.reads[1].GetIfSeekEpoch() != 0 || f.reads[2].GetIfSeekEpoch() != 0 {
		t.Fatalf("reads %v", f.reads)
	}
}

func TestReadReopensAtTheResumePointAfterASeek(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := &fakeGateway{seeks: make(chan int64, 1)}
	f.read = func(n int, _ *kafkaleasev1.ReadRequest, s kafkaleasev1.PartitionLeaseService_ReadServer) error {
		switch n {
		case 0:
			if err := send(s, 0, 0, 1, 2); err != nil {
				return err
			}
			<-f.seeks
			return status.Error(codes.Unavailable, "connection reset")
		case 1:
			if err := send(s, 1, 5, 6); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "connection reset")
		default:
			return nil
		}
	}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	var got []int64
	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
		if err != nil {
			t.Fatalf("read after %v: %v", got, err)
		}
		got = append(got, rec.Offset)
		if rec.Offset == 0 {
			if _, err := lease.Seek(ctx, kafkalease.SeekOffset(5)); err != nil {
				t.Fatalf("seek: %v", err)
			}
		}
	}
	if fmt.Sprint(got) != "[0 5 6]" || len(f.reads) != 3 {
		t.Fatalf("got %v in %d reads", got, len(f.reads))
	}
	// After the Seek: neither, so the Read starts where the Seek put the lease.
	if f.reads[1].FromOffset != nil || f.reads[1].IfSeekEpoch != nil {
		t.Fatalf("reopen after a seek %v", f.reads[1])
	}
	if f.reads[2].GetFromOffset() != 7 || f.reads[2].IfSeekEpoch == nil || f.reads[2].GetIfSeekEpoch() != 1 {
		t.Fatalf("reopen after epoch 1 %v", f.reads[2])
	}
}

func TestReadHandsTheEndOfTheLeaseToTheCaller(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := &fakeGateway{read: func(int, *kafkaleasev1.ReadRequest, kafkaleasev1.PartitionLeaseService_ReadServer) error {
		return gatewayError(codes.FailedPrecondition, "LEASE_EXPIRED", map[string]string{"lease_ref": "ref"}, 0)
	}}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	for _, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
		if e := asError(t, err); !e.IsLeaseEnded() || e.Metadata["lease_ref"] != "ref" {
			t.Fatalf("read: %v", err)
		}
	}
	if len(f.reads) != 1 {
		t.Fatalf("%d reads: a lease that ended is not reopened", len(f.reads))
	}
}

func TestSeekDropsTheRestOfTheBatchInHand(t *testing.T) {
	ctx := testContext(t, 20*time.Second)
	f := &fakeGateway{seeks: make(chan int64, 1)}
	f.read = func(_ int, _ *kafkaleasev1.ReadRequest, s kafkaleasev1.PartitionLeaseService_ReadServer) error {
		if err := send(s, 0, 0, 1, 2, 3, 4, 5); err != nil {
			return err
		}
		to := <-f.seeks
		// A batch of the old epoch still in flight after the Seek answered.
		if err := send(s, 0, 6, 7); err != nil {
			return err
		}
		if err := send(s, 1, to, to+1); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	}
	lease, err := startFake(t, f).Acquire(ctx, "g", "t", kafkalease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	var got []int64
	for rec, err := range lease.Records(ctx, kafkalease.ReadOptions{}) {
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		got = append(got, rec.Offset)
		if rec.Offset == 2 && len(got) == 3 {
			if res, err := lease.Seek(ctx, kafkalease.SeekOffset(1)); err != nil || res.SeekEpoch != 1 {
				t.Fatalf("seek: %v %v", res, err)
			}
		}
		if len(got) == 5 {
			break
		}
	}
	if fmt.Sprint(got) != "[0 1 2 1 2]" {
		t.Fatalf("got %v: records of the old epoch leaked", got)
	}
}

func TestParseError(t *testing.T) {
	if kafkalease.ParseError(nil) != nil {
		t.Fatal("ParseError(nil) is not nil")
	}
	plain := kafkalease.ParseError(errors.New("boom"))
	if plain.Code != codes.Unknown || plain.Reason != "" || plain.Metadata == nil {
		t.Fatalf("plain error: %#v", plain)
	}
	st, _ := status.New(codes.FailedPrecondition, "proxy says no").WithDetails(
		&errdetails.ErrorInfo{Reason: "LEASE_LOST", Domain: "some-proxy"})
	if e := kafkalease.ParseError(st.Err()); e.Reason != "" || e.IsLeaseEnded() {
		t.Fatalf("ErrorInfo of another domain is not the gateway's: %#v", e)
	}
	e := kafkalease.ParseError(gatewayError(codes.ResourceExhausted, "PARTITION_BUSY",
		map[string]string{"holder_member": "w1", "partition": "3"}, 2500*time.Millisecond))
	if e.Reason != "PARTITION_BUSY" || e.Metadata["holder_member"] != "w1" || !e.HasRetryDelay ||
		e.RetryDelay != 2500*time.Millisecond || e.IsRetryable() || status.Code(e) != codes.ResourceExhausted ||
		!kafkalease.IsReason(fmt.Errorf("wrapped: %w", e), kafkaleasev1.ErrorReason_PARTITION_BUSY) {
		t.Fatalf("busy: %#v", e)
	}
}
