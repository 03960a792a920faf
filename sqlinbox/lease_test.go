package sqlinbox_test

import (
	"context"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The lease's life, from an upgrade to a router's close: each test is a
// way the lease used to fail a service.

// An upgrade: the schema of a release before the lease table, and the
// application's role without CREATE on the schema (PostgreSQL 15's default
// for a role that does not own it) calling CreateSchema on start. The
// service starts: CreateSchema creates what it may and says, once, which
// table it could not, with its DDL; the middleware processes every message
// with the shared consumer check off, said once, naming the lease table;
// the inbox check reads the table as missing, with the statement that
// creates it.
func TestUpgradeByARoleThatCannotCreate(t *testing.T) {
	t.Parallel()
	admin := testdb.Postgres(t, "postgres")
	store, effects := poolStore(t, admin, sqlinbox.PostgreSQL)
	_, err := admin.Exec("DROP TABLE " + store.LeaseTable()) // the previous release's schema
	require.NoError(t, err)
	role := testdb.Name("app")
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + store.Table() + ", " + effects.table + " TO " + role,
		"GRANT USAGE ON SCHEMA public TO " + role,
	} {
		_, err := admin.Exec(stmt)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec("REVOKE ALL ON " + store.Table() + ", " + effects.table + " FROM " + role)
		_, _ = admin.Exec("REVOKE ALL ON SCHEMA public FROM " + role)
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})
	var mayCreate bool
	require.NoError(t, admin.QueryRow(`SELECT has_schema_privilege($1, 'public', 'CREATE')`, role).Scan(&mayCreate))
	require.False(t, mayCreate, "PostgreSQL 15 and later grant no CREATE on public to other roles")
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	u.User = url.User(role)
	app := testdb.Open(t, "postgres", u.String())

	storeLog := conformancetest.NewLogger()
	appStore, err := sqlinbox.New(app, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: store.Table(), Logger: storeLog})
	require.NoError(t, err)
	require.NoError(t, appStore.CreateSchema(context.Background()), "the service starts")
	require.NoError(t, appStore.CreateSchema(context.Background()), "and again")
	var logs []watermill.CapturedMessage
	for _, l := range storeLog.Infos() {
		if strings.HasPrefix(l.Msg, "Inbox: warning: ") {
			logs = append(logs, l)
		}
	}
	require.Len(t, logs, 2, "said by each call")
	require.Empty(t, storeLog.Errors())
	require.Contains(t, logs[0].Msg, "lease table could not be created")
	require.Equal(t, store.LeaseTable(), logs[0].Fields["table"])
	require.Contains(t, logs[0].Fields["ddl"], "CREATE TABLE IF NOT EXISTS \""+store.LeaseTable()+"\"")

	logger := conformancetest.NewLogger()
	mw, err := inbox.NewMiddleware(inbox.Config{Store: appStore, Consumer: "billing", Logger: logger})
	require.NoError(t, err)
	for i := range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", i))
		_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
			return nil, effects.write(msg.Context(), fmt.Sprintf("ev-%d", i))
		})(msg)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1}, effects.count(t))
	require.Empty(t, logger.Errors())
	warned := logger.Warnings()
	require.Len(t, warned, 1, "said once")
	require.Equal(t, string(observe.Unchecked), warned[0].Fields["warning"])
	require.Contains(t, warned[0].Fields["reason"], "the lease table "+store.LeaseTable()+" does not exist")
	require.NotContains(t, warned[0].Fields["reason"], "inbox table does not exist", "the message names the lease table")

	_, err = appStore.Maintenance().Leases(context.Background())
	require.ErrorIs(t, err, maintenance.ErrNoLeaseTable)
	require.ErrorContains(t, err, store.LeaseTable())
	require.ErrorContains(t, err, "CREATE TABLE IF NOT EXISTS")
}

