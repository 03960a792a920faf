// Package datalayer runs handlers that write through the data layers users
// write with (sqlc, GORM, ent, bun, sqlx) behind the inbox middleware, on
// each database they support, and tells from the database whether their
// writes joined the inbox transaction.
//
// Each test gets a namespace of its own (a PostgreSQL schema, a MariaDB
// database, an SQLite file), so the generated code can name its table
// plainly: invoices, one row per handled order, with no unique key, so that
// an effect applied twice shows up as a second row. Messages go through
// gochannel with a router, Recoverer outside the inbox and the handler
// wrapped by inbox.ConsumerHandler; a publish returns once its message is
// acked, after every redelivery, so a test reads the outcome right after.
package datalayer

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The invoices table, per dialect; sqlc generates its code from the same
// files.
//
//go:embed schema/*.sql
var schemas embed.FS

// Backend is one inbox store on one database.
type Backend string

// The backends.
const (
	Postgres Backend = "postgres" // sqlinbox on pgx's database/sql driver
	Pgx      Backend = "pgx"      // pgxinbox on a pgxpool.Pool
	MariaDB  Backend = "mariadb"  // sqlinbox on go-sql-driver/mysql
	SQLite   Backend = "sqlite"   // sqlinbox on modernc.org/sqlite
)

// SQL is every backend on database/sql.
var SQL = []Backend{Postgres, MariaDB, SQLite}

// Each runs test for every backend as a parallel subtest.
func Each(t *testing.T, backends []Backend, test func(t *testing.T, r *Rig)) {
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			t.Parallel()
			test(t, New(t, b))
		})
	}
}

// Rig is one test's namespace: its pool, inbox store and invoices table.
type Rig struct {
	Backend Backend
	// DB is the pool the store claims on; on Pgx, a database/sql pool on
	// the same schema, for counting.
	DB *sql.DB
	// Pool is the store's pool on Pgx, else nil.
	Pool  *pgxpool.Pool
	store inboxdriver.Store
}

// sqliteBusyTimeout is shorter than sqlinbox.SQLiteDSN's, so that a write
// around the inbox transaction, which waits for its write lock, gives up
// soon. Deliveries are sequential, so claims never wait.
const sqliteBusyTimeout = 300 * time.Millisecond

// New makes a namespace on backend with an invoices table and an inbox
// table, removed when the test ends.
func New(t testing.TB, backend Backend) *Rig {
	t.Helper()
	r := &Rig{Backend: backend}
	ctx := context.Background()
	name := testdb.Name("datalayer")
	dialect := sqlinbox.PostgreSQL
	switch backend {
	case Postgres, Pgx:
		admin := testdb.Postgres(t, "pgx")
		_, err := admin.Exec(`CREATE SCHEMA ` + name)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(`DROP SCHEMA ` + name + ` CASCADE`) })
		dsn, err := url.Parse(testdb.PostgresDSN())
		require.NoError(t, err)
		q := dsn.Query()
		q.Set("search_path", name)
		dsn.RawQuery = q.Encode()
		r.DB = testdb.Open(t, "pgx", dsn.String())
		if backend == Pgx {
			r.Pool, err = pgxpool.New(ctx, dsn.String())
			require.NoError(t, err)
			t.Cleanup(r.Pool.Close)
		}
	case MariaDB:
		dialect = sqlinbox.MySQL
		admin := testdb.MySQL(t)
		_, err := admin.Exec(`CREATE DATABASE ` + name)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(`DROP DATABASE ` + name) })
		cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
		require.NoError(t, err)
		cfg.DBName = name
		r.DB = testdb.Open(t, "mysql", cfg.FormatDSN())
	case SQLite:
		dialect = sqlinbox.SQLite
		// sqlinbox.SQLiteDSN's settings, with a shorter busy timeout.
		dsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_txlock=immediate",
			testdb.SQLiteFile(t), sqliteBusyTimeout.Milliseconds())
		r.DB = testdb.Open(t, "sqlite", dsn)
	default:
		t.Fatalf("unknown backend %q", backend)
	}
	ddl, err := schemas.ReadFile("schema/" + dialect.String() + ".sql")
	require.NoError(t, err)
	_, err = r.DB.Exec(string(ddl))
	require.NoError(t, err)

	config := sqlinbox.Config{Dialect: dialect}
	if backend == Pgx {
		store, err := pgxinbox.NewStore(r.Pool, config)
		require.NoError(t, err)
		require.NoError(t, store.CreateSchema(ctx))
		r.store = store
	} else {
		store, err := sqlinbox.New(r.DB, config)
		require.NoError(t, err)
		require.NoError(t, store.CreateSchema(ctx))
		r.store = store
	}
	return r
}

// Write is a handler that writes the invoice of the order whose id is the
// message's UUID (also its event id) through the data layer under test.
type Write = func(msg *message.Message) error

