package inbox

import (
	"context"
	"errors"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// Errors a caller can recognise with [errors.Is]. [IsPermanent] and
// [IsTransient] sort them for a poison queue and a retry.
var (
	// ErrMissingEventID means the message carries no event id where the
	// configured [EventIDFunc] looks for one. Permanent: fix the producer.
	ErrMissingEventID = errors.New("inbox: message has no event id")

	// ErrInvalidEventID means the event id is empty, longer than
	// [MaxEventIDLength] bytes, not valid UTF-8, contains a NUL byte, or
	// does not fit the store's column (a UUID column, a table partitioned
	// by the time inside ids). Permanent.
	ErrInvalidEventID = inboxdriver.ErrInvalidEventID

	// ErrNoConsumer means neither [Config.Consumer] nor the Watermill
	// handler name is set: set Config.Consumer when the middleware runs
	// outside a router handler. Permanent.
	ErrNoConsumer = errors.New("inbox: no consumer name (set inbox.Config.Consumer or run the middleware inside a router handler)")

	// ErrInFlight means another delivery of the same event is still in its
	// transaction past the store's claim timeout, or won a race the
	// database reported as a conflict. Transient: by the retry the other
	// copy has committed (this one becomes a duplicate) or rolled back.
	ErrInFlight = inboxdriver.ErrInFlight

	// ErrEventIDReused means the event id was already processed with
	// another fingerprint ([Config.Fingerprint]): the producer gave one id
	// to two events. Only [IDReuseReject] returns it. Permanent.
	ErrEventIDReused = errors.New("inbox: event id reused for a different event")

	// ErrStaleEvent means the event is older than [Config.MaxEventAge], so
	// its inbox row may have been purged. Only [StaleReject] returns it.
	// Permanent.
	ErrStaleEvent = errors.New("inbox: event is older than MaxEventAge")

	// ErrMiswired means processing the message would lose or double an
	// effect because of how the middleware is wired: the inbox applied
	// twice to one handler, [Handler] given another middleware, a handler
	// called twice in one transaction, one fixed [Config.Consumer] reached
	// from two handler names, a produced publisher that does not write
	// through the transaction. Permanent until the wiring is fixed.
	ErrMiswired = errors.New("inbox: middleware miswired")

	// ErrSubscriberTx means the message comes with a watermill-sql
	// subscriber's transaction of a kind the store's cannot stand in for
	// (a pgx one behind a database/sql store, or the reverse), so the
	// handler's writes there would commit apart from the claim. Permanent.
	ErrSubscriberTx = errors.New("inbox: the message carries a subscriber's transaction this middleware cannot stand in for")

	// ErrNotInInbox is returned by [AfterCommit] outside an inbox
	// transaction; a handler returns it when [TxFromContext] reports false.
	ErrNotInInbox = errors.New("inbox: context is not inside an inbox transaction")

	// ErrTxEnded is returned by [AfterCommit] called after the handler
	// returned: the transaction has ended and the hook would never run.
	ErrTxEnded = errors.New("inbox: the inbox transaction has already ended; register AfterCommit hooks before the handler returns")
)

// IsPermanent reports whether redelivering the message that failed with err
// cannot help: its event id or shard key is missing or invalid, its id was
// reused, it is stale under [StaleReject], it was refused as miswired, or
// the handler marked its error with [Permanent]. Send it to the poison
// queue at once (docs/wiring.md#retries-and-the-poison-queue).
func IsPermanent(err error) bool {
	if _, ok := permanentKind(err); ok {
		return true
	}
	var p permanentError
	return errors.As(err, &p)
}

// Permanent marks err, a handler's own error, as one no redelivery can fix
// (a malformed payload, an order for a product that does not exist), so
// that [IsPermanent] reports it and the recommended stack poisons the
// message at once instead of retrying it. The mark is the handler's word:
// it wins over a [Transient] mark and over any evidence of an outage.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// permanentError marks an error [IsPermanent] reports.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// permanent are the permanent errors, each with the kind of refusal it is in
// the log (trace.go).
var permanent = []struct {
	err  error
	kind string
}{
	{ErrMissingEventID, "missing_id"}, {ErrInvalidEventID, "invalid_id"}, {ErrInvalidShardKey, "invalid_shard_key"},
	{ErrNoConsumer, "no_consumer"}, {ErrEventIDReused, "id_reused"}, {ErrStaleEvent, "stale"},
	{ErrMiswired, "miswired"}, {ErrSubscriberTx, "subscriber_tx"},
}

// permanentKind returns the kind of a permanent error; ok is false for any
// other.
func permanentKind(err error) (kind string, ok bool) {
	for _, p := range permanent {
		if errors.Is(err, p.err) {
			return p.kind, true
		}
	}
	return "", false
}

// IsTransient reports whether err means the message's transaction could not
// finish for a reason that passes, on evidence: the claim or the commit
// failed, the database said it or the claim's connection was going away
// (a handler's error then counts only when a probe of the claim's own
// connection finds it gone, never by its Go type alone, and, when the
// handler cancelled its own statement, only when the database does not
// answer on another connection either), another copy of
// the event held or won the claim ([ErrInFlight], a conflict the database
// reported), the message's context was cancelled (the router closing;
// Watermill's Retry then returns the context's error itself), or a handler
// marked its error with [Transient]. Nothing was committed, or the
// redelivery finds out: keep such a message retrying rather than poisoning
// it ([NewBackoff] waits it out). An error [IsPermanent] reports is never
// transient.
func IsTransient(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	var t transientError
	if errors.As(err, &t) || errors.Is(err, ErrInFlight) {
		return true
	}
	// A handler's own error without evidence: a context error in it is
	// the handler's own call timing out, not the router closing.
	var h handlerError
	if errors.As(err, &h) {
		return false
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Transient marks err, a handler's own error, as one that passes (a payment
// API answering 503, a dependency restarting), so that [IsTransient]
// reports it and the recommended stack retries the message until it
// succeeds instead of poisoning it. Without the mark a handler's error is
// retried a few times, then poisoned, unless the database itself was
// unavailable. [Permanent] wins over it. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

// transientError marks an error [IsTransient] reports.
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// handlerError marks the error of a handler (or of the produced publisher)
// for which the middleware found no evidence of an outage or a race:
// [IsTransient] then looks no further than a [Transient] mark inside it.
type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }
func (e handlerError) Unwrap() error { return e.err }

// errPanicked is the Err of the observation of a handler that panicked; the
// panic itself goes on unchanged.
var errPanicked = errors.New("inbox: handler panicked")
