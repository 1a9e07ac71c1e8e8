package kafkalease

import (
	"context"
	"errors"
	"io"
	"iter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// DefaultReconnectAttempts is how many times in a row a broken Read (or Deliver) is reopened
// before its error reaches the caller.
const DefaultReconnectAttempts = 8

const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = 2 * time.Second
)

// Record is a Kafka record with every field as the broker stored it. A nil Key, Value or
// Header.Value is absent (null key, tombstone, null header value); a non-nil empty slice
// is present and empty. Keep them apart: len() is 0 for both.
type Record struct {
	Offset int64
	Key    []byte
	Value  []byte
	// In the order the producer wrote them, duplicate keys kept.
	Headers []Header
	// The record's timestamp; the zero time when it has none.
	Timestamp     time.Time
	TimestampType kafkaleasev1.TimestampType
}

// Header is a Kafka record header; a nil Value is a null value, distinct from an empty one.
type Header struct {
	Key   string
	Value []byte
}

// IsTombstone reports whether the record has a null value.
func (r Record) IsTombstone() bool { return r.Value == nil }

func recordFromProto(p *kafkaleasev1.KafkaRecord) Record {
	r := Record{Offset: p.GetOffset(), Key: p.GetKey(), Value: p.GetValue(), TimestampType: p.GetTimestampType()}
	if p.GetTimestamp() != nil {
		r.Timestamp = p.GetTimestamp().AsTime()
	}
	if len(p.GetHeaders()) > 0 {
		r.Headers = make([]Header, len(p.GetHeaders()))
		for i, h := range p.GetHeaders() {
			r.Headers[i] = Header{Key: h.GetKey(), Value: h.GetValue()}
		}
	}
	return r
}

// Batch is one response of a Read (or one records event of a subscription): consecutive
// records of the partition in offset order.
type Batch struct {
	Records []Record
	// The partition's high watermark as last seen by the gateway.
	HighWatermark int64
	// The lease's seek epoch the records belong to.
	SeekEpoch uint64
	// The gateway's ReadResponse.next_offset (0 when it has none).
	after int64
}

// NextOffset is the offset to commit once the batch is processed: last offset + 1, or
// further when the offsets after it hold no record (a transaction's marker); false for an
// empty batch.
func (b Batch) NextOffset() (int64, bool) {
	if len(b.Records) == 0 {
		return 0, false
	}
	return max(b.Records[len(b.Records)-1].Offset+1, b.after), true
}

func batchFromProto(records []*kafkaleasev1.KafkaRecord, hwm int64, epoch uint64, after int64) Batch {
	b := Batch{Records: make([]Record, len(records)), HighWatermark: hwm, SeekEpoch: epoch, after: after}
	for i, r := range records {
		b.Records[i] = recordFromProto(r)
	}
	return b
}

// ReadOptions are the optional settings of a Read. The zero value leaves everything to the
// gateway and reopens a broken Read up to DefaultReconnectAttempts times.
type ReadOptions struct {
	// Most records per response (gateway default 500; at most 10000).
	MaxRecords uint32
	// Most bytes per response (gateway default 1 MiB; at most 4 MiB). A bound: the
	// gateway sends at most 256 KiB of records per response whatever this allows.
	MaxBytes uint32
	// How long the gateway may wait to fill a batch (gateway default 100 ms; 0 ..= 10 s).
	MaxWait *time.Duration
	// Start here (as a Seek would) instead of at the lease's resume point.
	FromOffset *int64
	// Consecutive reopen attempts after the stream broke; 0: DefaultReconnectAttempts;
	// negative: never reopen.
	ReconnectAttempts int
}

// Records reads the leased partition: its records in offset order, with no gaps and no
// repeats, for as long as the lease is held. The Read opens when the iteration starts and
// closes when it stops (break, or ctx ends); it ends with no error after Release.
//
// Records of a seek epoch older than the newest one the lease has seen are dropped, even
// the rest of a batch already received: once Seek returns, the next record is the sought
// one. When the stream breaks (connection lost, or UNAVAILABLE with the gateway's
// RetryInfo) it is reopened from the offset after the last record handed out. Any other
// error is yielded once, with a zero Record, and ends the iteration: an *Error, e.g.
// FAILED_PRECONDITION (LEASE_EXPIRED, LEASE_LOST; WRONG_MODE on a lease in queue mode) or
// ABORTED (SUPERSEDED: a newer Read on the lease took over); one that unwraps to ctx.Err()
// when ctx ended.
func (l *Lease) Records(ctx context.Context, opts ReadOptions) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		r := l.newReader(opts)
		defer r.close()
		for {
			resp, err := r.next(ctx)
			if err != nil {
				if err != io.EOF {
					yield(Record{}, err)
				}
				return
			}
			for _, p := range resp.GetRecords() {
				// Checked per record: a Seek made while the caller handles this batch drops
				// the rest of it.
				if !l.epochs.admit(resp.GetSeekEpoch()) {
					break
				}
				r.handedOut(p.GetOffset()+1, resp.GetSeekEpoch())
				if !yield(recordFromProto(p), nil) {
					return
				}
			}
		}
	}
}

