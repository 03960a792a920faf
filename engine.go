package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/internal/session"
	"github.com/watermill-inbox/inbox/observe"
)

// engine is one configured middleware. Its message path, [engine.process],
// is the inbox's six steps; the guards (guard.go) look at the message at
// three named points: before the claim, after the handler, after the
// commit. The engine runs them as one chain and knows none by name.
type engine struct {
	config    Config
	store     inboxdriver.Store
	checkID   func(id string) (string, error) // the store's EventIDChecker, or nil
	observers []observe.Observer              // Config.Observer, Joined flattened (observers.go)
	panics    observerPanics
	report    *reporter // warnings, once per kind and consumer (warn.go)
	guards    []guard
	accessors session.Reporter // the guard told of a handler asking the wrong accessor

	subscriber txFinder // watermill-sql subscribers' transactions (subscribertx.go)
}

// newEngine builds the engine of a validated config.
func newEngine(config Config) *engine {
	e := &engine{
		config:    config,
		store:     config.Store,
		observers: flatten(config.Observer),
		report:    &reporter{logger: config.Logger},
	}
	e.guards = guards(guardDeps{config: config, store: config.Store, report: e.report})
	for _, g := range e.guards {
		if r, ok := g.(session.Reporter); ok && e.accessors == nil {
			e.accessors = r
		}
	}
	if checker, ok := config.Store.(inboxdriver.EventIDChecker); ok {
		e.checkID = checker.CheckEventID
	}
	return e
}

// middleware wraps h.
func (e *engine) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return e.traced(h, msg)
	}
}

// process is the inbox: the consumer, the event id, the claim, the
// duplicate's ack, the handler's session, the commit. ob records what
// happened.
func (e *engine) process(h message.HandlerFunc, msg *message.Message, ob *observe.Observation) ([]*message.Message, error) {
	ctx := msg.Context()
	consumer, err := e.consumer(ctx)
	if err != nil {
		ob.Outcome = observe.MissingID
		return nil, err
	}
	ob.Consumer = consumer
	eventID, err := e.eventID(msg)
	if err != nil {
		ob.Outcome = idOutcome(err)
		return nil, err
	}
	ob.EventID = eventID
	v := &visit{msg: msg, handler: h, consumer: consumer, eventID: eventID, ob: ob}
	if err := e.beforeClaim(v); err != nil {
		return nil, acked(err)
	}
	claim, err := e.claimOf(msg, consumer, eventID)
	if err != nil {
		ob.Outcome = observe.ClaimFailed
		return nil, err
	}
	tx, stored, err := e.claim(ctx, claim, ob)
	if err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, e.duplicate(msg, claim, stored, ob)
	}
	s := &session.Session{Tx: tx, Consumer: consumer, EventID: eventID, Msg: msg, Reporter: e.accessors}
	v.s = s
	committed := false
	defer func() {
		// Also while a handler panic unwinds: the claim disappears with
		// the handler's writes and the panic goes on to Recoverer.
		// Without cancellation, so that a cancelled message still ends its
		// transaction instead of leaving its connection to be discarded.
		s.End()
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	hctx, err := e.handlerContext(ctx, s)
	if err != nil {
		ob.Outcome = observe.Miswired
		return nil, err
	}
	msg.SetContext(hctx)
	defer msg.SetContext(ctx)

	ob.Outcome = observe.RolledBack
	v.poisoned = msg.Metadata.Get(poisonReasonKey)
	if v.produced, err = h(msg); err != nil {
		return nil, e.failed(ctx, tx, err, "the handler", ob)
	}
	if err := e.afterHandler(v); err != nil {
		if err == errAck {
			return nil, nil
		}
		return nil, e.failed(ctx, tx, err, "the produced publisher", ob)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, e.failed(ctx, tx, fmt.Errorf("inbox: committing event %s for consumer %q (the redelivery will tell whether it was committed): %w", errtext.Quote(eventID), consumer, err), "", ob)
	}
	committed = true
	ob.Outcome = observe.Processed
	for _, g := range e.guards {
		g.afterCommit(v)
	}
	ob.AfterCommitErr = runHooks(ctx, s, e.config.Logger)
	return v.produced, nil
}

// beforeClaim runs the guards before the claim; the first error ends the
// message.
func (e *engine) beforeClaim(v *visit) error {
	for _, g := range e.guards {
		if err := g.beforeClaim(v); err != nil {
			if errors.Is(err, ErrMiswired) {
				v.ob.Outcome = observe.Miswired
			}
			return err
		}
	}
	return nil
}

// afterHandler runs the guards after a successful handler call; the first
// error rolls back.
func (e *engine) afterHandler(v *visit) error {
	for _, g := range e.guards {
		if err := g.afterHandler(v); err != nil {
			if errors.Is(err, ErrMiswired) {
				v.ob.Outcome = observe.Miswired
			}
			return err
		}
	}
	return nil
}

// acked is the result of a message a guard ended: nil for [errAck].
func acked(err error) error {
	if err == errAck {
		return nil
	}
	return err
}

