package kafkalease

import (
	"context"
	"fmt"
	"io"
	"iter"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// The orderings of a queue (QueueOptions.Ordering).
const (
	// One record at a time, in offset order: the next is delivered once the last is done.
	// The default.
	OrderPartition = kafkaleasev1.DeliveryOrder_DELIVERY_ORDER_PARTITION
	// The records of one key one at a time, in offset order; keys in parallel. A record
	// being retried holds back its key only. Records without a key are ordered by nothing.
	OrderKey = kafkaleasev1.DeliveryOrder_DELIVERY_ORDER_KEY
	// Any record, in parallel.
	OrderUnordered = kafkaleasev1.DeliveryOrder_DELIVERY_ORDER_UNORDERED
)

const (
	// The most acknowledgements in one Acknowledge call.
	maxAcksPerCall = 10_000
	// The most bytes of an acknowledgement's reason, and its longest retry delay.
	maxReasonBytes = 1024
	maxRetryDelay  = time.Hour
	// How long one Acknowledge call may take.
	ackCallTimeout = 30 * time.Second
	// The reason of a delivery handed back unhandled.
	handBackReason = "the consumer shut down before handling it"
)

// QueueOptions are the settings of a lease's queue (Lease.Deliveries, Lease.Consume). The
// zero value leaves everything to the gateway: partition order, 64 deliveries and 4 MiB in
// flight, a 30 s ack deadline, 5 deliveries, dead letters to "dlq.<group>.<topic>". A lease
// keeps the settings of its first Deliver: a later one (a reopen, a second Consume) must ask
// for the same, or fail with INVALID_ARGUMENT.
type QueueOptions struct {
	// How records may be handed out relative to each other: OrderPartition (the default),
	// OrderKey or OrderUnordered.
	Ordering kafkaleasev1.DeliveryOrder
	// Most deliveries in flight (handed out, not answered) at once; 0: the gateway's default
	// (64), or Consume's concurrency; at most 10000.
	MaxInFlight uint32
	// Most bytes of records in flight at once (a larger record goes out alone); 0: the
	// gateway's default (4 MiB); at most 64 MiB.
	MaxInFlightBytes uint32
	// How long a delivery may go unanswered before it is delivered again; 0: the gateway's
	// default (30 s); allowed 1 s ..= 1 h. Delivery.Renew extends one delivery's.
	AckDeadline time.Duration
	// Deliveries after which a record that fails again goes to the dead letter topic; 0: the
	// gateway's default (5); allowed 1 ..= 100.
	MaxDeliveries uint32
	// Where rejected records go: a topic that must exist; empty: "dlq.<group>.<topic>".
	DeadLetterTopic string
	// Consecutive reopen attempts after the Deliver stream broke; 0:
	// DefaultReconnectAttempts; negative: never reopen.
	ReconnectAttempts int
}

func (o QueueOptions) request(leaseID string) *kafkaleasev1.DeliverRequest {
	req := &kafkaleasev1.DeliverRequest{
		LeaseId:          leaseID,
		Ordering:         o.Ordering,
		MaxInFlight:      o.MaxInFlight,
		MaxInFlightBytes: o.MaxInFlightBytes,
		MaxDeliveries:    o.MaxDeliveries,
		DeadLetterTopic:  o.DeadLetterTopic,
	}
	if o.AckDeadline != 0 {
		req.AckDeadline = durationpb.New(o.AckDeadline)
	}
	return req
}

// settings are the queue settings of a Subscribe (ReconnectAttempts aside).
func (o QueueOptions) settings() *kafkaleasev1.QueueSettings {
	q := &kafkaleasev1.QueueSettings{
		Ordering:         o.Ordering,
		MaxInFlight:      o.MaxInFlight,
		MaxInFlightBytes: o.MaxInFlightBytes,
		MaxDeliveries:    o.MaxDeliveries,
		DeadLetterTopic:  o.DeadLetterTopic,
	}
	if o.AckDeadline != 0 {
		q.AckDeadline = durationpb.New(o.AckDeadline)
	}
	return q
}

// AckOutcome is what became of an answer to a delivery.
type AckOutcome int

const (
	// AckApplied: the answer was applied.
	AckApplied AckOutcome = iota + 1
	// AckStale: the answer changed nothing: the delivery was no longer in flight (its
	// deadline passed and it was delivered again, or it was answered already), or the
	// record is done. An Accept of a record not done yet still counts, whichever delivery it
	// answers.
	AckStale
	// AckNotDelivered: the answer changed nothing: no record at its offset was ever delivered
	// on the partition, by this holder or an earlier one (not handed out yet, or past the
	// partition's end). Usually a bug of the caller, such as an offset off by one.
	AckNotDelivered
)

func (o AckOutcome) String() string {
	switch o {
	case AckApplied:
		return "APPLIED"
	case AckStale:
		return "STALE"
	case AckNotDelivered:
		return "NOT_DELIVERED"
	}
	return fmt.Sprintf("AckOutcome(%d)", int(o))
}

// ackOutcomeFromProto is the outcome the gateway answered; STALE for one it did not answer
// (or one this version does not know): it changed nothing that this client can tell.
func ackOutcomeFromProto(o kafkaleasev1.AckOutcome) AckOutcome {
	switch o {
	case kafkaleasev1.AckOutcome_ACK_OUTCOME_APPLIED:
		return AckApplied
	case kafkaleasev1.AckOutcome_ACK_OUTCOME_NOT_DELIVERED:
		return AckNotDelivered
	}
	return AckStale
}

// Delivery is one hand-out of a record of a lease in queue mode: answer it with Accept,
// Retry or Reject (or Renew it) before its Deadline, from any goroutine. Unanswered by then,
// the record is delivered again with Attempt one higher.
//
// Answers are batched per lease: at most one Acknowledge call is in flight, and the answers
// made meanwhile go together in the next one.
type Delivery struct {
	Record Record
	// The record's topic and partition.
	Topic     string
	Partition int32
	// 1 for the first delivery, one more for each after it (carried over when the partition
	// moves to another holder).
	Attempt uint32
	// When the gateway delivers the record again unless it is answered (or renewed).
	Deadline time.Time

	acks *acker
}

// Offset is the record's offset.
func (d *Delivery) Offset() int64 { return d.Record.Offset }

func (d *Delivery) answer(kind kafkaleasev1.AckType) *kafkaleasev1.Acknowledgement {
	return &kafkaleasev1.Acknowledgement{Offset: d.Record.Offset, Type: kind, Attempt: d.Attempt}
}

// Accept answers that the record was handled: it is done.
//
// ctx bounds the wait for the outcome; an answer already made is sent anyway. Errors are
// *Error: FAILED_PRECONDITION with a lease-ended reason (IsLeaseEnded) when the lease has
// ended or moved, so nothing was applied; NOT_FOUND (LEASE_NOT_FOUND); UNAVAILABLE.
func (d *Delivery) Accept(ctx context.Context) (AckOutcome, error) {
	return d.acks.send(ctx, d.answer(kafkaleasev1.AckType_ACK_TYPE_ACCEPT))
}

// Retry answers that the record was not handled: it is delivered again, not before delay
// (0: at once; at most 1 h, longer is cut to it). A retry of the record's MaxDeliveries-th
// delivery sends it to the dead letter topic instead, with reason (at most 1024 bytes,
// longer is cut). Errors as Accept.
func (d *Delivery) Retry(ctx context.Context, delay time.Duration, reason string) (AckOutcome, error) {
	ack := d.answer(kafkaleasev1.AckType_ACK_TYPE_RETRY)
	ack.RetryDelay = durationpb.New(min(max(delay, 0), maxRetryDelay))
	ack.Reason = cutReason(reason)
	return d.acks.send(ctx, ack)
}

// Reject answers that the record is never to be handled: it goes to the dead letter topic
// with reason (at most 1024 bytes, longer is cut). Errors as Accept.
func (d *Delivery) Reject(ctx context.Context, reason string) (AckOutcome, error) {
	ack := d.answer(kafkaleasev1.AckType_ACK_TYPE_REJECT)
	ack.Reason = cutReason(reason)
	return d.acks.send(ctx, ack)
}

// Renew asks for more time: the delivery's deadline moves to now + the queue's ack
// deadline (Deadline is not updated). Errors as Accept.
func (d *Delivery) Renew(ctx context.Context) (AckOutcome, error) {
	return d.acks.send(ctx, d.answer(kafkaleasev1.AckType_ACK_TYPE_RENEW))
}

// cutReason keeps a reason within the gateway's limit, at a character boundary: one answer
// over it would fail the whole batch it travels in.
func cutReason(reason string) string {
	if len(reason) <= maxReasonBytes {
		return reason
	}
	cut := maxReasonBytes
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// acker sends a lease's answers: one Acknowledge at a time, the answers made meanwhile
// batched behind it. Its goroutine runs only while answers are pending.
type acker struct {
	client  *Client
	leaseID string

	mu      sync.Mutex
	pending []pendingAck
	sending bool
}

type pendingAck struct {
	ctx   context.Context
	ack   *kafkaleasev1.Acknowledgement
	reply chan ackResult
}

type ackResult struct {
	outcome AckOutcome
	err     error
}

func (a *acker) send(ctx context.Context, ack *kafkaleasev1.Acknowledgement) (AckOutcome, error) {
	if ctx.Err() != nil {
		return 0, ctxError(ctx)
	}
	reply := make(chan ackResult, 1)
	a.mu.Lock()
	a.pending = append(a.pending, pendingAck{ctx: ctx, ack: ack, reply: reply})
	start := !a.sending
	a.sending = true
	a.mu.Unlock()
	if start {
		go a.run()
	}
	select {
	case r := <-reply:
		return r.outcome, r.err
	case <-ctx.Done():
		return 0, ctxError(ctx)
	}
}

// run sends what is pending, one call at a time, until nothing is.
func (a *acker) run() {
	for {
		a.mu.Lock()
		if len(a.pending) == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		n := min(len(a.pending), maxAcksPerCall)
		batch := a.pending[:n:n]
		a.pending = append([]pendingAck(nil), a.pending[n:]...)
		a.mu.Unlock()

		req := &kafkaleasev1.AcknowledgeRequest{LeaseId: a.leaseID, Acknowledgements: make([]*kafkaleasev1.Acknowledgement, n)}
		for i, p := range batch {
			req.Acknowledgements[i] = p.ack
		}
		// The call outlives the caller that made the first answer (the others wait for it
		// too), but keeps its context's values (metadata).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), ackCallTimeout)
		resp, err := a.client.raw.Acknowledge(ctx, req)
		cancel()
		for i, p := range batch {
			switch {
			case err != nil:
				p.reply <- ackResult{err: ParseError(err)}
			case i < len(resp.GetOutcomes()):
				p.reply <- ackResult{outcome: ackOutcomeFromProto(resp.GetOutcomes()[i])}
			default:
				p.reply <- ackResult{outcome: AckStale}
			}
		}
	}
}

// ctxError is the *Error of a call that ctx ended before it was answered.
func ctxError(ctx context.Context) *Error {
	return wrap(ctx, status.FromContextError(ctx.Err()).Err())
}

// Deliveries puts the lease in queue mode (on its first Deliver) and hands out its records
// as deliveries, for as long as the lease is held: answer each (Accept, Retry, Reject)
// before its deadline. Several may be in flight at once (opts.MaxInFlight), in the order
// opts.Ordering allows. The Deliver stream opens when the iteration starts and closes when
// it stops (break, or ctx ends); deliveries received and not yet yielded then are handed
// back (retried at once). It ends with no error after Release.
//
// Once in queue mode the lease's Read, Seek and Commit fail with FAILED_PRECONDITION
// (WRONG_MODE); the gateway commits for it (the lowest record not done), and Release
// commits the queue's progress.
//
// A broken stream (connection lost, or UNAVAILABLE with the gateway's RetryInfo) is
// reopened with the same settings; deliveries in flight meanwhile stay in flight and can
// still be answered. Any other error is yielded once, with a nil *Delivery, and ends the
// iteration: an *Error, e.g. NOT_FOUND (TOPIC_NOT_FOUND: the dead letter topic does not
// exist), INVALID_ARGUMENT (INVALID_FIELD: settings out of range, or not the queue's),
// FAILED_PRECONDITION (LEASE_EXPIRED, LEASE_LOST), ABORTED (SUPERSEDED: a newer Deliver on
// the lease took over); one that unwraps to ctx.Err() when ctx ended.
func (l *Lease) Deliveries(ctx context.Context, opts QueueOptions) iter.Seq2[*Delivery, error] {
	return func(yield func(*Delivery, error) bool) {
		dv := l.newDeliverer(opts)
		defer func() {
			dv.close()
			// Received, never handed out: back at once rather than at their deadline.
			for _, d := range dv.takeReady() {
				go func() { _, _ = d.Retry(context.WithoutCancel(ctx), 0, handBackReason) }()
			}
		}()
		for {
			d, err := dv.next(ctx)
			if err != nil {
				if err != io.EOF {
					yield(nil, err)
				}
				return
			}
			if !yield(d, nil) {
				return
			}
		}
	}
}

// deliverer is one lease's Deliver, reopened as needed.
type deliverer struct {
	lease    *Lease
	req      *kafkaleasev1.DeliverRequest
	attempts int

	stream   grpc.ServerStreamingClient[kafkaleasev1.DeliverResponse]
	cancel   context.CancelFunc
	ready    []*Delivery
	failures int // failed reopen attempts since the last response
}

func (l *Lease) newDeliverer(opts QueueOptions) *deliverer {
	attempts := opts.ReconnectAttempts
	if attempts == 0 {
		attempts = DefaultReconnectAttempts
	}
	return &deliverer{lease: l, req: opts.request(l.id), attempts: attempts}
}

func (dv *deliverer) close() {
	if dv.cancel != nil {
		dv.cancel()
	}
	dv.stream, dv.cancel = nil, nil
}

// takeReady takes the deliveries received and not handed out.
func (dv *deliverer) takeReady() []*Delivery {
	ready := dv.ready
	dv.ready = nil
	return ready
}

// next is the next delivery; io.EOF when the gateway ended the Deliver with OK (Release).
func (dv *deliverer) next(ctx context.Context) (*Delivery, error) {
	for {
		if len(dv.ready) > 0 {
			d := dv.ready[0]
			dv.ready[0] = nil
			dv.ready = dv.ready[1:]
			return d, nil
		}
		if dv.stream == nil {
			sctx, cancel := context.WithCancel(ctx)
			stream, err := dv.lease.client.raw.Deliver(sctx, dv.req)
			if err != nil {
				cancel()
				if dv.retry(ctx, err) {
					continue
				}
				return nil, wrap(ctx, err)
			}
			dv.stream, dv.cancel = stream, cancel
		}
		resp, err := dv.stream.Recv()
		if err != nil {
			dv.close()
			if err == io.EOF {
				return nil, io.EOF
			}
			if dv.retry(ctx, err) {
				continue
			}
			return nil, wrap(ctx, err)
		}
		dv.failures = 0
		for _, p := range resp.GetDeliveries() {
			if p.GetRecord() == nil {
				continue
			}
			dv.ready = append(dv.ready, deliveryFromProto(p, dv.lease.Topic, dv.lease.Partition, dv.lease.acks))
		}
	}
}

// deliveryFromProto is a delivery of topic/partition answered through acks; nil without a
// record.
func deliveryFromProto(p *kafkaleasev1.Delivery, topic string, partition int32, acks *acker) *Delivery {
	if p.GetRecord() == nil {
		return nil
	}
	d := &Delivery{Record: recordFromProto(p.GetRecord()), Topic: topic, Partition: partition,
		Attempt: p.GetAttempt(), acks: acks}
	if p.GetDeadline() != nil {
		d.Deadline = p.GetDeadline().AsTime()
	}
	return d
}

// retry reports whether err broke the stream (not the lease) and a reopen is due, after
// waiting the backoff.
func (dv *deliverer) retry(ctx context.Context, err error) bool {
	if ctx.Err() != nil || dv.attempts < 0 || dv.failures >= dv.attempts || !streamBroke(err) {
		return false
	}
	backoff := min(firstBackoff<<min(dv.failures, 6), maxBackoff)
	dv.failures++
	return sleep(ctx, backoff) == nil
}
