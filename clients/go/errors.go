package kafkalease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kafka-lease/kafka-lease/clients/go/kafkaleasev1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the gateway's errors. ErrorInfo of
// another domain (a proxy's, say) is ignored.
const ErrorDomain = "kafka-lease"

// Error is a failed call: the gRPC status, with the machine-readable part the gateway puts
// in its details (the grpc-status-details-bin trailer). Branch on Reason, never on Message.
//
// Every error this package returns from a call is an *Error (use errors.As). When the
// caller's context ended the call, errors.Is(err, context.Canceled) (or
// context.DeadlineExceeded) holds too.
type Error struct {
	// The gRPC status code.
	Code codes.Code
	// The status message, for people.
	Message string
	// The ErrorInfo reason: an kafkaleasev1.ErrorReason name such as "PARTITION_BUSY", or
	// "WRONG_MODE" (FAILED_PRECONDITION: Read, Seek or Commit on a lease in queue mode, or
	// an answer to a delivery on a lease that is not); empty when the status carried none
	// (a broken connection).
	Reason string
	// The ErrorInfo metadata (numbers in decimal, times in RFC 3339), e.g. "holder_member",
	// "partition", "field", "low" and "high". Never nil.
	Metadata map[string]string
	// The RetryInfo delay, when HasRetryDelay: the gateway says the same call can succeed
	// after it. Without it, retrying the same call cannot help.
	RetryDelay    time.Duration
	HasRetryDelay bool

	status *status.Status
	cause  error
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("kafka-lease: %s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("kafka-lease: %s: %s", e.Code, e.Message)
}

// GRPCStatus is the status as received, so status.FromError and status.Code work on it.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// Unwrap is the caller's context error when its cancellation or deadline ended the call.
func (e *Error) Unwrap() error { return e.cause }

// IsRetryable reports whether sending the same call again later may succeed: UNAVAILABLE
// with the gateway's RetryInfo, or without any reason (a broken connection).
func (e *Error) IsRetryable() bool {
	return e.Code == codes.Unavailable && (e.Reason == "" || e.HasRetryDelay)
}

// IsLeaseEnded reports whether the lease is gone for good (lost, expired, released,
// abandoned, or ended with its gateway's shutdown): only a new Acquire helps.
func (e *Error) IsLeaseEnded() bool {
	switch e.Reason {
	case "LEASE_LOST", "LEASE_EXPIRED", "LEASE_RELEASED", "LEASE_ABANDONED":
		return true
	case "SHUTTING_DOWN":
		_, ok := e.Metadata["lease_ref"]
		return ok
	}
	return false
}

// IsReason reports whether err is an *Error with the given reason.
func IsReason(err error, reason kafkaleasev1.ErrorReason) bool {
	var e *Error
	return errors.As(err, &e) && e.Reason == reason.String()
}

// ParseError decodes any gRPC error (as returned by the generated stubs) into an *Error;
// nil for nil. An error that carries no gRPC status becomes code Unknown.
func ParseError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Code: codes.Unknown, Message: err.Error(), Metadata: map[string]string{}, status: st, cause: err}
	}
	e = &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, status: st}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain && e.Reason == "" {
				e.Reason = d.GetReason()
				for k, v := range d.GetMetadata() {
					e.Metadata[k] = v
				}
			}
		case *errdetails.RetryInfo:
			if d.GetRetryDelay() != nil {
				e.RetryDelay, e.HasRetryDelay = d.GetRetryDelay().AsDuration(), true
			}
		}
	}
	return e
}

// wrap is ParseError for a call made with ctx: when ctx ended the call, the error unwraps
// to ctx.Err() (see ctxCause).
func wrap(ctx context.Context, err error) *Error {
	e := ParseError(err)
	if e.cause == nil {
		e.cause = ctxCause(ctx, e.Code)
	}
	return e
}

// ctxCause is the context error behind a call made with ctx that ended with code, or nil:
// ctx.Err() when ctx has ended and code is Canceled or DeadlineExceeded, and
// context.DeadlineExceeded when code is DeadlineExceeded and ctx's deadline has passed though
// ctx has not ended yet. The gateway gets the deadline with the call (grpc-timeout) and ends
// a stream with DEADLINE_EXCEEDED at it; that status can arrive before ctx's own timer fires.
func ctxCause(ctx context.Context, code codes.Code) error {
	if code != codes.Canceled && code != codes.DeadlineExceeded {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && code == codes.DeadlineExceeded && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// endedBy reports whether err, the end of a call or a stream, is the end of ctx reaching it:
// a Canceled or DeadlineExceeded status once ctx has ended or its deadline has passed (see
// ctxCause), whichever context the call itself was made with.
func endedBy(ctx context.Context, err error) bool {
	var e *Error
	return errors.As(err, &e) && ctxCause(ctx, e.Code) != nil
}