// router.Close() right after a message, thirty times: nothing of the
// middleware outlives it. No connection is in use once Close returns, the
// database can be closed at once, and nothing is logged at error level
// for it. Not parallel: it counts the goroutines of the process.
func TestRouterCloseLeavesNothingBehind(t *testing.T) {
	start, before := runtime.NumGoroutine(), 0
	for try := range 31 {
		if try == 1 {
			// The first run starts the runtime's cleanup goroutine
			// (each pool's gate is dropped with the pool) for good.
			require.Eventually(t, func() bool { before = runtime.NumGoroutine(); return before <= start+1 }, 10*time.Second, 10*time.Millisecond)
		}
		db := testdb.Postgres(t, "pgx")
		store, effects := poolStore(t, db, sqlinbox.PostgreSQL)
		logger := conformancetest.NewLogger()
		mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Logger: logger})
		require.NoError(t, err)
		ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
		router, err := message.NewRouter(message.RouterConfig{}, logger)
		require.NoError(t, err)
		router.AddMiddleware(mw)
		router.AddConsumerHandler("billing", "orders", ps, func(msg *message.Message) error {
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			return effects.write(msg.Context(), id)
		})
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", try))
		require.NoError(t, ps.Publish("orders", msg)) // returns once acked
		require.NoError(t, router.Close())
		require.Zero(t, db.Stats().InUse, "try %d: a connection is still in use after router.Close", try)
		require.Equal(t, map[string]int{fmt.Sprintf("ev-%d", try): 1}, effects.count(t))
		require.NoError(t, ps.Close())
		require.NoError(t, db.Close())
		require.Empty(t, logger.Errors(), "try %d", try)
	}
	// The router's, the pub/sub's and the pools' goroutines end on their
	// own time after Close; the middleware started none.
	if !assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before }, 10*time.Second, 10*time.Millisecond) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
	}
}

// A database outage (here its connections cut and new ones refused) before
// a consumer's first message: the shared consumer check could not run, and
// says the database was unreachable. Once the database is back, the check
// runs again by itself, says so, and the lease no longer carries the
// warning, so the inbox check shows none.
func TestLeaseCheckRecoversAfterAnOutage(t *testing.T) {
	t.Parallel()
	admin := testdb.Postgres(t, "pgx")
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	proxy := testdb.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	db := testdb.Open(t, "pgx", u.String())
	store, effects := poolStore(t, db, sqlinbox.PostgreSQL)
	adminStore, err := sqlinbox.New(admin, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: store.Table()})
	require.NoError(t, err)
	logger := conformancetest.NewLogger()
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "billing", Logger: logger})
	require.NoError(t, err)
	n := 0
	deliver := func() error {
		n++
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", n))
		_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			return nil, effects.write(msg.Context(), id)
		})(msg)
		return err
	}

	proxy.Down()
	require.Error(t, deliver(), "the claim fails too")
	warned := logger.Warnings()
	require.Len(t, warned, 1)
	require.Equal(t, string(observe.Unchecked), warned[0].Fields["warning"])
	require.Contains(t, warned[0].Fields["reason"], "the database is unreachable")

	proxy.Up()
	leaseWarnings := func() []string {
		leases, err := adminStore.Maintenance().Leases(context.Background())
		require.NoError(t, err)
		var w []string
		for _, l := range leases {
			w = append(w, l.Warnings)
		}
		return w
	}
	require.Eventually(t, func() bool {
		return deliver() == nil && slices.Equal(leaseWarnings(), []string{""})
	}, 20*time.Second, 100*time.Millisecond, "the lease of the process, without warnings")
	var again int
	for _, l := range logger.Infos() {
		if strings.Contains(l.Msg, "check runs again") {
			again++
		}
	}
	require.Equal(t, 1, again, "the recovery is said once")
	require.Len(t, logger.Warnings(), 1, "the outage was said once")
	require.Empty(t, logger.Errors())
}

// SQLite with a pool of one (SetMaxOpenConns(1)), two consumers, and a
// handler of the first holding its transaction for 12 s without touching
// the pool: the second consumer's first message waits for the connection
// at the pool's gate, lease renewal and claim alike, and nothing is taken
// for a handler waiting for itself, nor for a check that could not run.
func TestPoolOfOneLeaseWaitsBesideASlowHandler(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	db.SetMaxOpenConns(1)
	logger := conformancetest.NewLogger()
	store, effects := poolStore(t, db, sqlinbox.SQLite, func(c *sqlinbox.Config) { c.Logger = logger })
	mws := map[string]message.HandlerMiddleware{}
	for _, consumer := range []string{"a", "b"} {
		mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: consumer, Logger: logger})
		require.NoError(t, err)
		mws[consumer] = mw
	}
	deliver := func(consumer, id string, h func(msg *message.Message) error) error {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
		_, err := mws[consumer](func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) })(msg)
		return err
	}
	require.NoError(t, deliver("a", "ev-0", func(msg *message.Message) error { return effects.write(msg.Context(), "ev-0") }))

	holding := make(chan struct{})
	slow := make(chan error, 1)
	go func() {
		slow <- deliver("a", "ev-1", func(msg *message.Message) error {
			inbox.TxNotNeeded(msg.Context())
			close(holding)
			time.Sleep(12 * time.Second) // an HTTP call, longer than the pool's warning
			return nil
		})
	}()
	<-holding
	require.NoError(t, deliver("b", "ev-2", func(msg *message.Message) error { return effects.write(msg.Context(), "ev-2") }))
	require.NoError(t, <-slow)
	require.Equal(t, map[string]int{"ev-0": 1, "ev-2": 1}, effects.count(t))
	require.Empty(t, logger.Errors(), "no handler waited for itself")
	require.Empty(t, logger.Warnings(), "every check ran")
}

