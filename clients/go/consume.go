package kafkalease

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

const (
	defaultBackoff    = 100 * time.Millisecond
	defaultMaxBackoff = 30 * time.Second
	defaultDrain      = 10 * time.Second
	// While draining, the running handlers' deliveries are renewed no more often than every
	// minRenewWhileDraining, and on a subscription at least every maxRenewWhileDraining.
	minRenewWhileDraining = 100 * time.Millisecond
	maxRenewWhileDraining = 2 * time.Second
	// A queue's ack deadline when the gateway's default applies.
	defaultAckDeadline = 30 * time.Second
)

// Handler handles one record of a queue (Lease.Consume). Returning nil accepts it; an error
// retries it or rejects it to the dead letter topic, as ConsumeOptions.OnError decides (by
// default: Reject and RetryAfter say, any other error retries after the backoff).
//
// ctx carries the values of Consume's context, not its cancellation: at shutdown a
// running handler may finish within the drain time; ctx is cancelled when that runs out
// (its record is then handed back). The handler may Renew d for more time; it must not
// answer d itself: its return value does.
type Handler func(ctx context.Context, d *Delivery) error

// Failure is what becomes of a record whose handler failed.
type Failure struct {
	// To the dead letter topic now; otherwise the record is retried.
	Reject bool
	// With a retry: deliver it again not before this; nil: after the consumer's backoff
	// for the delivery's attempt.
	Delay *time.Duration
	// Why: written to the dead letter copy's `kafka-lease.reason` header (with a retry, if
	// it was the record's last delivery).
	Reason string
}

// ErrorPolicy decides what becomes of the record of delivery d whose handler returned err
// (never nil).
type ErrorPolicy func(d *Delivery, err error) Failure

// HandlerError is a handler's error that says what to do with its record; make one with
// Reject or RetryAfter, or set Err to keep a cause. DefaultErrorPolicy finds it in the
// error chain (errors.As), so it may be wrapped.
type HandlerError struct {
	Failure
	// The cause, if any.
	Err error
}

func (e *HandlerError) Error() string {
	verb := "retry"
	if e.Reject {
		verb = "reject"
	}
	switch {
	case e.Err != nil && e.Reason != "":
		return verb + ": " + e.Reason + ": " + e.Err.Error()
	case e.Err != nil:
		return verb + ": " + e.Err.Error()
	}
	return verb + ": " + e.Reason
}

func (e *HandlerError) Unwrap() error { return e.Err }

// Reject is a handler's error sending its record to the dead letter topic now, with reason.
func Reject(reason string) error {
	return &HandlerError{Failure: Failure{Reject: true, Reason: reason}}
}

// RetryAfter is a handler's error retrying its record not before delay (instead of after
// the consumer's backoff), with reason (for the dead letter if this was its last delivery).
func RetryAfter(delay time.Duration, reason string) error {
	return &HandlerError{Failure: Failure{Delay: &delay, Reason: reason}}
}

// DefaultErrorPolicy is Consume's error policy unless ConsumeOptions.OnError replaces it:
// a *HandlerError in err's chain (Reject, RetryAfter) says what to do; any other error
// retries the record after the consumer's backoff. The reason is the HandlerError's, else
// err's text.
func DefaultErrorPolicy(_ *Delivery, err error) Failure {
	var he *HandlerError
	if errors.As(err, &he) {
		f := he.Failure
		if f.Reason == "" {
			f.Reason = err.Error()
		}
		return f
	}
	return Failure{Reason: err.Error()}
}

// ConsumeOptions are the settings of Lease.Consume. The zero value runs one handler at a
// time with the gateway's queue defaults.
type ConsumeOptions struct {
	// The queue's settings. MaxInFlight 0 becomes Concurrency (at most 10000).
	Queue QueueOptions
	// Handlers running at once; 0: 1.
	Concurrency int
	// The delay of a retry without one: Backoff for a first delivery, doubling with each
	// attempt, at most MaxBackoff; 0: 100 ms and 30 s.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// At shutdown, how long running handlers may take to finish (their deliveries renewed
	// meanwhile); the records of those that do not are handed back (retried at once). nil:
	// 10 s.
	Drain *time.Duration
	// What becomes of a record whose handler failed; nil: DefaultErrorPolicy.
	OnError ErrorPolicy
	// Called, if set, once a handled record's accept was answered: with AckApplied the
	// record is done. Called from the handlers' goroutines, several at once.
	OnAccept func(d *Delivery, outcome AckOutcome, err error)
}

