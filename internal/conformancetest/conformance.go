package conformancetest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Target is one database reached through one driver.
type Target struct {
	Name    string
	Dialect sqlinbox.Dialect
	// Open returns a connection pool to an empty-enough database; tables are
	// created with unique names.
	Open func(t testing.TB) *sql.DB
	// Placeholder renders the n-th (1-based) bind parameter.
	Placeholder func(n int) string

	// FailedStatementAbortsTx: after a failed statement the transaction can
	// only roll back (PostgreSQL), so a handler that swallows a SQL error
	// must still see its message nacked.
	FailedStatementAbortsTx bool
	// ClaimTimeout: the database can bound the wait of a claim behind an
	// in-flight copy of the same event (sqlinbox.Config.ClaimTimeout).
	ClaimTimeout bool
	// ClaimTimeoutUnit is the smallest timeout the database honours
	// (MySQL's innodb_lock_wait_timeout counts whole seconds).
	ClaimTimeoutUnit time.Duration
	// TextColumn is the SQL type of the business table's text columns. It
	// must compare bytes exactly, like the inbox, or the effect counts would
	// merge "Case" and "case". Defaults to VARCHAR(255).
	TextColumn string
	// ProcessedAt renders a time as the value the inbox's processed_at
	// column holds (SQLite: RFC 3339 text in UTC). Defaults to the
	// time.Time itself.
	ProcessedAt func(time.Time) any
	// Partitioning is the inbox table's layout (PostgreSQL time
	// partitions, whose claims take another path). Defaults to none.
	Partitioning sqlinbox.Partitioning
	// EventIDTime partitions the table by the time inside event ids
	// (sqlinbox.EventIDTime, with Partitioning). The suite's readable ids
	// carry no time: each store it builds is wrapped in timedIDs.
	EventIDTime bool

	// TransactionPooling: Open reaches PostgreSQL through a
	// transaction-pooling proxy, and the stores are configured for it
	// (sqlinbox.Config.TransactionPooling).
	TransactionPooling bool

	// Native, when set, runs the suite on the target's own store instead of
	// a *sqlinbox.Store on Open. Tables are still created and inspected
	// through Open.
	Native *Native
}

// Native is a store whose transaction is not a *sql.Tx (native pgx).
type Native struct {
	// Store opens a store of the inbox table described by sc on a
	// connection pool of its own, which the test's end, or closePool,
	// closes. err is the store constructor's.
	Store func(t testing.TB, sc sqlinbox.Config) (store inboxdriver.Store, closePool func(), err error)
	// Exec runs a statement in the inbox transaction of the message whose
	// context is ctx.
	Exec func(ctx context.Context, query string, args ...any) error
}

// Dollar renders PostgreSQL placeholders.
func Dollar(n int) string { return fmt.Sprintf("$%d", n) }

// Question renders MySQL and SQLite placeholders.
func Question(int) string { return "?" }

