package inbox

import (
	"database/sql"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/observe"
)

// maxNameLength is the longest consumer or service name accepted, in bytes.
const maxNameLength = 255

// Config configures [NewMiddleware].
type Config struct {
	// Store records claims: a *sqlinbox.Store (database/sql) or a
	// *pgxinbox.Store (native pgx). Required.
	Store inboxdriver.Store

	// Consumer scopes the claims: each consumer processes each event once,
	// so several handlers can share one inbox table. Set it, on each
	// handler's own middleware, to keep a consumer's claims across a
	// handler rename, or when the middleware runs outside a router. Renaming a consumer makes it process every
	// event again. Printable UTF-8, at most 255 bytes. Defaults to the
	// Watermill handler name of each message; one handler function
	// value under several names on one topic, workers of one queue, is
	// then refused: run it once on [Subscriptions] instead.
	Consumer string

	// ShareConsumer lets one fixed [Config.Consumer] be reached from
	// several handler names, which then share one claim per event: each
	// event runs in only one of them. Defaults to false: a second handler
	// name is warned about, and an event that reaches two handler names
	// fails with [ErrMiswired] at the second, unless they run one function
	// value on one topic (workers, which share the claims).
	ShareConsumer bool

	// Service names the service the consumers belong to, for the warning
	// when two services claim with one consumer on one table at the same
	// time (docs/wiring.md#consumers). Replicas share it. Defaults to the
	// main package path of the running binary.
	Service string

	// EventID extracts the event id. Defaults to [DefaultEventID]: the
	// "event_id" metadata value, else msg.UUID.
	EventID EventIDFunc

	// ShardKey returns the key the claim is stored under on a sharded
	// database, the same as the handler's own writes use (a customer id),
	// so that claim and effect share one shard. It must give every copy of
	// an event the same key. The store's table needs the column
	// (docs/databases.md#vitess), or [NewMiddleware] refuses the config;
	// an empty or too long key fails the message with [ErrInvalidShardKey].
	// Defaults to nil: no shard key.
	ShardKey func(msg *message.Message) (string, error)

	// TxOptions are the claim transaction's options (isolation level,
	// read-only), for every store. Defaults to nil: the database's default.
	TxOptions *sql.TxOptions

	// ProducedPublisher publishes the messages the handler returns inside
	// the inbox transaction, to the handler's publish topic, through a
	// publisher built on the claim's transaction: [PublishInTx] for a
	// store on database/sql, pgxinbox.PublishInTx for native pgx. They
	// commit with the claim. Defaults to nil: the router publishes them
	// after the commit, and if that publish fails they are lost.
	ProducedPublisher inboxdriver.TxPublisher

	// Observer is told about every message (outcome, timings), for metrics
	// and tracing: prommetrics.New, otelinbox.New, several with
	// [observe.Join]. Defaults to nil.
	Observer observe.Observer

	// Fingerprint fingerprints every message ([PayloadFingerprint]) and
	// stores it with its claim, so that a duplicate whose fingerprint
	// differs, an event id reused for another event, is reported
	// ([Config.OnIDReuse]). The store needs sqlinbox.Config.Fingerprints.
	// Defaults to nil: no fingerprints.
	Fingerprint FingerprintFunc

	// OnIDReuse is what a reused event id does. Defaults to [IDReuseLog].
	OnIDReuse IDReusePolicy

	// MaxEventAge, when positive, treats events older than this (by
	// [Config.EventTime]) as stale: their rows may have been purged, so a
	// duplicate could go unnoticed. Keep it below the purge retention.
	// Defaults to 0: event times are not checked.
	MaxEventAge time.Duration

	// EventTime returns when the producer created the event; required with
	// [Config.MaxEventAge]. Defaults to nil.
	EventTime EventTimeFunc

	// StaleEvents is what happens to an event older than
	// [Config.MaxEventAge]. Defaults to [StaleProcess].
	StaleEvents StalePolicy

	// Logger receives a debug line per duplicate, failed after-commit
	// hooks, and, once per kind and consumer, refused messages and failed
	// handlers, at error level; and the warnings about wiring only visible
	// at run time, once per consumer at info level as "Inbox: warning:
	// ...": Watermill's loggers have no warning level, and a suspicion is
	// not an error. Pass the router's logger. Defaults to
	// [watermill.NopLogger].
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.Service == "" {
		c.Service = defaultService()
	}
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
		if err := validateName("consumer name", c.Consumer); err != nil {
			return fmt.Errorf("Consumer: %w", err)
		}
	}
	if err := validateName("service name", c.Service); err != nil {
		return fmt.Errorf("Service: %w", err)
	}
	if c.Fingerprint != nil {
		fs, ok := c.Store.(inboxdriver.FingerprintChecker)
		if !ok {
			return fmt.Errorf("Fingerprint: the store (%T) cannot keep fingerprints", c.Store)
		}
		if err := fs.CheckFingerprints(); err != nil {
			return fmt.Errorf("Fingerprint: %w", err)
		}
	}
	if err := checkShardKeys(c); err != nil {
		return err
	}
	if c.OnIDReuse < IDReuseLog || c.OnIDReuse > IDReuseIgnore {
		return fmt.Errorf("OnIDReuse: unknown policy %d", c.OnIDReuse)
	}
	if c.MaxEventAge < 0 {
		return fmt.Errorf("MaxEventAge is negative (%s)", c.MaxEventAge)
	}
	if c.MaxEventAge > 0 && c.EventTime == nil {
		return errors.New("MaxEventAge needs EventTime (inbox.EventTimeFromMetadata, inbox.EventTimeFromContext)")
	}
	if c.StaleEvents < StaleProcess || c.StaleEvents > StaleSkip {
		return fmt.Errorf("StaleEvents: unknown policy %d", c.StaleEvents)
	}
	return nil
}

// NewMiddleware returns the inbox middleware: each message is claimed in the
// inbox table and handled in the same transaction, so its effect commits
// exactly once however often it is delivered.
//
// It must be the innermost middleware, inside Recoverer, PoisonQueue and
// Retry: each retry must open a new transaction, and a failed attempt must
// roll back. [Handler] and [ConsumerHandler] make it innermost whatever else
// is added. Added with [message.Router.AddMiddleware] instead, add it last:
// Watermill keeps router-level and handler-level middlewares in one list,
// in the order of the calls, the first outermost.
func NewMiddleware(config Config) (message.HandlerMiddleware, error) {
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("inbox: invalid config: %w", err)
	}
	return newEngine(config).middleware, nil
}

// validateName checks a consumer or service name: printable UTF-8, at most
// 255 bytes, so that it reads in the table and in logs.
func validateName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(name) > maxNameLength {
		return fmt.Errorf("%s is %d bytes, at most %d allowed: %s", what, len(name), maxNameLength, errtext.Quote(name))
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%s is not valid UTF-8: %s", what, errtext.Quote(name))
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%s contains a non-printable character %U: %s", what, r, errtext.Quote(name))
		}
	}
	return nil
}