// Invoices counts the invoices of each order.
func (r *Rig) Invoices(t testing.TB) map[string]int {
	t.Helper()
	rows, err := r.DB.Query(`SELECT order_id, count(*) FROM invoices GROUP BY order_id`)
	require.NoError(t, err)
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		counts[id] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

// Deliveries is one router with the inbox in front of a handler: each
// Deliver publishes one message and returns once it is acked.
type Deliveries struct {
	t       testing.TB
	pubsub  *gochannel.GoChannel
	logs    *watermill.CaptureLoggerAdapter
	mu      sync.Mutex
	calls   map[string]int
	handler func(msg *message.Message, attempt int) error
}

// Start runs a router whose handler, behind the inbox, calls handler with
// the message and the handler call's number for its event, counting from
// 1.
func (r *Rig) Start(t testing.TB, handler func(msg *message.Message, attempt int) error) *Deliveries {
	t.Helper()
	d := &Deliveries{
		t:       t,
		pubsub:  gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{}),
		logs:    watermill.NewCaptureLogger(),
		calls:   map[string]int{},
		handler: handler,
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: r.store, Logger: d.logs})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(middleware.Recoverer)
	router.AddConsumerHandler("invoicing", "orders", d.pubsub, inbox.ConsumerHandler(mw, d.handle))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("the router stopped at start: %v", err)
	}
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, d.pubsub.Close()) // also ends a publish Deliver gave up on
	})
	return d
}

func (d *Deliveries) handle(msg *message.Message) error {
	d.mu.Lock()
	d.calls[msg.UUID]++
	attempt := d.calls[msg.UUID]
	d.mu.Unlock()
	return d.handler(msg, attempt)
}

// Deliver publishes a message whose event id (and order id) is id, and
// returns once the router acked it. Delivering an id again is a duplicate.
func (d *Deliveries) Deliver(id string) {
	d.t.Helper()
	published := make(chan error, 1)
	go func() { published <- d.pubsub.Publish("orders", message.NewMessage(id, nil)) }()
	select {
	case err := <-published:
		require.NoError(d.t, err)
	case <-time.After(time.Minute):
		d.t.Fatalf("event %s still not acked after a minute: its handler fails on every redelivery", id)
	}
}

// Calls is how many times the handler ran for id.
func (d *Deliveries) Calls(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[id]
}

// UnusedTxReported says whether the middleware logged a handler that
// succeeded without taking the inbox transaction.
func (d *Deliveries) UnusedTxReported() bool {
	for _, m := range d.logs.Captured()[watermill.InfoLogLevel] {
		if m.Fields["warning"] == string(observe.TxUnused) {
			return true
		}
	}
	return false
}

// NewID returns a fresh event id.
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// errFirstAttempt fails a handler's first attempt after it wrote.
var errFirstAttempt = errors.New("the first attempt fails after writing")

// RequireExactlyOnce proves write joins the inbox transaction: three
// orders, each delivered twice; the first attempt at the second fails after
// writing, at the third panics after writing. Each order ends with one
// invoice, and the handler ran once for the first order (its copy was
// skipped as a duplicate) and twice for the others (the failed attempt
// rolled back with its claim, and the redelivery was processed again).
func (r *Rig) RequireExactlyOnce(t testing.TB, write Write) {
	t.Helper()
	plain, failing, panicking := NewID(), NewID(), NewID()
	d := r.Start(t, func(msg *message.Message, attempt int) error {
		if err := write(msg); err != nil {
			return err
		}
		if attempt == 1 && msg.UUID == failing {
			return errFirstAttempt
		}
		if attempt == 1 && msg.UUID == panicking {
			panic("the first attempt panics after writing")
		}
		return nil
	})
	for _, id := range []string{plain, failing, panicking, plain, failing, panicking} {
		d.Deliver(id)
	}
	invoices := r.Invoices(t)
	require.Equal(t, []int{1, 1, 1}, []int{invoices[plain], invoices[failing], invoices[panicking]}, "invoices per order")
	require.Equal(t, []int{1, 2, 2}, []int{d.Calls(plain), d.Calls(failing), d.Calls(panicking)}, "handler calls per order")
	require.False(t, d.UnusedTxReported(), "the handler took the inbox transaction")
}

// FirstAttemptFails is what became of a write made by a handler whose first
// attempt then failed.
type FirstAttemptFails struct {
	// Invoices is the order's invoice count after the redelivery: 1 when
	// the write joined the inbox transaction, 2 when it escaped it (the
	// failed attempt's write survived its rollback), 0 when it failed.
	Invoices int
	// Errs are the write's errors, one per attempt (two attempts).
	Errs []error
	// UnusedTxReported says whether the middleware logged the handler for
	// succeeding without taking the inbox transaction.
	UnusedTxReported bool
}