func (o ConsumeOptions) delay(attempt uint32) time.Duration {
	initial, most := o.Backoff, o.MaxBackoff
	if initial <= 0 {
		initial = defaultBackoff
	}
	if most <= 0 {
		most = defaultMaxBackoff
	}
	d := initial
	for i := uint32(1); i < attempt && d < most; i++ {
		d *= 2
	}
	return min(d, most)
}

// ConsumeStats is what a Consume did.
type ConsumeStats struct {
	// Records the handler handled (answered with an accept).
	Accepted uint64
	// Handler failures answered with a retry.
	Retried uint64
	// Handler failures answered with a reject.
	Rejected uint64
	// Records handed back at shutdown, unfinished: those whose handler was still running
	// when the drain time ran out, and those received but not started.
	HandedBack uint64
}

type consumeCounters struct {
	accepted, retried, rejected, handedBack atomic.Uint64
}

func (c *consumeCounters) stats() ConsumeStats {
	return ConsumeStats{Accepted: c.accepted.Load(), Retried: c.retried.Load(),
		Rejected: c.rejected.Load(), HandedBack: c.handedBack.Load()}
}

// consumeTask is one handler running on one delivery.
type consumeTask struct {
	d      *Delivery
	cancel context.CancelFunc
	// Set by whoever answers the delivery: the handler's goroutine when it returns, or the
	// shutdown handing it back.
	answered atomic.Bool
}

// Consume runs handler on the lease's records (in queue mode, see Deliveries), up to
// opts.Concurrency at once, until ctx ends or the lease does. A nil error accepts the
// record; an error retries it (after its delay or the backoff) or rejects it to the dead
// letter topic, as opts.OnError decides; a record failing its queue's MaxDeliveries-th
// delivery goes there too.
//
// When ctx ends, Consume stops taking deliveries (the Deliver stream closes), gives running
// handlers opts.Drain to finish, hands back the records of those still running (a retry at
// once, with the reason "the consumer shut down before handling it"; their handlers' ctx is
// cancelled), and returns what it did with a nil error (also when the gateway, which gets
// ctx's deadline with the Deliver, ended the stream at it first). While draining it renews
// the deliveries of the handlers still running every third of the lease's TTL (at least
// 100 ms): with no Deliver open, those calls keep the lease alive however long the drain.
// Release the lease then: Release commits what was done.
//
// Errors: what opening the deliveries failed with, or the error that ended them (the lease
// ended, or a broken stream could not be reopened), as Deliveries yields them; the stats
// are returned with them. After Release it returns with a nil error.
func (l *Lease) Consume(ctx context.Context, opts ConsumeOptions, handler Handler) (ConsumeStats, error) {
	queue := opts.Queue
	if queue.MaxInFlight == 0 {
		queue.MaxInFlight = uint32(min(max(opts.Concurrency, 1), 10_000))
	}
	return consume(ctx, opts, handler, &leaseSource{dv: l.newDeliverer(queue)})
}

// deliverySource is where a consumer takes its deliveries: a lease's Deliver, or a
// subscription in queue mode.
type deliverySource interface {
	// next is the next delivery; io.EOF when the source ended normally. It returns when ctx
	// ends.
	next(ctx context.Context) (*Delivery, error)
	// pause stops the deliveries (no next after it) and returns those received and not yet
	// handed out, to hand back.
	pause() []*Delivery
	// close ends the source, once every delivery taken is answered.
	close()
	// renewEvery is how often the running handlers' deliveries are renewed while draining.
	renewEvery() time.Duration
}

// leaseSource is a lease's Deliver: paused, its stream closes (the lease stays held).
type leaseSource struct{ dv *deliverer }

func (s *leaseSource) next(ctx context.Context) (*Delivery, error) { return s.dv.next(ctx) }

func (s *leaseSource) pause() []*Delivery {
	s.dv.close()
	return s.dv.takeReady()
}

func (s *leaseSource) close() {}

// renewEvery is a third of the TTL: with the Deliver closed, the renewals keep the lease
// alive.
func (s *leaseSource) renewEvery() time.Duration {
	return max(s.dv.lease.TTL/3, minRenewWhileDraining)
}