// Run runs the whole suite against target.
func Run(t *testing.T, target Target) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, target Target)
	}{
		{"EachEventHasOneEffect", testEachEventHasOneEffect},
		{"EventIDMetadataBeatsEnvelopeUUID", testEventIDMetadataBeatsEnvelopeUUID},
		{"RacingRoutersOneWinner", testRacingRoutersOneWinner},
		{"ConcurrentClaimsOneWinner", testConcurrentClaimsOneWinner},
		{"HandlerErrorRollsBack", testHandlerErrorRollsBack},
		{"HandlerPanicRollsBack", testHandlerPanicRollsBack},
		{"PanicUnderRecovererIsRedelivered", testPanicUnderRecovererIsRedelivered},
		{"ConsumersAreIndependent", testConsumersAreIndependent},
		{"BadEventIDs", testBadEventIDs},
		{"NoConsumer", testNoConsumer},
		{"ClosedDatabase", testClosedDatabase},
		{"CancelledContextMidHandler", testCancelledContextMidHandler},
		{"SwallowedStatementError", testSwallowedStatementError},
		{"HandlerErrorOfAnOutagesType", testHandlerErrorOfAnOutagesType},
		{"HandlerDeadlineIsItsOwn", testHandlerDeadlineIsItsOwn},
		{"InFlightDuplicateWaits", testInFlightDuplicateWaits},
		{"InFlightRollbackLetsDuplicateThrough", testInFlightRollbackLetsDuplicateThrough},
		{"ClaimTimeout", testClaimTimeout},
		{"AfterCommitHooks", testAfterCommitHooks},
		{"AfterCommitHookPanics", testAfterCommitHookPanics},
		{"ObserverPanics", testObserverPanics},
		{"ProducedPublisherTx", testProducedPublisherTx},
		{"AfterCommitAfterTheHandler", testAfterCommitAfterTheHandler},
		{"ContextRestored", testContextRestored},
		{"UUIDEventIDs", testUUIDEventIDs},
		{"SchemaIdempotent", testSchemaIdempotent},
		{"IDReuse", testIDReuse},
		{"IDReuseLegacyRows", testIDReuseLegacyRows},
		{"StaleEvents", testStaleEvents},
		{"OldestClaim", testOldestClaim},
		{"RetryInsideAfterStatementError", testRetryInsideAfterStatementError},
		{"PoisonQueueInsideAfterStatementError", testPoisonQueueInsideAfterStatementError},
		{"UnusedTxReported", testUnusedTxReported},
		{"FixedConsumerFromTwoHandlers", testFixedConsumerFromTwoHandlers},
		{"ConsumerSharedByTwoServices", testConsumerSharedByTwoServices},
		{"LeaseTableMissing", testLeaseTableMissing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, target)
		})
	}
	for _, tc := range batchCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, target)
		})
	}
}

// bundle is one test's fixtures: an inbox store on a fresh table and a
// business table the handler writes its effect to.
type bundle struct {
	target  Target
	db      *sql.DB
	store   *sqlinbox.Store
	config  sqlinbox.Config // store's configuration
	effects string

	mu       sync.Mutex
	attempts map[string]int // handler calls per event id
}

func setup(t *testing.T, target Target, mutate ...func(*sqlinbox.Config)) *bundle {
	t.Helper()
	db := target.Open(t)
	cfg := sqlinbox.Config{Dialect: target.Dialect, Table: testdb.Table(t, db, "inbox"), Partitioning: target.Partitioning, TransactionPooling: target.TransactionPooling}
	if target.EventIDTime {
		cfg.PartitionKey = sqlinbox.EventIDTime
	}
	for _, m := range mutate {
		m(&cfg)
	}
	store, err := sqlinbox.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	t.Cleanup(func() { _ = store.Close() })

	b := &bundle{target: target, db: db, store: store, config: cfg, attempts: map[string]int{}}
	b.effects = b.table(t, "effects", "consumer", "event_id")
	return b
}

// table creates a business table of text columns and returns its name.
func (b *bundle) table(t testing.TB, prefix string, columns ...string) string {
	t.Helper()
	name := testdb.Table(t, b.db, prefix)
	text := b.target.TextColumn
	if text == "" {
		text = "VARCHAR(255)"
	}
	defs := make([]string, len(columns))
	for i, c := range columns {
		defs[i] = c + " " + text + " NOT NULL"
	}
	_, err := b.db.Exec(fmt.Sprintf(`CREATE TABLE %s (%s)`, name, strings.Join(defs, ", ")))
	require.NoError(t, err)
	return name
}

func (b *bundle) middleware(t testing.TB, cfg inbox.Config) message.HandlerMiddleware {
	t.Helper()
	if cfg.Store == nil {
		if b.target.Native != nil {
			store, _, err := b.target.Native.Store(t, b.config)
			require.NoError(t, err)
			cfg.Store = b.timed(store)
		} else {
			cfg.Store = b.timed(b.store)
		}
	}
	mw, err := inbox.NewMiddleware(cfg)
	require.NoError(t, err)
	return mw
}