// Batches is Records one response at a time, for callers that process and commit in
// batches.
func (l *Lease) Batches(ctx context.Context, opts ReadOptions) iter.Seq2[Batch, error] {
	return func(yield func(Batch, error) bool) {
		r := l.newReader(opts)
		defer r.close()
		for {
			resp, err := r.next(ctx)
			if err != nil {
				if err != io.EOF {
					yield(Batch{}, err)
				}
				return
			}
			if !l.epochs.admit(resp.GetSeekEpoch()) || len(resp.GetRecords()) == 0 {
				continue
			}
			b := batchFromProto(resp.GetRecords(), resp.GetHighWatermark(), resp.GetSeekEpoch(), resp.GetNextOffset())
			next, _ := b.NextOffset()
			r.handedOut(next, b.SeekEpoch)
			if !yield(b, nil) {
				return
			}
		}
	}
}

// reader is one Read of a lease, reopened as needed.
type reader struct {
	lease    *Lease
	opts     ReadOptions
	attempts int

	opened     bool
	stream     grpc.ServerStreamingClient[kafkaleasev1.ReadResponse]
	cancel     context.CancelFunc
	startEpoch uint64

	delivered bool   // a record was handed out
	resume    int64  // the offset after the last record handed out
	epoch     uint64 // and the epoch it belonged to
	failures  int    // failed reopen attempts since the last response handed out
}

func (l *Lease) newReader(opts ReadOptions) *reader {
	attempts := opts.ReconnectAttempts
	if attempts == 0 {
		attempts = DefaultReconnectAttempts
	}
	return &reader{lease: l, opts: opts, attempts: attempts, startEpoch: l.epochs.newest.Load()}
}

func (r *reader) handedOut(next int64, epoch uint64) {
	r.delivered, r.resume, r.epoch, r.failures = true, next, epoch, 0
}

// from is where a reopened Read starts: after the last record handed out, while the lease
// is still at that record's seek epoch (the gateway checks, so a Seek racing the reopen
// wins), unless a Seek is known to have happened since (then the lease's resume point,
// which the Seek set). Before anything was handed out: the caller's FromOffset, unless a
// Seek happened since the Read started.
func (r *reader) from() (offset *int64, ifSeekEpoch *uint64) {
	newest := r.lease.epochs.newest.Load()
	switch {
	case r.delivered && newest <= r.epoch:
		resume, epoch := r.resume, r.epoch
		return &resume, &epoch
	case !r.delivered && newest == r.startEpoch:
		return r.opts.FromOffset, nil
	}
	return nil, nil
}

func (r *reader) close() {
	if r.cancel != nil {
		r.cancel()
	}
	r.stream, r.cancel = nil, nil
}

// next is the next response of the newest epoch (stale ones skipped), io.EOF when the
// gateway ended the Read with OK.
func (r *reader) next(ctx context.Context) (*kafkaleasev1.ReadResponse, error) {
	for {
		if r.stream == nil {
			req := &kafkaleasev1.ReadRequest{
				LeaseId:    r.lease.id,
				MaxRecords: r.opts.MaxRecords,
				MaxBytes:   r.opts.MaxBytes,
				FromOffset: r.opts.FromOffset,
			}
			if r.opened {
				req.FromOffset, req.IfSeekEpoch = r.from()
			}
			if r.opts.MaxWait != nil {
				req.MaxWait = durationpb.New(*r.opts.MaxWait)
			}
			r.opened = true
			sctx, cancel := context.WithCancel(ctx)
			stream, err := r.lease.client.raw.Read(sctx, req)
			if err != nil {
				cancel()
				if r.retry(ctx, err) {
					continue
				}
				return nil, wrap(ctx, err)
			}
			r.stream, r.cancel = stream, cancel
		}
		resp, err := r.stream.Recv()
		if err != nil {
			r.close()
			if err == io.EOF {
				return nil, io.EOF
			}
			if r.retry(ctx, err) {
				continue
			}
			return nil, wrap(ctx, err)
		}
		if resp.GetSeekEpoch() < r.lease.epochs.newest.Load() {
			continue // stale: a Seek was made since
		}
		return resp, nil
	}
}

// retry reports whether err broke the stream (not the lease) and a reopen is due, after
// waiting the backoff.
func (r *reader) retry(ctx context.Context, err error) bool {
	if ctx.Err() != nil || r.attempts < 0 || r.failures >= r.attempts || !streamBroke(err) {
		return false
	}
	backoff := min(firstBackoff<<min(r.failures, 6), maxBackoff)
	r.failures++
	return sleep(ctx, backoff) == nil
}

// streamBroke reports whether a status that ended a Read says the stream broke rather than
// the lease. With a reason, the gateway's RetryInfo decides (Kafka or Consul unreachable
// carries one; a lease that ended or a superseded Read none). Without one the status was
// made up by gRPC or an intermediary: the connection dropped.
func streamBroke(err error) bool {
	e := ParseError(err)
	if e.Reason != "" {
		return e.HasRetryDelay
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch e.Code {
	case codes.Unavailable, codes.Unknown, codes.Internal, codes.Canceled:
		return true
	}
	return false
}
