// Package pgxinbox is the inbox middleware for applications that use pgx
// natively (pgx/v5 and pgxpool) rather than through database/sql. It keeps
// every guarantee of inbox.NewMiddleware, which it shares its code with, and
// costs no extra round trip: sqlinbox.PgxStore sends BEGIN and the claim to
// PostgreSQL together.
//
//	pool, err := pgxpool.New(ctx, dsn)
//	store, err := sqlinbox.NewPgx(pool, sqlinbox.Config{})
//	err = store.CreateSchema(ctx)
//	mw, err := pgxinbox.NewMiddleware(pgxinbox.Config{Store: store})
//	router.AddMiddleware(middleware.Recoverer)
//	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
//		tx, _ := pgxinbox.TxFromContext(msg.Context())
//		_, err := tx.Exec(msg.Context(), `INSERT INTO invoices ...`)
//		return err
//	}))
//
// inbox.ConsumerHandler and inbox.Handler keep the inbox innermost, and
// inbox.EventIDFromContext, inbox.AfterCommit and inbox.TxNotNeeded work here
// as they do behind inbox.NewMiddleware. For an outbox in the same
// transaction, give watermill-sql v4 the transaction:
// wsql.NewPublisher(wsql.TxFromPgx(tx), ...), or set Config.ProducedPublisher.
// Behind a watermill-sql v4 subscriber on pgx (wsql.BeginnerFromPgx),
// wsql.TxFromContext returns a *wsql.PgxTx around the same transaction; a
// subscriber on database/sql is refused with [inbox.ErrSubscriberTx] (use
// [inbox.NewMiddleware]).
package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/engine"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Store records claims in transactions of pgx. *sqlinbox.PgxStore
// implements it; its contract is inbox.Store's.
type Store interface {
	Claim(ctx context.Context, opts pgx.TxOptions, consumer, eventID string) (pgx.Tx, bool, error)
}

// FingerprintStore is implemented by stores that keep a fingerprint with
// each claim (*sqlinbox.PgxStore with sqlinbox.Config.Fingerprints); its
// contract is inbox.FingerprintStore's. The middleware uses it only when
// Config.Fingerprint is set.
type FingerprintStore interface {
	ClaimWithFingerprint(ctx context.Context, opts pgx.TxOptions, consumer, eventID string, fingerprint []byte) (tx pgx.Tx, claimed bool, stored []byte, err error)
	CheckFingerprints() error
}

var (
	_ Store            = (*sqlinbox.PgxStore)(nil)
	_ FingerprintStore = (*sqlinbox.PgxStore)(nil)
)

