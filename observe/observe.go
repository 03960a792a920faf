// Package observe is what an [Observer] of the inbox middleware sees: one
// [Observation] per message, with its [Outcome] and timings. Packages
// [prommetrics] and [otelinbox] implement it for Prometheus and
// OpenTelemetry; give one, or several joined with [Join], to
// [inbox.Config.Observer].
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
// [otelinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/otelinbox
// [inbox.Config.Observer]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config
package observe

import (
	"context"
	"time"
)

// Observer watches the middleware. Start is called when a message enters
// the middleware; the context it returns becomes the message context for
// the handler (so a span started there is the handler's parent), and done is
// called exactly once when the message leaves, panics included. Both run on
// the message's goroutine and must be cheap.
//
// A panic in either is recovered by the middleware: it never changes the
// message's outcome. The observer misses what it did not finish; the others
// joined with it still see the message. The panic is counted in
// [Observation.ObserverPanics] and logged once per consumer.
type Observer interface {
	Start(ctx context.Context) (context.Context, func(Observation))
}

// Join combines observers into one. Behind the middleware each runs under
// its own recover, so one that panics keeps none of the others from seeing
// the message.
func Join(obs ...Observer) Observer { return Joined(obs) }

// Joined is the [Observer] [Join] returns; the middleware calls its members
// one by one.
type Joined []Observer

// Start implements [Observer].
func (os Joined) Start(ctx context.Context) (context.Context, func(Observation)) {
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

// Observation describes one message's passage through the middleware.
type Observation struct {
	Consumer string
	EventID  string // "" when it could not be extracted
	Outcome  Outcome
	Err      error // nil for [Processed], [Duplicate] and acked [IDReused] or [Stale]

	// Stale: the event was older than inbox.Config.MaxEventAge, whatever
	// the policy. Processed anyway, its outcome is that of any other
	// message, so this is the only sign that it may have been a duplicate
	// the inbox could no longer recognise.
	Stale bool

	// Warning is what the middleware suspects of this consumer's wiring
	// on this message, "" for nothing: the message was processed all the
	// same (see [Warning]).
	Warning Warning

	// Start is when the message entered the middleware; ClaimStart and
	// ClaimDuration time the BEGIN and claim, waits for a connection
	// included, zero when no claim was made; Duration is the whole
	// passage, handler and commit included.
	Start         time.Time
	ClaimStart    time.Time
	ClaimDuration time.Duration
	Duration      time.Duration

	// AfterCommitErr is the failure of the message's after-commit hooks
	// (their errors and panics, joined), nil when every hook succeeded. A
	// failed hook does not change the outcome: the transaction committed,
	// but the hook's effect is lost.
	AfterCommitErr error

	// ObserverPanics is how many observer callbacks have panicked in this
	// middleware so far, this message's included: a running total, for an
	// observer that still works to export.
	ObserverPanics int64
}
