// Package engine is the inbox middleware, written once for every kind of
// transaction: package inbox runs it on database/sql's *sql.Tx, package
// pgxinbox on pgx.Tx. What differs between them (how a claim opens its
// transaction, how it commits) comes in as functions; everything the
// guarantee rests on (consumer and event id checks, the duplicate path,
// rollback on error or panic, after-commit hooks, the context handed to the
// handler and restored afterwards) lives here.
package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Limits and sentinel errors; package inbox re-exports them with their
// documentation.
const (
	MaxConsumerLength = 255
	MaxEventIDLength  = 255
)

var (
	ErrMissingEventID = errors.New("inbox: message has no event id")
	ErrInvalidEventID = errors.New("inbox: invalid event id")
	ErrNoConsumer     = errors.New("inbox: no consumer name (set inbox.Config.Consumer or run the middleware inside a router handler)")
	ErrInFlight       = errors.New("inbox: another delivery of this event is still being processed; retry later")
	ErrEventIDReused  = errors.New("inbox: event id reused for a different event")
	ErrStaleEvent     = errors.New("inbox: event is older than MaxEventAge")
	ErrMiswired       = errors.New("inbox: middleware miswired")
	ErrTxEnded        = errors.New("inbox: the inbox transaction has already ended, so this AfterCommit hook would never run; register hooks before the handler returns")
)

// MaxFingerprintLength is inbox.MaxFingerprintLength.
const MaxFingerprintLength = 64

// Policies, as inbox.IDReusePolicy and inbox.StalePolicy values; the zero
// values change nothing about delivery.
const (
	IDReuseLog = iota
	IDReuseReject
	IDReuseIgnore
)

const (
	StaleProcess = iota
	StaleReject
	StaleSkip
)

// Outcomes, as inbox.Outcome values.
const (
	OutcomeProcessed    = "processed"
	OutcomeDuplicate    = "duplicate"
	OutcomeMissingID    = "missing_id"
	OutcomeInvalidID    = "invalid_id"
	OutcomeInFlight     = "in_flight"
	OutcomeClaimFailed  = "claim_failed"
	OutcomeRolledBack   = "rolled_back"
	OutcomeCommitFailed = "commit_failed"
	OutcomeIDReused     = "id_reused"
	OutcomeStale        = "stale"
)

// Observation is inbox.Observation, with the outcome as a string.
type Observation struct {
	Consumer      string
	EventID       string
	Outcome       string
	Err           error
	Stale         bool
	Start         time.Time
	ClaimStart    time.Time
	ClaimDuration time.Duration
	Duration      time.Duration
	// AfterCommitErr joins the errors and panics of the after-commit hooks
	// of a processed message.
	AfterCommitErr error
}

// AdaptObserver turns an inbox.Observer, which this package cannot name,
// into Engine.Observe (nil for none). Package inbox sets it when it is
// initialised, so every package that imports inbox finds it set.
var AdaptObserver func(observer any) func(context.Context) (context.Context, func(Observation))

// errPanicked is the Err of the observation of a handler that panicked; the
// panic itself goes on unchanged.
var errPanicked = errors.New("inbox: handler panicked")

// Engine is one configured inbox middleware for transactions of type T.
type Engine[T any] struct {
	// Consumer is the fixed consumer name, or "" for the handler name.
	Consumer string
	// EventID extracts the event id. Required.
	EventID func(msg *message.Message) (string, error)
	// CheckEventID, when set, refuses or canonicalises ids the store's
	// column cannot hold.
	CheckEventID func(id string) (string, error)
	// Claim opens a transaction holding the claim, as inbox.Store.Claim.
	Claim func(ctx context.Context, consumer, eventID string) (tx T, claimed bool, err error)
	// Commit and Rollback end the transaction Claim opened.
	Commit   func(ctx context.Context, tx T) error
	Rollback func(ctx context.Context, tx T) error
	// Publisher, when set, builds the publisher of the handler's produced
	// messages inside tx.
	Publisher func(tx T) (message.Publisher, error)
	// Observe, when set, is called as a message enters: the context it
	// returns is the handler's, and done is called once as it leaves,
	// panics included.
	Observe func(ctx context.Context) (context.Context, func(Observation))
	Logger  watermill.LoggerAdapter

	// Fingerprint, when set, fingerprints every message, and claims go
	// through ClaimFingerprint instead of Claim: it stores the fingerprint
	// with a new claim and returns, for a duplicate, the one stored with the
	// original (nil for none). OnIDReuse says what a mismatch does.
	Fingerprint      func(msg *message.Message) []byte
	ClaimFingerprint func(ctx context.Context, consumer, eventID string, fingerprint []byte) (tx T, claimed bool, stored []byte, err error)
	OnIDReuse        int

	// MaxEventAge, when positive, applies StaleEvents to messages whose
	// EventTime is older than that, before any SQL.
	MaxEventAge time.Duration
	EventTime   func(msg *message.Message) (time.Time, bool)
	StaleEvents int

	// ShareConsumer lets a fixed Consumer serve several handler names.
	ShareConsumer bool

	fixedHandler atomic.Pointer[string] // first handler name seen with a fixed Consumer
	txUseMu      sync.RWMutex
	txUse        map[string]txUse // per consumer, for reportUnusedTx
}

