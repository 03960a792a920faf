package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// MaxConsumerLength is the longest consumer name accepted, in bytes.
const MaxConsumerLength = 255

// Config configures NewMiddleware.
type Config struct {
	// Store records claims. Required; usually a *sqlinbox.Store.
	Store Store

	// Consumer scopes the claims: each consumer processes each event once,
	// so several handlers can share one inbox table. Printable UTF-8, at most
	// MaxConsumerLength bytes. Set it when one logical consumer has several
	// handler names, or when the middleware runs outside a router. Renaming
	// a consumer makes it process every event again. Defaults to the
	// Watermill handler name of each message.
	Consumer string

	// EventID extracts the event id. Defaults to DefaultEventID: the
	// "event_id" metadata value, else msg.UUID.
	EventID EventIDFunc

	// TxOptions are passed to BeginTx (isolation level, read-only). Defaults
	// to nil: the database's default isolation level.
	TxOptions *sql.TxOptions

	// ProducedPublisher, when set, publishes the messages the handler returns
	// inside the inbox transaction, to the handler's publish topic, through
	// the publisher it builds for that transaction (typically a watermill-sql
	// outbox publisher bound to tx). They then commit with the claim and the
	// handler's effect, and the middleware returns no messages to the router.
	// Without it the router publishes them after the commit: if that publish
	// fails, the redelivery is a duplicate and the messages are lost.
	// Defaults to nil (the router publishes them).
	ProducedPublisher func(tx *sql.Tx) (message.Publisher, error)

	// Logger receives a debug line per duplicate and errors from AfterCommit
	// hooks. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.EventID == nil {
		c.EventID = DefaultEventID
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

func (c Config) validate() error {
	if c.Store == nil {
		return errors.New("Store is required")
	}
	if c.Consumer != "" {
		if err := validateConsumer(c.Consumer); err != nil {
			return fmt.Errorf("Consumer: %w", err)
		}
	}
	return nil
}

// validateConsumer keeps consumer names readable in the table and in logs.
func validateConsumer(name string) error {
	if name == "" {
		return ErrNoConsumer
	}
	if len(name) > MaxConsumerLength {
		return fmt.Errorf("consumer name is %d bytes, at most %d allowed: %s", len(name), MaxConsumerLength, truncate(name))
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("consumer name is not valid UTF-8: %s", truncate(name))
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("consumer name contains a non-printable character %U: %s", r, truncate(name))
		}
	}
	return nil
}

type middleware struct {
	Config
	checker EventIDChecker
}

// NewMiddleware returns the inbox middleware: each message is claimed in the
// inbox table and handled in the same transaction, so its effect commits
// exactly once however often it is delivered. Add it to a router
// (router.AddMiddleware) or to single handlers (handler.AddMiddleware), inside
// Recoverer, PoisonQueue and Retry: each retry must open a new transaction.
func NewMiddleware(config Config) (message.HandlerMiddleware, error) {
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("inbox: invalid config: %w", err)
	}
	m := &middleware{Config: config}
	m.checker, _ = config.Store.(EventIDChecker)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			return m.handle(h, msg)
		}
	}, nil
}

func (m *middleware) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	consumer, err := m.consumer(ctx)
	if err != nil {
		return nil, err
	}
	eventID, err := m.eventID(msg)
	if err != nil {
		return nil, err
	}

	tx, claimed, err := m.Store.Claim(ctx, m.TxOptions, consumer, eventID)
	if err != nil {
		return nil, fmt.Errorf("inbox: claiming event %s for consumer %q: %w", truncate(eventID), consumer, err)
	}
	if !claimed {
		m.Logger.Debug("Inbox: duplicate skipped", watermill.LogFields{
			"consumer": consumer, "event_id": eventID, "message_uuid": msg.UUID,
		})
		return nil, nil
	}

	s := &session{tx: tx, consumer: consumer, eventID: eventID}
	msg.SetContext(withSession(ctx, s))
	defer msg.SetContext(ctx)
	committed := false
	defer func() {
		// Also runs while a handler panic unwinds: the claim disappears
		// with the handler's writes and the panic goes on to Recoverer.
		if !committed {
			_ = tx.Rollback()
		}
	}()

	produced, err := h(msg)
	if err != nil {
		return nil, err
	}
	if m.ProducedPublisher != nil && len(produced) > 0 {
		if err := m.publishInTx(ctx, tx, produced); err != nil {
			return nil, err
		}
		produced = nil
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("inbox: committing event %s for consumer %q (the redelivery will tell whether it was committed): %w", truncate(eventID), consumer, err)
	}
	committed = true
	m.runHooks(ctx, s)
	return produced, nil
}

func (m *middleware) consumer(ctx context.Context) (string, error) {
	if m.Consumer != "" {
		return m.Consumer, nil
	}
	name := message.HandlerNameFromCtx(ctx)
	if name == "" {
		return "", ErrNoConsumer
	}
	if err := validateConsumer(name); err != nil {
		return "", fmt.Errorf("inbox: handler name cannot be the consumer (set inbox.Config.Consumer): %w", err)
	}
	return name, nil
}

func (m *middleware) eventID(msg *message.Message) (string, error) {
	id, err := m.EventID(msg)
	if err != nil {
		if !errors.Is(err, ErrMissingEventID) && !errors.Is(err, ErrInvalidEventID) {
			err = fmt.Errorf("%w: %w", ErrMissingEventID, err)
		}
		return "", err
	}
	if err := ValidateEventID(id); err != nil {
		return "", err
	}
	if m.checker != nil {
		return m.checker.CheckEventID(id)
	}
	return id, nil
}

func (m *middleware) publishInTx(ctx context.Context, tx *sql.Tx, produced []*message.Message) error {
	topic := message.PublishTopicFromCtx(ctx)
	if topic == "" {
		return errors.New("inbox: handler returned messages but has no publish topic; add the handler with router.AddHandler, not AddConsumerHandler")
	}
	pub, err := m.ProducedPublisher(tx)
	if err != nil {
		return fmt.Errorf("inbox: building the in-transaction publisher: %w", err)
	}
	if err := pub.Publish(topic, produced...); err != nil {
		return fmt.Errorf("inbox: publishing produced messages in the transaction: %w", err)
	}
	return nil
}

func (m *middleware) runHooks(ctx context.Context, s *session) {
	s.mu.Lock()
	hooks := s.hooks
	s.mu.Unlock()
	ctx = context.WithoutCancel(ctx)
	for _, fn := range hooks {
		if err := fn(ctx); err != nil {
			m.Logger.Error("Inbox: after-commit hook failed; its effect is lost for this event", err, watermill.LogFields{
				"consumer": s.consumer, "event_id": s.eventID,
			})
		}
	}
}
