package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func sqliteDSN(path string, pragmas url.Values) string {
	return "file:" + path + "?" + pragmas.Encode()
}

// A connection opened with SQLiteDSN waits DefaultSQLiteBusyTimeout for
// the write lock, in WAL mode.
func TestSQLiteDSN(t *testing.T) {
	t.Parallel()
	db := testdb.Open(t, "sqlite", sqlinbox.SQLiteDSN(testdb.SQLiteFile(t)))
	var busy int64
	require.NoError(t, db.QueryRow("PRAGMA busy_timeout").Scan(&busy))
	require.Equal(t, sqlinbox.DefaultSQLiteBusyTimeout, time.Duration(busy)*time.Millisecond)
	require.Equal(t, 5*time.Second, sqlinbox.DefaultSQLiteBusyTimeout)
	var mode string
	require.NoError(t, db.QueryRow("PRAGMA journal_mode").Scan(&mode))
	require.Equal(t, "wal", mode)
}

// Several routers, each with its own pool (as separate processes would
// have), share one SQLite file and receive every copy of every event at the
// same moment. Whatever the lock settings, "database is locked" may only
// ever be a retry: each event has exactly one effect, and every failed
// attempt says ErrInFlight.
func TestSQLiteRoutersShareOneFile(t *testing.T) {
	t.Parallel()
	for name, pragmas := range map[string]url.Values{
		// What SQLiteDSN sets, with a busy timeout short enough that the
		// routers keep running into each other's write lock.
		"WAL, BEGIN IMMEDIATE": {"_pragma": {"busy_timeout(1)", "journal_mode(WAL)"}, "_txlock": {"immediate"}},
		// Default transactions: the claim, a write, is the first statement,
		// so the lock is taken there.
		"WAL, deferred": {"_pragma": {"busy_timeout(1)", "journal_mode(WAL)"}},
		// Rollback journal: COMMIT may also have to wait.
		"rollback journal, deferred": {"_pragma": {"busy_timeout(1)", "journal_mode(DELETE)"}},
		"no busy timeout":            {"_pragma": {"journal_mode(WAL)"}, "_txlock": {"immediate"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn := sqliteDSN(testdb.SQLiteFile(t), pragmas)
			db := testdb.Open(t, "sqlite", dsn)
			store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(context.Background()))
			_, err = db.Exec(`CREATE TABLE effects (event_id TEXT NOT NULL)`)
			require.NoError(t, err)

			ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
			var calls, inFlight atomic.Int64
			var mu sync.Mutex
			var otherErrs []error
			const routers = 4
			for i := range routers {
				pool := testdb.Open(t, "sqlite", dsn)
				s, err := sqlinbox.New(pool, sqlinbox.Config{Dialect: sqlinbox.SQLite})
				require.NoError(t, err)
				mw, err := inbox.NewMiddleware(inbox.Config{Store: s, Consumer: "billing"})
				require.NoError(t, err)
				r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
				require.NoError(t, err)
				r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
					return func(msg *message.Message) ([]*message.Message, error) {
						out, err := h(msg)
						if err != nil {
							// A busy BEGIN or claim wraps ErrInFlight; in
							// rollback-journal mode COMMIT itself can be busy
							// (readers hold SHARED locks): the driver rolls
							// back and the nack retries, so that is safe too.
							var code interface{ Code() int }
							if errors.Is(err, inbox.ErrInFlight) || (errors.As(err, &code) && code.Code()&0xff == 5) {
								inFlight.Add(1)
							} else {
								mu.Lock()
								otherErrs = append(otherErrs, err)
								mu.Unlock()
							}
						}
						return out, err
					}
				}, mw)
				r.AddConsumerHandler(fmt.Sprintf("router-%d", i), "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
					calls.Add(1)
					tx, _ := inbox.TxFromContext(msg.Context())
					id, _, _ := inbox.EventIDFromContext(msg.Context())
					_, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (event_id) VALUES (?)`, id)
					time.Sleep(time.Millisecond) // hold the write lock a little
					return err
				}))
				go func() { _ = r.Run(context.Background()) }()
				t.Cleanup(func() { _ = r.Close() })
				<-r.Running()
			}

			const events, copies = 15, 2
			var wg sync.WaitGroup
			for e := range events {
				for range copies {
					wg.Go(func() {
						msg := message.NewMessage(watermill.NewUUID(), nil)
						msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", e))
						require.NoError(t, ps.Publish("events", msg))
					})
				}
			}
			wg.Wait()

			effects := groupCounts(t, db, `SELECT event_id, COUNT(*) FROM effects GROUP BY event_id`)
			want := map[string]int{}
			for e := range events {
				want[fmt.Sprintf("ev-%d", e)] = 1
			}
			require.Equal(t, want, effects)
			var claims int
			require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+store.Table()).Scan(&claims))
			require.Equal(t, events, claims)
			require.Empty(t, otherErrs, "every failed attempt must be a busy database, retried by the nack")
			t.Logf("%d deliveries, %d handler calls, %d attempts nacked as busy", events*copies*routers, calls.Load(), inFlight.Load())
		})
	}
}

// impatientPair returns two stores on one SQLite file with its inbox table:
// first with the recommended settings, second with a 50 ms busy timeout.
func impatientPair(t *testing.T) (first, second *sqlinbox.Store) {
	t.Helper()
	first, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, first.CreateSchema(context.Background()))
	impatient := testdb.Open(t, "sqlite", sqliteDSN(testdb.SQLiteFile(t), url.Values{
		"_pragma": {"busy_timeout(50)", "journal_mode(WAL)"}, "_txlock": {"immediate"},
	}))
	second, err = sqlinbox.New(impatient, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	return first, second
}

// While one transaction holds the write lock, a claim on another connection
// waits busy_timeout and then fails with ErrInFlight, having written
// nothing; once the first commits, the same claim is a duplicate.
func TestSQLiteBusyTimeoutIsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first, second := impatientPair(t)
	impatient := second.DB()

	tx, claimed, err := claim(ctx, first, nil, "c", "x")
	require.NoError(t, err)
	require.True(t, claimed)
	for _, id := range []string{"x", "another event"} {
		_, _, err = claim(ctx, second, nil, "c", id)
		require.ErrorIs(t, err, inbox.ErrInFlight, "one writer at a time: %s waits for the whole database", id)
	}
	require.NoError(t, tx.Commit())

	_, claimed, err = claim(ctx, second, nil, "c", "x")
	require.NoError(t, err)
	require.False(t, claimed)
	var n int
	require.NoError(t, impatient.QueryRow(`SELECT COUNT(*) FROM `+second.Table()).Scan(&n))
	require.Equal(t, 1, n)
}

// A purge batch that cannot get the write lock within the busy timeout (a
// claim holds it) is the purge's timeout: the Purger backs off with a
// smaller batch. It is not a claim's "event in flight".
func TestSQLiteBusyPurgeBatchIsATimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first, impatient := impatientPair(t)
	sess, busy, err := impatient.Maintenance().BeginPurge(ctx)
	require.NoError(t, err)
	require.Nil(t, busy)
	defer sess.Close()

	tx, claimed, err := claim(ctx, first, nil, "c", "x")
	require.NoError(t, err)
	require.True(t, claimed)
	_, err = sess.DeleteBatch(ctx, maintenance.PurgeScope{OlderThan: time.Hour}, 100, 0)
	require.ErrorIs(t, err, maintenance.ErrPurgeTimeout)
	require.NotErrorIs(t, err, inbox.ErrInFlight)
	require.NoError(t, tx.Commit())

	_, err = sess.DeleteBatch(ctx, maintenance.PurgeScope{OlderThan: time.Hour}, 100, 0)
	require.NoError(t, err, "once the lock is free the batch runs")
}

// ClaimTimeout cannot apply to a lock that covers the whole database; the
// busy timeout does that job, and New says so.
func TestSQLiteRefusesClaimTimeout(t *testing.T) {
	t.Parallel()
	_, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite, ClaimTimeout: time.Second})
	require.ErrorContains(t, err, "busy_timeout")
}

// processed_at is the database clock in UTC, as text that sorts in time
// order, for the purge to compare.
func TestSQLiteProcessedAtIsSortableUTC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	before := time.Now().UTC().Truncate(time.Millisecond)
	tx, claimed, err := claim(ctx, store, nil, "c", "x")
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, tx.Commit())
	after := time.Now().UTC()

	var raw string
	require.NoError(t, db.QueryRow(`SELECT processed_at FROM `+store.Table()).Scan(&raw))
	at, err := time.Parse("2006-01-02T15:04:05.000Z", raw)
	require.NoError(t, err, raw)
	require.False(t, at.Before(before) || at.After(after), "%s not within [%s, %s]", at, before, after)
}

// lastOutcome records the outcome of the last message observed.
type lastOutcome struct{ outcome observe.Outcome }

func (o *lastOutcome) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) { o.outcome = ob.Outcome }
}

// A statement that rolls back the whole SQLite transaction (RAISE(ROLLBACK)
// in a trigger, ON CONFLICT ROLLBACK) takes the claim and the handler's
// earlier writes with it, and SQLite runs the next statements in autocommit
// mode. A handler that swallows that error commits them outside the inbox,
// as a swallowed MySQL deadlock does. The COMMIT then fails ("no
// transaction is active"), so the message is nacked as commit_failed, never
// acked; but each redelivery autocommits those statements once more. The
// README documents exactly this.
func TestSQLiteSwallowedRollbackAutocommitsTheRest(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]string{
		"RAISE(ROLLBACK)": `CREATE TABLE guarded (v TEXT);
CREATE TRIGGER guard BEFORE INSERT ON guarded WHEN NEW.v = 'x' BEGIN SELECT RAISE(ROLLBACK, 'refused'); END;`,
		"ON CONFLICT ROLLBACK": `CREATE TABLE guarded (v TEXT UNIQUE ON CONFLICT ROLLBACK);
INSERT INTO guarded VALUES ('x');`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testdb.SQLite(t)
			store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(context.Background()))
			_, err = db.Exec(setup + `CREATE TABLE effects (step TEXT NOT NULL);`)
			require.NoError(t, err)
			obs := &lastOutcome{}
			mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c", Observer: obs})
			require.NoError(t, err)
			handler := mw(func(msg *message.Message) ([]*message.Message, error) {
				ctx := msg.Context()
				tx, _ := inbox.TxFromContext(ctx)
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ('before')`); err != nil {
					return nil, err
				}
				_, swallowed := tx.ExecContext(ctx, `INSERT INTO guarded VALUES ('x')`)
				require.Error(t, swallowed)
				_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ('after')`)
				return nil, err
			})
			steps := func() map[string]int {
				return groupCounts(t, db, `SELECT step, count(*) FROM effects GROUP BY step`)
			}
			for delivery := 1; delivery <= 2; delivery++ {
				_, err := handler(eventMsg("ev-1"))
				require.ErrorContains(t, err, "cannot commit - no transaction is active", "delivery %d", delivery)
				require.Equal(t, observe.CommitFailed, obs.outcome)
				require.Equal(t, map[string]int{"after": delivery}, steps(), "delivery %d", delivery)
				require.Zero(t, countWhere(t, db, sqlinbox.DefaultTable, "ev-1"), "the claim rolled back")
			}
		})
	}
}

// groupCounts runs query, which returns (key, count) rows, into a map.
func groupCounts(t *testing.T, db *sql.DB, query string) map[string]int {
	t.Helper()
	rows, err := db.Query(query)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var key string
		var n int
		require.NoError(t, rows.Scan(&key, &n))
		out[key] = n
	}
	require.NoError(t, rows.Err())
	return out
}