// consume runs handler on the source's deliveries, as Lease.Consume describes.
func consume(ctx context.Context, opts ConsumeOptions, handler Handler, src deliverySource) (ConsumeStats, error) {
	concurrency := max(opts.Concurrency, 1)
	policy := opts.OnError
	if policy == nil {
		policy = DefaultErrorPolicy
	}
	drain := defaultDrain
	if opts.Drain != nil {
		drain = max(*opts.Drain, 0)
	}
	// Answers outlive the shutdown: a handler that finishes while draining is answered.
	answerCtx := context.WithoutCancel(ctx)
	var counts consumeCounters
	defer src.close()

	// The fetcher takes a delivery when a handler slot is free and passes it on.
	fetchCtx, stopFetching := context.WithCancel(ctx)
	defer stopFetching()
	slots := make(chan struct{}, concurrency)
	for range concurrency {
		slots <- struct{}{}
	}
	incoming := make(chan *Delivery)
	fetchEnd := make(chan error, 1)
	fetcherDone := make(chan struct{})
	go func() {
		defer close(fetcherDone)
		var unstarted []*Delivery
		defer func() {
			handBack(answerCtx, append(unstarted, src.pause()...), &counts)
		}()
		for {
			select {
			case <-slots:
			case <-fetchCtx.Done():
				return
			}
			d, err := src.next(fetchCtx)
			if err != nil {
				if fetchCtx.Err() == nil {
					fetchEnd <- err
				}
				return
			}
			select {
			case incoming <- d:
			case <-fetchCtx.Done():
				unstarted = append(unstarted, d)
				return
			}
		}
	}()

	// Each task reports here once, when its handler has returned and it is answered (or was
	// handed back): at most concurrency are ever outstanding.
	results := make(chan *consumeTask, concurrency)
	running := map[*consumeTask]struct{}{}
	start := func(d *Delivery) {
		hctx, cancel := context.WithCancel(answerCtx)
		t := &consumeTask{d: d, cancel: cancel}
		running[t] = struct{}{}
		go func() {
			err := handler(hctx, d)
			if t.answered.CompareAndSwap(false, true) {
				answerHandled(answerCtx, d, err, opts, policy, &counts)
			}
			cancel()
			results <- t
		}()
	}

	var ended error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-fetchEnd:
			// The end of ctx can reach the fetcher as a call's error before ctx.Done() is
			// closed: the gateway ends a stream at ctx's deadline too (DEADLINE_EXCEEDED,
			// possibly before ctx's own timer fires), and a subscription opened with ctx ends
			// with it. Either is ctx ending, not an error.
			if err != io.EOF && !endedBy(ctx, err) {
				ended = err
			}
			break loop
		case d := <-incoming:
			start(d)
		case t := <-results:
			delete(running, t)
			slots <- struct{}{}
		}
	}

	// Shutdown: take no more, give the running handlers the drain time (renewing their
	// deliveries), hand back the rest.
	stopFetching()
	<-fetcherDone
	timer := time.NewTimer(drain)
	defer timer.Stop()
	renew := time.NewTicker(src.renewEvery())
	defer renew.Stop()
	var renewals sync.WaitGroup
	defer renewals.Wait()
drain:
	for len(running) > 0 {
		select {
		case t := <-results:
			delete(running, t)
		case <-renew.C:
			for t := range running {
				if !t.answered.Load() {
					// A lost renewal costs nothing: the drain ends soon.
					renewals.Go(func() { _, _ = t.d.Renew(answerCtx) })
				}
			}
		case <-timer.C:
			break drain
		}
	}
	var late []*Delivery
	for t := range running {
		if t.answered.CompareAndSwap(false, true) {
			t.cancel()
			late = append(late, t.d)
			delete(running, t)
		}
	}
	handBack(answerCtx, late, &counts)
	// Handlers that returned just now are being answered: wait for those answers.
	for len(running) > 0 {
		delete(running, <-results)
	}
	return counts.stats(), ended
}

// answerHandled answers a delivery whose handler returned err.
func answerHandled(ctx context.Context, d *Delivery, err error, opts ConsumeOptions, policy ErrorPolicy, counts *consumeCounters) {
	// A lost answer costs a redelivery after the deadline, never a record: errors are not
	// reported.
	if err == nil {
		counts.accepted.Add(1)
		outcome, err := d.Accept(ctx)
		if opts.OnAccept != nil {
			opts.OnAccept(d, outcome, err)
		}
		return
	}
	f := policy(d, err)
	if f.Reject {
		counts.rejected.Add(1)
		_, _ = d.Reject(ctx, f.Reason)
		return
	}
	counts.retried.Add(1)
	delay := opts.delay(d.Attempt)
	if f.Delay != nil {
		delay = *f.Delay
	}
	_, _ = d.Retry(ctx, delay, f.Reason)
}

// handBack retries the deliveries at once, all together (their answers share a call), and
// counts those the gateway took.
func handBack(ctx context.Context, ds []*Delivery, counts *consumeCounters) {
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(func() {
			if _, err := d.Retry(ctx, 0, handBackReason); err == nil {
				counts.handedBack.Add(1)
			}
		})
	}
	wg.Wait()
}
