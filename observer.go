package inbox

import (
	"context"
	"time"
)

// Outcome is what happened to one message in the middleware.
type Outcome string

// The outcomes an [Observer] sees. Every message ends in exactly one.
const (
	// OutcomeProcessed: the handler ran and its transaction committed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: the event was already committed; the handler was
	// not called and the message is acked.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeMissingID and OutcomeInvalidID: the message was refused before
	// any SQL ([ErrMissingEventID], [ErrInvalidEventID], [ErrNoConsumer]).
	OutcomeMissingID Outcome = "missing_id"
	OutcomeInvalidID Outcome = "invalid_id"
	// OutcomeInFlight: another copy of the event held the claim longer than
	// the store's claim timeout ([ErrInFlight]); the message is retried.
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeClaimFailed: the claim could not be made (database down,
	// table missing); nothing ran.
	OutcomeClaimFailed Outcome = "claim_failed"
	// OutcomeMiswired: the middleware is wired so that it cannot keep its
	// guarantee for this message, and refused it ([ErrMiswired],
	// [ErrSubscriberTx]) or rolled it back (a PoisonQueue inside the inbox
	// took it). The database is fine: the wiring needs fixing.
	OutcomeMiswired Outcome = "miswired"
	// OutcomeRolledBack: the handler returned an error, panicked, or the
	// in-transaction publish failed; its writes and the claim rolled back.
	OutcomeRolledBack Outcome = "rolled_back"
	// OutcomeCommitFailed: COMMIT returned an error; the redelivery finds out
	// whether it happened.
	OutcomeCommitFailed Outcome = "commit_failed"
	// OutcomeIDReused: the event id was already processed with another
	// fingerprint ([Config.Fingerprint]); the handler was not called, and
	// [Config.OnIDReuse] decided between ack and nack ([ErrEventIDReused]).
	OutcomeIDReused Outcome = "id_reused"
	// OutcomeStale: the event was older than [Config.MaxEventAge] and
	// [Config.StaleEvents] rejected ([ErrStaleEvent]) or skipped it, before
	// any SQL. Stale events processed under [StaleProcess] end as any
	// other.
	OutcomeStale Outcome = "stale"
)

// Observation describes one message's passage through the middleware.
type Observation struct {
	Consumer string
	EventID  string // "" when it could not be extracted
	Outcome  Outcome
	Err      error // nil for [OutcomeProcessed], [OutcomeDuplicate] and acked [OutcomeIDReused] or [OutcomeStale]
	// Stale: the event was older than [Config.MaxEventAge], whatever the
	// policy. Under [StaleProcess] its outcome is that of any other
	// message, so this is the only sign that it may have been a duplicate
	// the inbox could no longer recognise.
	Stale bool

	// Start is when the message entered the middleware; ClaimStart and
	// ClaimDuration time the BEGIN and claim, with any wait for the claims
	// of its pool to leave a connection (see [ClaimPool]), zero when no
	// claim was made;
	// Duration is the whole passage, handler and commit included.
	Start         time.Time
	ClaimStart    time.Time
	ClaimDuration time.Duration
	Duration      time.Duration

	// AfterCommitErr is the failure of the message's [AfterCommit] hooks
	// (their errors and panics, joined), nil when every hook succeeded.
	// Only an [OutcomeProcessed] message runs hooks, and a failed hook does
	// not change that outcome: the transaction committed and the message
	// is acked, but the hook's effect is lost.
	AfterCommitErr error

	// ObserverPanics is how many observer callbacks (Start or done, of
	// any observer) have panicked in this middleware so far, this
	// message's included: a running total, like a counter's value, for an
	// observer that still works (another one combined with [Observers],
	// or this one on the messages where it does not panic) to export. The
	// first panic of each consumer is also logged at error level.
	ObserverPanics int64
}

// Observer watches the middleware, for metrics and tracing without tying the
// library to a metrics or tracing package (see the [prommetrics] and
// [otelinbox] packages). Start is called when a message enters the middleware;
// the context it returns becomes the message context for the handler (so a span
// started there is the handler's parent), and done is called exactly once when
// the message leaves, panics included. Both run on the message's goroutine and
// must be cheap.
//
// A panic in either is recovered by the middleware: it never changes the
// message's outcome, and the messages the handler produced still reach the
// router. The observer misses what it did not finish (after a panic in
// Start, the message's done callback too); the others, when combined with
// [Observers], still see the message. The panic is counted in
// [Observation.ObserverPanics] and logged once per consumer.
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
// [otelinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/otelinbox
type Observer interface {
	Start(ctx context.Context) (context.Context, func(Observation))
}

// Observers combines several observers into one. Behind the middleware each
// runs under its own recover, so one that panics keeps none of the others
// from seeing the message.
func Observers(obs ...Observer) Observer { return observers(obs) }

type observers []Observer

func (os observers) Start(ctx context.Context) (context.Context, func(Observation)) {
	dones := make([]func(Observation), len(os))
	for i, o := range os {
		ctx, dones[i] = o.Start(ctx)
	}
	return ctx, func(ob Observation) {
		for i := len(dones) - 1; i >= 0; i-- {
			dones[i](ob)
		}
	}
}
