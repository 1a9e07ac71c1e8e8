package kafkalease

import (
	"context"
	"time"
)

// Consume runs handler on every delivery of the member's leases, as Lease.Consume does for
// one lease, up to opts.Concurrency at once, until ctx ends or the subscription does. The
// subscription must have been opened in queue mode (SubscribeOptions.Queue), whose settings
// apply: opts.Queue is not used. Assignments and revocations are followed by the gateway: a
// revoked lease gets no more deliveries, the answers of those in flight still reach it, and
// it moves once none is. While Consume runs it reads the subscription's events: call
// neither Next nor Events meanwhile.
//
// When ctx ends, Consume stops taking deliveries but keeps the subscription open, so the
// member keeps its leases while running handlers get opts.Drain to finish and their answers
// land (their deliveries renewed every third of the ack deadline, at most 2 s, at least
// 100 ms, to keep their deadlines ahead); it hands back the deliveries received and not
// started, and those whose handlers are still running after the drain (a retry at once).
// Then it closes the subscription: the member leaves, and its leases are released (after
// SessionGrace), committing what was done. It returns what it did with a nil error.
//
// Errors: the error that ended the subscription (see Next), with the stats; nil when the
// gateway ended it with OK, and when ctx's end ended it (a subscription opened with ctx, or
// the gateway ending its stream at ctx's deadline). The subscription is closed either way.
func (s *Subscription) Consume(ctx context.Context, opts ConsumeOptions, handler Handler) (ConsumeStats, error) {
	return consume(ctx, opts, handler, &subscriptionSource{s: s})
}

// subscriptionSource takes the deliveries of a subscription's Deliveries events. A reader
// goroutine waits for the events, so that a fetch can stop without ending the stream.
type subscriptionSource struct {
	s       *Subscription
	started bool
	events  chan subscriptionEvent
	stop    chan struct{}
	done    chan struct{}
	pending []*Delivery
	ended   error
}

type subscriptionEvent struct {
	ev  Event
	err error
}

func (src *subscriptionSource) start() {
	src.started = true
	src.events, src.stop, src.done = make(chan subscriptionEvent), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(src.done)
		for {
			ev, err := src.s.Next()
			select {
			case src.events <- subscriptionEvent{ev, err}:
			case <-src.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
}

func (src *subscriptionSource) take(e subscriptionEvent) {
	if ds, ok := e.ev.(*Deliveries); ok {
		src.pending = append(src.pending, ds.Deliveries...)
	}
}

func (src *subscriptionSource) next(ctx context.Context) (*Delivery, error) {
	if !src.started {
		src.start()
	}
	for {
		if len(src.pending) > 0 {
			d := src.pending[0]
			src.pending[0] = nil
			src.pending = src.pending[1:]
			return d, nil
		}
		if src.ended != nil {
			return nil, src.ended
		}
		select {
		case e := <-src.events:
			if e.err != nil {
				src.ended = e.err
				continue
			}
			src.take(e)
		case <-ctx.Done():
			return nil, ctxError(ctx)
		}
	}
}

// pause leaves the stream open (the member keeps its leases while its handlers finish) and
// returns the deliveries received and not handed out.
func (src *subscriptionSource) pause() []*Delivery {
	if src.started && src.ended == nil {
		select {
		case e := <-src.events:
			if e.err != nil {
				src.ended = e.err
			} else {
				src.take(e)
			}
		default:
		}
	}
	out := src.pending
	src.pending = nil
	return out
}

// renewEvery is a third of the ack deadline, at most 2 s: the open stream keeps the leases,
// the renewals keep the deliveries' deadlines ahead.
func (src *subscriptionSource) renewEvery() time.Duration {
	deadline := defaultAckDeadline
	if d := src.s.req.GetQueue().GetAckDeadline(); d != nil {
		deadline = d.AsDuration()
	}
	return min(max(deadline/3, minRenewWhileDraining), maxRenewWhileDraining)
}

// close ends the subscription: the member leaves.
func (src *subscriptionSource) close() {
	_ = src.s.Close()
	if src.started {
		close(src.stop)
		<-src.done
	}
}