// A SQLite pool of one, 60,000 expired rows, and the purge: it gives the
// connection back between its batches, so a claim waits for one batch,
// not for the round. Proved by construction first (a claim completes
// while the purge is held between two batches), then measured: the waits
// of claims made one after the other during a round.
func TestSQLitePurgeYieldsThePoolOfOne(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	db.SetMaxOpenConns(1)
	store, effects := poolStore(t, db, sqlinbox.SQLite)
	seed := func(rows int) {
		_, err := db.Exec(`INSERT INTO "`+store.Table()+`" (consumer, event_id, processed_at)
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
SELECT 'old', 'old-' || i, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-30 days') FROM n`, rows-1)
		require.NoError(t, err)
	}
	seed(3000) // three batches
	var durations []time.Duration
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "billing", Observer: observeFunc(func(o observe.Observation) {
		if o.Outcome == observe.Processed {
			durations = append(durations, o.ClaimDuration)
		}
	})})
	require.NoError(t, err)
	n := 0
	claim := func() error {
		n++
		id := fmt.Sprintf("ev-%d", n)
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
		_, err := mw(func(msg *message.Message) ([]*message.Message, error) { return nil, effects.write(msg.Context(), id) })(msg)
		return err
	}

	// Held between its first two batches, the purge must let a claim by.
	claimed := make(chan error, 1)
	var batches atomic.Int64
	p, err := purge.New(store, purge.Config{Retention: 7 * 24 * time.Hour, OnBatch: func(int64) {
		if batches.Add(1) == 1 {
			go func() { claimed <- claim() }()
			select {
			case err := <-claimed:
				claimed <- err
			case <-time.After(10 * time.Second):
			}
		}
	}})
	require.NoError(t, err)
	deleted, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(3000), deleted)
	select {
	case err := <-claimed:
		require.NoError(t, err, "a claim went through between two batches")
	default:
		t.Fatal("no claim went through between two batches: the purge held the only connection")
	}

	// Measured: claims one after the other, a few milliseconds apart,
	// during a round.
	seed(60000)
	durations = nil
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		_, err := p.PurgeOnce(context.Background())
		require.NoError(t, err)
	}()
	for running := true; running; {
		require.NoError(t, claim())
		select {
		case <-done:
			running = false
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	slices.Sort(durations)
	t.Logf("a 60,000-row purge round took %s; %d claims during it waited median %s, p90 %s, max %s",
		took.Round(time.Millisecond), len(durations), durations[len(durations)/2], durations[len(durations)*9/10], durations[len(durations)-1])
	// Before, a claim waited for nearly the whole round (5.1 s of 5.3).
	require.Less(t, durations[len(durations)-1], took/4, "a claim waits for a batch, not for the round")
}

// Two stores (two tables) on one pool of three connections, their handlers
// each reading once through the *sql.DB: the stores share the pool's gate,
// which keeps one connection free for all of them, so every delivery ends
// and every effect commits once.
func TestStoresSharingAPoolShareItsGate(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	db.SetMaxOpenConns(3)
	billing, effects := poolStore(t, db, sqlinbox.PostgreSQL)
	mailing, _ := poolStore(t, db, sqlinbox.PostgreSQL)
	mwA, err := inbox.NewMiddleware(inbox.Config{Store: billing, Consumer: "c"})
	require.NoError(t, err)
	mwB, err := inbox.NewMiddleware(inbox.Config{Store: mailing, Consumer: "c"})
	require.NoError(t, err)
	// Even events go through the first table, odd ones through the second.
	both := func(h message.HandlerFunc) message.HandlerFunc {
		a, b := mwA(h), mwB(h)
		return func(msg *message.Message) ([]*message.Message, error) {
			var n int
			_, _ = fmt.Sscanf(msg.Metadata.Get(inbox.DefaultEventIDMetadataKey), "ev-%d", &n)
			if n%2 == 0 {
				return a(msg)
			}
			return b(msg)
		}
	}
	errs := conformancetest.PoolMisuse(t, both, 20, 2, 60*time.Second, func(ctx context.Context) error {
		var one int
		return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	}, effects.write)
	want := map[string]int{}
	for i := range 20 {
		want[fmt.Sprintf("ev-%d", i)] = 1
	}
	require.Equal(t, want, effects.count(t), "errors: %v", errs)
}

// observeFunc is an observer of each message's end.
type observeFunc func(observe.Observation)

func (f observeFunc) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, f
}