// FailFirstAttempt delivers one order whose handler calls write, then fails
// on its first attempt; the second succeeds, even if write failed. With
// takeTx, the handler takes the inbox transaction first, as a handler that
// also writes through it does.
func (r *Rig) FailFirstAttempt(t testing.TB, takeTx bool, write Write) FirstAttemptFails {
	t.Helper()
	var res FirstAttemptFails
	id := NewID()
	d := r.Start(t, func(msg *message.Message, attempt int) error {
		if takeTx {
			r.takeTx(msg.Context())
		}
		res.Errs = append(res.Errs, write(msg))
		if attempt == 1 {
			return errFirstAttempt
		}
		return nil
	})
	d.Deliver(id)
	require.Equal(t, 2, d.Calls(id))
	res.Invoices = r.Invoices(t)[id]
	res.UnusedTxReported = d.UnusedTxReported()
	return res
}

// TryOnce calls write in a handler's first attempt, which then fails (with
// write's error, or after writing); the redelivery succeeds without calling
// write. It returns write's error and the order's invoices: 0 unless the
// write escaped the inbox transaction. For a write that fails, which on
// PostgreSQL aborts the inbox transaction, so that no attempt making it can
// commit.
func (r *Rig) TryOnce(t testing.TB, write Write) (invoices int, err error) {
	t.Helper()
	id := NewID()
	d := r.Start(t, func(msg *message.Message, attempt int) error {
		if attempt > 1 {
			inbox.TxNotNeeded(msg.Context())
			return nil
		}
		if err = write(msg); err != nil {
			return err
		}
		return errFirstAttempt
	})
	d.Deliver(id)
	require.Equal(t, 2, d.Calls(id))
	return r.Invoices(t)[id], err
}

func (r *Rig) takeTx(ctx context.Context) {
	if r.Backend == Pgx {
		_, _ = pgxinbox.TxFromContext(ctx)
	} else {
		_, _ = inbox.TxFromContext(ctx)
	}
}

// RequireJoined asserts the write joined the inbox transaction: it rolled
// back with the failed attempt.
func (r *Rig) RequireJoined(t testing.TB, res FirstAttemptFails) {
	t.Helper()
	require.Equal(t, []error{nil, nil}, res.Errs)
	require.Equal(t, 1, res.Invoices, "the failed attempt's invoice rolled back with the claim")
}

// RequireEscaped asserts the write went around the inbox transaction. On
// PostgreSQL and MariaDB it committed on its own: the failed attempt's
// invoice survived its rollback, and the redelivery added a second one. On
// SQLite it could not: the inbox transaction holds the database's one write
// lock, so the write waited for it (busy_timeout) and failed with
// SQLITE_BUSY, on every attempt.
func (r *Rig) RequireEscaped(t testing.TB, res FirstAttemptFails) {
	t.Helper()
	if r.Backend != SQLite {
		require.Equal(t, []error{nil, nil}, res.Errs)
		require.Equal(t, 2, res.Invoices, "the failed attempt's invoice survived its rollback")
		return
	}
	require.Len(t, res.Errs, 2)
	for _, err := range res.Errs {
		RequireSQLiteBusy(t, err)
	}
	require.Equal(t, 0, res.Invoices)
}

// RequireSQLiteBusy asserts err is SQLite's "database is locked".
func RequireSQLiteBusy(t testing.TB, err error) {
	t.Helper()
	var se *sqlite.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, sqlite3.SQLITE_BUSY, se.Code(), "%v", err)
}

// errNested rolls a nested transaction back.
var errNested = errors.New("the nested transaction fails")

// RequireSavepoint proves nested runs a savepoint of the inbox transaction.
// The handler writes the order's invoice, then nested writes a second one
// in the data layer's own nested transaction and fails with the error it is
// given, which must roll that transaction back; nested returns what the
// data layer's call returned, which must be that error. The handler then
// succeeds: the first invoice commits with the claim, the second does not.
// With FailFirstAttempt showing the nested write joins the inbox
// transaction, this tells a savepoint from a separate transaction and from
// a rollback of the whole inbox transaction.
func (r *Rig) RequireSavepoint(t testing.TB, write Write, nested func(msg *message.Message, fail error) error) {
	t.Helper()
	id := NewID()
	var nestedErr error
	d := r.Start(t, func(msg *message.Message, attempt int) error {
		if err := write(msg); err != nil {
			return err
		}
		nestedErr = nested(msg, errNested)
		return nil
	})
	d.Deliver(id)
	require.ErrorIs(t, nestedErr, errNested)
	require.Equal(t, 1, d.Calls(id))
	require.Equal(t, 1, r.Invoices(t)[id], "the nested transaction's invoice rolled back alone")
}