// Config configures NewMiddleware. Its fields mean what they mean in
// inbox.Config.
type Config struct {
	// Store records claims. Required; usually a *sqlinbox.PgxStore.
	Store Store

	// Consumer scopes the claims. Defaults to the Watermill handler name of
	// each message.
	Consumer string

	// ShareConsumer lets one fixed Consumer be reached from several handler
	// names, as in inbox.Config. Defaults to false: the messages of a
	// second handler name fail with inbox.ErrMiswired.
	ShareConsumer bool

	// EventID extracts the event id. Defaults to inbox.DefaultEventID.
	EventID inbox.EventIDFunc

	// TxOptions are the options of the claim's transaction (isolation
	// level, access mode). Defaults to the database's defaults.
	TxOptions pgx.TxOptions

	// ProducedPublisher, when set, publishes the messages the handler
	// returns inside the inbox transaction, through the publisher it builds
	// for tx (typically watermill-sql v4's
	// wsql.NewPublisher(wsql.TxFromPgx(tx), ...)). Defaults to nil: the router
	// publishes them after the commit, and loses them if that publish fails.
	ProducedPublisher func(tx pgx.Tx) (message.Publisher, error)

	// Observer, when set, is told about every message (outcome, timings),
	// as in inbox.Config. Defaults to nil.
	Observer inbox.Observer

	// Fingerprint, when set, stores a fingerprint with each claim and
	// reports a duplicate whose fingerprint differs from the original's, an
	// event id reused for another event, per OnIDReuse. The Store must
	// implement FingerprintStore (sqlinbox.Config.Fingerprints). Duplicates
	// then take one more round trip. Defaults to nil: no fingerprints.
	Fingerprint inbox.FingerprintFunc

	// OnIDReuse is what a reused event id does, when Fingerprint is set.
	// Defaults to inbox.IDReuseLog.
	OnIDReuse inbox.IDReusePolicy

	// MaxEventAge, EventTime and StaleEvents are the stale-event policy of
	// inbox.Config. Defaults to 0, nil and inbox.StaleProcess: event times
	// are not checked.
	MaxEventAge time.Duration
	EventTime   inbox.EventTimeFunc
	StaleEvents inbox.StalePolicy

	// Logger receives a debug line per duplicate, errors from AfterCommit
	// hooks and the wiring mistakes seen at run time, as in inbox.Config.
	// Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// NewMiddleware returns the inbox middleware on pgx: each message is claimed
// and handled in one pgx transaction, which the handler gets from
// TxFromContext. Wrap handler functions with it through inbox.Handler or
// inbox.ConsumerHandler, which keep it innermost; its order rules are those
// of inbox.NewMiddleware.
func NewMiddleware(config Config) (message.HandlerMiddleware, error) {
	if config.EventID == nil {
		config.EventID = inbox.DefaultEventID
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	if config.Store == nil {
		return nil, errors.New("pgxinbox: invalid config: Store is required")
	}
	if config.Consumer != "" {
		if err := engine.ValidateConsumer(config.Consumer); err != nil {
			return nil, fmt.Errorf("pgxinbox: invalid config: Consumer: %w", err)
		}
	}
	switch {
	case config.MaxEventAge < 0:
		return nil, fmt.Errorf("pgxinbox: invalid config: MaxEventAge is negative (%s)", config.MaxEventAge)
	case config.MaxEventAge > 0 && config.EventTime == nil:
		return nil, errors.New("pgxinbox: invalid config: MaxEventAge needs EventTime")
	case config.StaleEvents < inbox.StaleProcess || config.StaleEvents > inbox.StaleSkip:
		return nil, fmt.Errorf("pgxinbox: invalid config: StaleEvents: unknown policy %d", config.StaleEvents)
	}
	var fs FingerprintStore
	if config.Fingerprint != nil {
		var ok bool
		if fs, ok = config.Store.(FingerprintStore); !ok {
			return nil, fmt.Errorf("pgxinbox: invalid config: Fingerprint: the store (%T) cannot keep fingerprints (pgxinbox.FingerprintStore)", config.Store)
		}
		if err := fs.CheckFingerprints(); err != nil {
			return nil, fmt.Errorf("pgxinbox: invalid config: Fingerprint: %w", err)
		}
	}
	if config.OnIDReuse < inbox.IDReuseLog || config.OnIDReuse > inbox.IDReuseIgnore {
		return nil, fmt.Errorf("pgxinbox: invalid config: OnIDReuse: unknown policy %d", config.OnIDReuse)
	}
	opts := config.TxOptions
	e := &engine.Engine[pgx.Tx]{
		Consumer: config.Consumer,
		EventID:  config.EventID,
		Claim: func(ctx context.Context, consumer, eventID string) (pgx.Tx, bool, error) {
			return config.Store.Claim(ctx, opts, consumer, eventID)
		},
		Commit:    func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback:  func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		Publisher: config.ProducedPublisher,
		Logger:    config.Logger,

		ShareConsumer: config.ShareConsumer,

		MaxEventAge: config.MaxEventAge,
		EventTime:   config.EventTime,
		StaleEvents: int(config.StaleEvents),
		OnIDReuse:   int(config.OnIDReuse),
	}
	if fs != nil {
		e.Fingerprint = config.Fingerprint
		e.ClaimFingerprint = func(ctx context.Context, consumer, eventID string, fp []byte) (pgx.Tx, bool, []byte, error) {
			return fs.ClaimWithFingerprint(ctx, opts, consumer, eventID, fp)
		}
	}
	if config.Observer != nil {
		e.Observe = engine.AdaptObserver(config.Observer)
	}
	if checker, ok := config.Store.(inbox.EventIDChecker); ok {
		e.CheckEventID = checker.CheckEventID
	}
	return e.Middleware, nil
}

// TxFromContext returns the pgx transaction that holds the message's inbox
// claim; write the handler's effects through it. ok is false outside a
// handler behind this package's middleware. Do not commit or roll back the
// transaction yourself, return an error from the handler instead.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	s := engine.SessionFrom(ctx)
	if s == nil {
		return nil, false
	}
	tx, ok = s.Tx.(pgx.Tx)
	if ok {
		s.MarkTxTaken()
	}
	return tx, ok
}