// middlewareOn builds the middleware on a store of the bundle's table
// configured as sc, and returns the constructor's error.
func (b *bundle) middlewareOn(t testing.TB, sc sqlinbox.Config, cfg inbox.Config) (message.HandlerMiddleware, error) {
	t.Helper()
	if b.target.Native != nil {
		store, _, err := b.target.Native.Store(t, sc)
		if err != nil {
			return nil, err
		}
		cfg.Store = b.timed(store)
		return inbox.NewMiddleware(cfg)
	}
	store, err := sqlinbox.New(b.db, sc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	cfg.Store = b.timed(store)
	return inbox.NewMiddleware(cfg)
}

// freshMiddleware builds the middleware on a connection pool of its own, as
// another process would; closePool closes that pool.
func (b *bundle) freshMiddleware(t testing.TB, cfg inbox.Config) (mw message.HandlerMiddleware, closePool func()) {
	t.Helper()
	if b.target.Native != nil {
		store, closePool, err := b.target.Native.Store(t, b.config)
		require.NoError(t, err)
		cfg.Store = b.timed(store)
		return b.middleware(t, cfg), closePool
	}
	db := b.target.Open(t)
	store, err := sqlinbox.New(db, b.config)
	require.NoError(t, err)
	cfg.Store = b.timed(store)
	return b.middleware(t, cfg), func() { _ = db.Close() }
}

// exec runs a statement in the inbox transaction of ctx's message.
func (b *bundle) exec(ctx context.Context, query string, args ...any) error {
	if b.target.Native != nil {
		return b.target.Native.Exec(ctx, query, args...)
	}
	tx, ok := inbox.TxFromContext(ctx)
	if !ok {
		return fmt.Errorf("handler runs without an inbox transaction")
	}
	_, err := tx.ExecContext(ctx, query, args...)
	return err
}

// writeEffect is the non-idempotent business write: a plain INSERT with no
// unique key, so every extra commit shows up as an extra row.
func (b *bundle) writeEffect(msg *message.Message) error {
	ctx := msg.Context()
	id, consumer, ok := inbox.EventIDFromContext(ctx)
	if !ok {
		return fmt.Errorf("handler runs without an inbox transaction")
	}
	b.mu.Lock()
	b.attempts[id]++
	b.mu.Unlock()
	return b.exec(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES (%s, %s)`,
		b.effects, b.target.Placeholder(1), b.target.Placeholder(2)), consumer, id)
}

// handler writes the effect; fail, if set, decides per attempt (1-based)
// whether to return an error after writing.
func (b *bundle) handler(fail func(id string, attempt int) error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if err := b.writeEffect(msg); err != nil {
			return nil, err
		}
		if fail != nil {
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			if err := fail(id, b.attemptsOf(id)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
}

func (b *bundle) attemptsOf(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attempts[id]
}

// effectCounts returns committed effects per "consumer/event_id".
func (b *bundle) effectCounts(t testing.TB) map[string]int {
	t.Helper()
	rows, err := b.db.Query(fmt.Sprintf(`SELECT consumer, event_id, COUNT(*) FROM %s GROUP BY consumer, event_id`, b.effects))
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var c, id string
		var n int
		require.NoError(t, rows.Scan(&c, &id, &n))
		out[c+"/"+id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *bundle) count(t testing.TB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

func (b *bundle) claims(t testing.TB) int { return b.count(t, b.store.Table()) }

// once returns, for n events, the expected map of one effect each.
func once(consumer string, ids ...string) map[string]int {
	out := map[string]int{}
	for _, id := range ids {
		out[consumer+"/"+id] = 1
	}
	return out
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func newMsg(id string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
	return msg
}

// pubsub is an in-memory broker whose Publish returns only once every
// subscriber acked, redelivering nacked messages at once: when Publish
// returns, the message's whole story has played out.
func pubsub() *gochannel.GoChannel {
	return gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
}

// RunRouter starts a router configured by add and stops it when the test
// ends.
func RunRouter(t *testing.T, add func(r *message.Router)) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	add(r)
	go func() { _ = r.Run(context.Background()) }()
	t.Cleanup(func() { _ = r.Close() })
	select {
	case <-r.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}
}

func publish(t testing.TB, pub message.Publisher, topic string, msgs ...*message.Message) {
	t.Helper()
	for _, m := range msgs {
		require.NoError(t, pub.Publish(topic, m))
	}
}

// call runs h behind mw directly, as a router would, for tests that need to
// see the returned error or panic.
func call(mw message.HandlerMiddleware, h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	return mw(h)(msg)
}