// claimOf is what the store is asked to claim.
func (e *engine) claimOf(msg *message.Message, consumer, eventID string) (inboxdriver.Claim, error) {
	c := inboxdriver.Claim{TxOptions: e.config.TxOptions, Consumer: consumer, EventID: eventID}
	if e.config.Fingerprint != nil {
		c.Fingerprint = e.config.Fingerprint(msg)
		if len(c.Fingerprint) > MaxFingerprintLength {
			return c, fmt.Errorf("%w: the fingerprint of event %s is %d bytes, at most %d allowed", ErrInvalidEventID, errtext.Quote(eventID), len(c.Fingerprint), MaxFingerprintLength)
		}
	}
	if e.config.ShardKey != nil {
		key, err := e.config.ShardKey(msg)
		if err != nil {
			return c, fmt.Errorf("%w: none for event %s: %w", ErrInvalidShardKey, errtext.Quote(eventID), err)
		}
		c.ShardKey = key
	}
	return c, nil
}

// claim asks the store for the claim; a nil tx is a duplicate.
func (e *engine) claim(ctx context.Context, c inboxdriver.Claim, ob *observe.Observation) (inboxdriver.Tx, []byte, error) {
	ob.ClaimStart = time.Now()
	tx, stored, err := e.store.Claim(ctx, c)
	ob.ClaimDuration = time.Since(ob.ClaimStart)
	if err != nil {
		ob.Outcome = observe.ClaimFailed
		if errors.Is(err, ErrInFlight) {
			ob.Outcome = observe.InFlight
		}
		if !IsPermanent(err) {
			err = Transient(err)
		}
		return nil, nil, fmt.Errorf("inbox: claiming event %s for consumer %q: %w", errtext.Quote(c.EventID), c.Consumer, err)
	}
	return tx, stored, nil
}

// duplicate acks a message whose event was already committed, unless its
// fingerprint says the producer reused the id for another event.
func (e *engine) duplicate(msg *message.Message, c inboxdriver.Claim, stored []byte, ob *observe.Observation) error {
	// A NULL stored fingerprint (claimed before fingerprints were on, or
	// by a message the function returned nil for) never mismatches.
	if stored != nil && c.Fingerprint != nil && string(stored) != string(c.Fingerprint) {
		return idReused(e.config.OnIDReuse, e.config.Logger, msg, c.Consumer, c.EventID, ob)
	}
	ob.Outcome = observe.Duplicate
	e.config.Logger.Debug("Inbox: duplicate skipped", watermill.LogFields{
		"consumer": c.Consumer, "event_id": c.EventID, "message_uuid": msg.UUID,
	})
	return nil
}

// handlerContext is the message context the handler runs with: the session
// and, for a message from a watermill-sql subscriber, the claim's
// transaction in the place of the subscriber's (subscribertx.go).
func (e *engine) handlerContext(ctx context.Context, s *session.Session) (context.Context, error) {
	hctx := session.With(ctx, s)
	sub, found := e.subscriber.lookup(ctx)
	if !found {
		return hctx, nil
	}
	// The handler may take it through the subscriber's accessor, which
	// the middleware cannot see.
	s.MarkTxTaken()
	return sub.standIn(hctx, s.Tx.Handle())
}

// failed is the message's result when what (the handler, the produced
// publisher on tx; "" for the commit) failed with err: a conflict the store
// recognises is the claim's race, a failed commit and an outage proven by
// [engine.outage] are transient, anything else is the handler's own error.
func (e *engine) failed(ctx context.Context, tx inboxdriver.Tx, err error, what string, ob *observe.Observation) error {
	if d, ok := e.store.(inboxdriver.ConflictDetector); ok && d.IsConflict(err) {
		ob.Outcome = observe.InFlight
		return fmt.Errorf("%w: %s lost a race the database reported as a conflict (another copy of the event, or a deadlock); rolled back: %w", ErrInFlight, whatOr(what, "the commit"), err)
	}
	if what == "" {
		ob.Outcome = observe.CommitFailed
		return Transient(err)
	}
	return e.outage(ctx, tx, err)
}

func whatOr(what, otherwise string) string {
	if what == "" {
		return otherwise
	}
	return what
}

func (e *engine) consumer(ctx context.Context) (string, error) {
	if e.config.Consumer != "" {
		return e.config.Consumer, nil
	}
	name := message.HandlerNameFromCtx(ctx)
	if name == "" {
		return "", ErrNoConsumer
	}
	if err := validateName("consumer name", name); err != nil {
		return "", fmt.Errorf("%w: the handler name cannot be the consumer (set inbox.Config.Consumer): %w", ErrNoConsumer, err)
	}
	return name, nil
}

func (e *engine) eventID(msg *message.Message) (string, error) {
	id, err := e.config.EventID(msg)
	if err != nil {
		if !errors.Is(err, ErrMissingEventID) && !errors.Is(err, ErrInvalidEventID) {
			err = fmt.Errorf("%w: %w", ErrMissingEventID, err)
		}
		return "", err
	}
	if err := inboxdriver.ValidateEventID(id); err != nil {
		return "", err
	}
	if e.checkID != nil {
		return e.checkID(id)
	}
	return id, nil
}

func idOutcome(err error) observe.Outcome {
	if errors.Is(err, ErrInvalidEventID) {
		return observe.InvalidID
	}
	return observe.MissingID
}
