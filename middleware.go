package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/errtext"
)

// MaxConsumerLength is the longest consumer name accepted, in bytes.
const MaxConsumerLength = 255

// Config configures [NewMiddleware].
type Config struct {
	// Store records claims: a *sqlinbox.Store ([database/sql]) or a
	// *pgxinbox.Store (native pgx). Required.
	Store Store

	// Consumer scopes the claims: each consumer processes each event once,
	// so several handlers can share one inbox table. Printable UTF-8, at most
	// [MaxConsumerLength] bytes. Set it to keep a consumer's claims across
	// a handler rename, when one logical consumer has several handler names
	// (with [Config.ShareConsumer]), or when the middleware runs outside a
	// router. Renaming a consumer makes it process every event again.
	// Defaults to the Watermill handler name of each message.
	Consumer string

	// ShareConsumer lets one fixed [Config.Consumer] be reached from
	// several handler names, which then share one claim per event: each
	// event runs in only one of them, whichever claims it first. Defaults
	// to false: a fixed Consumer serves the first handler name it meets,
	// and the messages of any other fail with [ErrMiswired].
	ShareConsumer bool

	// Service names the service the middleware's consumers belong to. The
	// store's consumer registry ([ConsumerRegistry], a table CreateSchema
	// creates beside the inbox) records it for each consumer, once per
	// process, before its first claim; the messages of a consumer another
	// service registered are refused with [ErrMiswired] ([OutcomeMiswired],
	// one error line per consumer), since two services with one consumer
	// name (two handlers "orders" in billing and in mailing) would share
	// one claim per event, each event running in only one of them. Replicas
	// of a service share its name. Set it to keep a service's consumers
	// when its main package moves, or to the same value in two binaries
	// meant to share their consumers' events. Printable UTF-8, at most
	// [MaxConsumerLength] bytes. Defaults to the main package path of the
	// running binary ([runtime/debug.ReadBuildInfo]; a test binary's is the
	// package under test); a binary built from files (go run main.go) has
	// none, and its consumers go unchecked, which is logged once.
	Service string

	// EventID extracts the event id. Defaults to [DefaultEventID]: the
	// "event_id" metadata value, else msg.UUID.
	EventID EventIDFunc

	// TxOptions are the claim transaction's options (isolation level,
	// read-only), for every store: a native pgx store maps them to
	// pgx.TxOptions. Defaults to nil: the database's default isolation
	// level.
	TxOptions *sql.TxOptions

	// ProducedPublisher, when set, publishes the messages the handler returns
	// inside the inbox transaction, to the handler's publish topic, through
	// the publisher it builds in ctx, the handler's context: typically a
	// watermill-sql outbox publisher bound to the transaction that
	// [TxFromContext] (or pgxinbox.TxFromContext) returns for ctx:
	//
	//	func(ctx context.Context) (message.Publisher, error) {
	//		tx, ok := inbox.TxFromContext(ctx)
	//		if !ok {
	//			return nil, inbox.ErrNotInInbox
	//		}
	//		return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
	//	}
	//
	// The messages then commit with the claim and the handler's effect, and
	// the middleware returns none to the router. Without it the router
	// publishes them after the commit: if that publish fails, the
	// redelivery is a duplicate and the messages are lost. Defaults to nil
	// (the router publishes them).
	//
	// The publisher must write through that transaction. One built on the
	// [*sql.DB], a pgx pool or a broker publishes on its own: when the
	// COMMIT then fails (a deferred foreign key, a lost connection) the
	// redelivery publishes again (a watermill-sql v4 publisher on the
	// *sql.DB wrote 6 outbox rows for 3 produced messages). The middleware
	// refuses such a publisher with [ErrMiswired], and the message rolls
	// back: before it writes, when it holds a database handle other than
	// the transaction (watermill-sql v3 and v4 publishers, on database/sql
	// or pgx); after the first Publish of each consumer, when it holds none
	// the middleware can see (one reached through a closure, a broker's)
	// and the transaction wrote no row meanwhile ([TxWriteCounter]), and
	// from then on. Those first messages have gone out already. A store
	// that cannot count writes (PostgreSQL with track_counts off, a store
	// wrapping another) leaves that second case unchecked, as is a
	// publisher that writes both through the transaction and elsewhere.
	ProducedPublisher func(ctx context.Context) (message.Publisher, error)

	// Observer, when set, is told about every message (outcome, timings),
	// for metrics and tracing. Defaults to nil.
	Observer Observer

	// Fingerprint, when set, fingerprints every message
	// ([PayloadFingerprint] hashes the payload) and stores the fingerprint
	// with its claim, so that a duplicate whose fingerprint differs from
	// the original's, an event id the producer reused for another event, is
	// reported ([OutcomeIDReused], [Config.OnIDReuse]) instead of being
	// acked silently. The [Config.Store] must implement
	// [FingerprintChecker] (sqlinbox.Config.Fingerprints). Duplicates then
	// take one more statement; new claims cost nothing more. Defaults to
	// nil: no fingerprints.
	Fingerprint FingerprintFunc

	// OnIDReuse is what a reused event id does, when [Config.Fingerprint]
	// is set. Defaults to [IDReuseLog]: logged at error level, acked as a
	// duplicate.
	OnIDReuse IDReusePolicy

	// MaxEventAge, when positive, treats events older than this (by
	// [Config.EventTime]) as stale: their inbox rows may have been purged,
	// so a duplicate could not be recognised. Keep it below the purge
	// retention; [Config.StaleEvents] decides what happens to them, before
	// any SQL. Defaults to 0: event times are not checked.
	MaxEventAge time.Duration

	// EventTime returns when the producer created the event; required with
	// [Config.MaxEventAge]. See [EventTimeFromMetadata],
	// [EventTimeFromEventID] and [EventTimeFromContext] (Kafka record
	// timestamps). Defaults to nil.
	EventTime EventTimeFunc

	// StaleEvents is what happens to an event older than
	// [Config.MaxEventAge]. Defaults to [StaleProcess]: processed, with a
	// logged warning.
	StaleEvents StalePolicy

	// Logger receives a debug line per duplicate, errors from [AfterCommit]
	// hooks, and the wiring mistakes only visible at run time (a handler
	// that succeeds without [TxFromContext], a PoisonQueue inside the inbox).
	// Pass the router's logger to see them. Defaults to
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
		if err := validateConsumer(c.Consumer); err != nil {
			return fmt.Errorf("Consumer: %w", err)
		}
	}
	if c.Service != "" {
		if err := validateName("service name", c.Service); err != nil {
			return fmt.Errorf("Service: %w", err)
		}
	}
	if c.Fingerprint != nil {
		fs, ok := c.Store.(FingerprintChecker)
		if !ok {
			return fmt.Errorf("Fingerprint: the store (%T) cannot keep fingerprints (inbox.FingerprintChecker)", c.Store)
		}
		if err := fs.CheckFingerprints(); err != nil {
			return fmt.Errorf("Fingerprint: %w", err)
		}
	}
	if c.OnIDReuse < IDReuseLog || c.OnIDReuse > IDReuseIgnore {
		return fmt.Errorf("OnIDReuse: unknown policy %d", c.OnIDReuse)
	}
	if c.MaxEventAge < 0 {
		return fmt.Errorf("MaxEventAge is negative (%s)", c.MaxEventAge)
	}
	if c.MaxEventAge > 0 && c.EventTime == nil {
		return errors.New("MaxEventAge needs EventTime, which reads the event's time (inbox.EventTimeFromMetadata, inbox.EventTimeFromContext)")
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
// roll back. Wrapping the handler function with [Handler] or
// [ConsumerHandler] makes it innermost whatever else is added. Added with
// [message.Router.AddMiddleware] or [message.Handler.AddMiddleware], it takes
// its place in one list that Watermill keeps for both, in the order of the
// calls, the first outermost: add it last, after every router-level
// middleware, even those added after the handler.
//
// Behind a watermill-sql subscriber, the claim's transaction also takes the
// place of the subscriber's for the handler (see [TxFromContext]); a pgx
// subscriber's transaction cannot be replaced by a [*sql.Tx], nor a
// database/sql one by a pgx.Tx, and such messages are refused with
// [ErrSubscriberTx].
func NewMiddleware(config Config) (message.HandlerMiddleware, error) {
	config.setDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("inbox: invalid config: %w", err)
	}
	e := &engine{config: config, observers: flatten(config.Observer)}
	if checker, ok := config.Store.(EventIDChecker); ok {
		e.checkID = checker.CheckEventID
	}
	if pool, ok := config.Store.(ClaimPool); ok {
		e.pool = pool
	}
	if registry, ok := config.Store.(ConsumerRegistry); ok {
		if config.Service != "" {
			e.registry = registry
		} else {
			config.Logger.Info("Inbox: warning: this binary was built from files (go run main.go), so it has no main package path to tell its service from others on the same inbox table, and its consumers are not checked; set inbox.Config.Service", nil)
		}
	}
	return e.middleware, nil
}

// validateConsumer keeps consumer names readable in the table and in logs.
func validateConsumer(name string) error {
	if name == "" {
		return ErrNoConsumer
	}
	return validateName("consumer name", name)
}

// validateName checks a consumer or service name: printable UTF-8, at most
// [MaxConsumerLength] bytes.
func validateName(what, name string) error {
	if len(name) > MaxConsumerLength {
		return fmt.Errorf("%s is %d bytes, at most %d allowed: %s", what, len(name), MaxConsumerLength, errtext.Quote(name))
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