// Middleware wraps h.
func (e *Engine[T]) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return e.handle(h, msg)
	}
}

func (e *Engine[T]) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if e.Observe == nil {
		return e.process(h, msg, nil)
	}
	ob := Observation{Start: time.Now()}
	orig := msg.Context()
	ctx, done := e.Observe(orig)
	msg.SetContext(ctx)
	defer msg.SetContext(orig)
	finished := false
	defer func() {
		if !finished { // the handler panicked
			ob.Outcome, ob.Err = OutcomeRolledBack, errPanicked
			ob.Duration = time.Since(ob.Start)
			done(ob)
		}
	}()
	produced, err := e.process(h, msg, &ob)
	finished = true
	ob.Err = err
	ob.Duration = time.Since(ob.Start)
	done(ob)
	return produced, err
}

// process is the inbox: claim, handler, commit. ob, when not nil, records
// what happened.
func (e *Engine[T]) process(h message.HandlerFunc, msg *message.Message, ob *Observation) ([]*message.Message, error) {
	var scratch Observation
	if ob == nil {
		ob = &scratch
	}
	ctx := msg.Context()
	consumer, err := e.consumer(ctx)
	if err != nil {
		ob.Outcome = OutcomeMissingID
		return nil, err
	}
	ob.Consumer = consumer
	if err := e.checkWiring(msg, consumer); err != nil {
		ob.Outcome = OutcomeClaimFailed
		return nil, err
	}
	eventID, err := e.eventID(msg)
	if err != nil {
		ob.Outcome = OutcomeMissingID
		if errors.Is(err, ErrInvalidEventID) {
			ob.Outcome = OutcomeInvalidID
		}
		return nil, err
	}
	ob.EventID = eventID
	if e.MaxEventAge > 0 {
		if stop, err := e.stale(msg, consumer, eventID, ob); stop {
			return nil, err
		}
	}
	var fingerprint []byte
	if e.Fingerprint != nil {
		fingerprint = e.Fingerprint(msg)
		if len(fingerprint) > MaxFingerprintLength {
			ob.Outcome = OutcomeClaimFailed
			return nil, fmt.Errorf("inbox: the fingerprint of event %s is %d bytes, at most %d allowed (inbox.Config.Fingerprint)", Quote(eventID), len(fingerprint), MaxFingerprintLength)
		}
	}

	// A watermill-sql subscriber's transaction: the claim's stands in for
	// it (subscribertx.go), or the message is refused before any SQL.
	standIn, err := e.subscriberTx(ctx)
	if err != nil {
		ob.Outcome = OutcomeClaimFailed
		return nil, err
	}

	if e.Observe != nil {
		ob.ClaimStart = time.Now()
	}
	var (
		tx      T
		claimed bool
		stored  []byte
	)
	if e.Fingerprint == nil {
		tx, claimed, err = e.Claim(ctx, consumer, eventID)
	} else {
		tx, claimed, stored, err = e.ClaimFingerprint(ctx, consumer, eventID, fingerprint)
	}
	if e.Observe != nil {
		ob.ClaimDuration = time.Since(ob.ClaimStart)
	}
	if err != nil {
		ob.Outcome = OutcomeClaimFailed
		if errors.Is(err, ErrInFlight) {
			ob.Outcome = OutcomeInFlight
		}
		return nil, fmt.Errorf("inbox: claiming event %s for consumer %q: %w", Quote(eventID), consumer, err)
	}
	if !claimed {
		// A NULL stored fingerprint (claimed before fingerprints were on,
		// or by a message the function returned nil for) never mismatches.
		if stored != nil && fingerprint != nil && !bytes.Equal(stored, fingerprint) {
			return nil, e.idReused(msg, consumer, eventID, ob)
		}
		ob.Outcome = OutcomeDuplicate
		e.Logger.Debug("Inbox: duplicate skipped", watermill.LogFields{
			"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		})
		return nil, nil
	}

	s := &Session{Tx: tx, Consumer: consumer, EventID: eventID, msg: msg}
	defer s.end()
	hctx := context.WithValue(ctx, sessionKey{}, s)
	if standIn != nil {
		hctx = standIn(hctx, tx)
		// The handler may take it through the subscriber's accessor,
		// which the middleware cannot see (reportUnusedTx).
		s.MarkTxTaken()
	}
	msg.SetContext(hctx)
	defer msg.SetContext(ctx)
	committed := false
	defer func() {
		// Also runs while a handler panic unwinds: the claim disappears
		// with the handler's writes and the panic goes on to Recoverer.
		// Without cancellation, so that a cancelled message still ends its
		// transaction instead of leaving the connection to be discarded.
		if !committed {
			_ = e.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()

	ob.Outcome = OutcomeRolledBack
	poisoned := msg.Metadata.Get(poisonReasonKey)
	produced, err := h(msg)
	if err != nil {
		return nil, err
	}
	if stop, err := e.checkHandlerCall(s, msg, poisoned); stop {
		return nil, err
	}
	if e.Publisher != nil && len(produced) > 0 {
		s.MarkTxTaken()
		if err := e.publishInTx(ctx, tx, produced); err != nil {
			return nil, err
		}
		produced = nil
	}
	if err := e.Commit(ctx, tx); err != nil {
		ob.Outcome = OutcomeCommitFailed
		return nil, fmt.Errorf("inbox: committing event %s for consumer %q (the redelivery will tell whether it was committed): %w", Quote(eventID), consumer, err)
	}
	committed = true
	ob.Outcome = OutcomeProcessed
	e.reportUnusedTx(s, msg)
	ob.AfterCommitErr = e.runHooks(ctx, s)
	return produced, nil
}

// stale applies the stale-event policy; stop means the message goes no
// further, with err as its result.
func (e *Engine[T]) stale(msg *message.Message, consumer, eventID string, ob *Observation) (stop bool, err error) {
	at, ok := e.EventTime(msg)
	if !ok || at.IsZero() {
		return false, nil
	}
	age := time.Since(at)
	if age <= e.MaxEventAge {
		return false, nil
	}
	ob.Stale = true
	fields := watermill.LogFields{
		"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		"event_time": at, "age": age.String(), "max_event_age": e.MaxEventAge.String(),
	}
	switch e.StaleEvents {
	case StaleReject:
		ob.Outcome = OutcomeStale
		return true, fmt.Errorf("%w: event %s for consumer %q is %s old, MaxEventAge is %s", ErrStaleEvent, Quote(eventID), consumer, age.Round(time.Second), e.MaxEventAge)
	case StaleSkip:
		ob.Outcome = OutcomeStale
		e.Logger.Error("Inbox: STALE EVENT SKIPPED, the handler was not called; if it was never processed before, its effect is missing", ErrStaleEvent, fields)
		return true, nil
	}
	e.Logger.Info("Inbox: warning: stale event processed; its inbox row may have been purged, so it may be a duplicate the inbox can no longer detect", fields)
	return false, nil
}

// idReused applies the id-reuse policy to a duplicate whose fingerprint
// differs from the original's, and returns the message's result.
func (e *Engine[T]) idReused(msg *message.Message, consumer, eventID string, ob *Observation) error {
	ob.Outcome = OutcomeIDReused
	err := fmt.Errorf("%w: event %s for consumer %q was already processed with another fingerprint, so the producer gave one id to two different events (message %s)", ErrEventIDReused, Quote(eventID), consumer, msg.UUID)
	switch e.OnIDReuse {
	case IDReuseReject:
		return err
	case IDReuseLog:
		e.Logger.Error("Inbox: event id reused with a different payload; acked as a duplicate, the handler was not called", err, watermill.LogFields{
			"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		})
	}
	return nil
}

func (e *Engine[T]) consumer(ctx context.Context) (string, error) {
	if e.Consumer != "" {
		return e.Consumer, nil
	}
	name := message.HandlerNameFromCtx(ctx)
	if name == "" {
		return "", ErrNoConsumer
	}
	if err := ValidateConsumer(name); err != nil {
		return "", fmt.Errorf("inbox: handler name cannot be the consumer (set inbox.Config.Consumer): %w", err)
	}
	return name, nil
}

func (e *Engine[T]) eventID(msg *message.Message) (string, error) {
	id, err := e.EventID(msg)
	if err != nil {
		if !errors.Is(err, ErrMissingEventID) && !errors.Is(err, ErrInvalidEventID) {
			err = fmt.Errorf("%w: %w", ErrMissingEventID, err)
		}
		return "", err
	}
	if err := ValidateEventID(id); err != nil {
		return "", err
	}
	if e.CheckEventID != nil {
		return e.CheckEventID(id)
	}
	return id, nil
}

func (e *Engine[T]) publishInTx(ctx context.Context, tx T, produced []*message.Message) error {
	topic := message.PublishTopicFromCtx(ctx)
	if topic == "" {
		return errors.New("inbox: handler returned messages but has no publish topic; add the handler with router.AddHandler, not AddConsumerHandler")
	}
	pub, err := e.Publisher(tx)
	if err != nil {
		return fmt.Errorf("inbox: building the in-transaction publisher: %w", err)
	}
	if err := pub.Publish(topic, produced...); err != nil {
		return fmt.Errorf("inbox: publishing produced messages in the transaction: %w", err)
	}
	return nil
}

// runHooks runs the session's after-commit hooks in order and returns
// their failures. A hook that fails or panics loses only its own effect:
// the transaction has committed, so the message is still processed and
// acked, and the hooks after it still run.
func (e *Engine[T]) runHooks(ctx context.Context, s *Session) error {
	hooks := s.end()
	if len(hooks) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, fn := range hooks {
		stack, err := runHook(ctx, fn)
		if err == nil {
			continue
		}
		fields := watermill.LogFields{"consumer": s.Consumer, "event_id": s.EventID}
		if stack != nil {
			fields["stack"] = string(stack)
		}
		e.Logger.Error("Inbox: after-commit hook failed; its effect is lost for this event", err, fields)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// runHook calls fn, turning a panic into an error, with the panic's stack.
func runHook(ctx context.Context, fn func(context.Context) error) (stack []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			stack, err = debug.Stack(), fmt.Errorf("inbox: after-commit hook panicked: %v", r)
		}
	}()
	return nil, fn(ctx)
}

// Session is what the middleware puts in the message context for the
// duration of one handler call.
type Session struct {
	// Tx is the claim's transaction: a *sql.Tx or a pgx.Tx.
	Tx       any
	Consumer string
	EventID  string

	mu    sync.Mutex
	hooks []func(context.Context) error
	ended bool

	msg         *message.Message // the message the session was opened for
	txTaken     atomic.Bool      // the handler asked for Tx
	txNotNeeded atomic.Bool      // the handler declared it writes nothing in SQL
	calls       atomic.Int32     // handler calls through inbox.Handler
}

type sessionKey struct{}

// SessionFrom returns the session of the message whose context is ctx, or
// nil outside an inbox transaction.
func SessionFrom(ctx context.Context) *Session {
	s, _ := ctx.Value(sessionKey{}).(*Session)
	return s
}

// AfterCommit registers fn to run after the session's commit. Once the
// transaction has ended it returns ErrTxEnded: fn would never run.
func (s *Session) AfterCommit(fn func(context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return ErrTxEnded
	}
	s.hooks = append(s.hooks, fn)
	return nil
}

// end closes the session to new hooks and returns those registered.
func (s *Session) end() []func(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	hooks := s.hooks
	s.hooks = nil
	return hooks
}

// ValidateConsumer keeps consumer names readable in the table and in logs.
func ValidateConsumer(name string) error {
	if name == "" {
		return ErrNoConsumer
	}
	if len(name) > MaxConsumerLength {
		return fmt.Errorf("consumer name is %d bytes, at most %d allowed: %s", len(name), MaxConsumerLength, Quote(name))
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("consumer name is not valid UTF-8: %s", Quote(name))
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("consumer name contains a non-printable character %U: %s", r, Quote(name))
		}
	}
	return nil
}

// ValidateEventID is inbox.ValidateEventID.
func ValidateEventID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidEventID)
	case len(id) > MaxEventIDLength:
		return fmt.Errorf("%w: %d bytes, at most %d allowed: %s", ErrInvalidEventID, len(id), MaxEventIDLength, Quote(id))
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8: %s", ErrInvalidEventID, Quote(id))
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte: %s", ErrInvalidEventID, Quote(id))
	}
	return nil
}

// Quote quotes s for an error message, cut to a readable length.
func Quote(s string) string {
	const max = 64
	if len(s) > max {
		return fmt.Sprintf("%q...", s[:max])
	}
	return fmt.Sprintf("%q", s)
}
