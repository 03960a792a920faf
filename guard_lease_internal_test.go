package inbox

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
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The lease never sits in a message's path: a renewal blocked by an
// operator's lock on the lease table, or failing on a missing one, costs
// the messages nothing, and is tried again on its own schedule.

// leaseRig is a middleware on a real store, with its lease guard's clock
// in the test's hands.
type leaseRig struct {
	store *sqlinbox.Store
	mw    message.HandlerFunc
	guard *leaseGuard
	clock *testClock
	log   *leaseLog
	n     int
}

func newLeaseRig(t testing.TB, db *sql.DB, dialect sqlinbox.Dialect, table string) *leaseRig {
	t.Helper()
	log := &leaseLog{}
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: dialect, Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	config := Config{Store: store, Consumer: "billing", Logger: log}
	config.setDefaults()
	require.NoError(t, config.validate())
	e := newEngine(config)
	r := &leaseRig{store: store, clock: &testClock{at: time.Now()}, log: log}
	for _, g := range e.guards {
		if lg, ok := g.(*leaseGuard); ok {
			r.guard = lg
		}
	}
	require.NotNil(t, r.guard)
	r.guard.now = r.clock.now
	r.mw = e.middleware(func(msg *message.Message) ([]*message.Message, error) {
		TxNotNeeded(msg.Context())
		return nil, nil
	})
	return r
}

// deliver processes one new event.
func (r *leaseRig) deliver() error {
	r.n++
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", r.n))
	_, err := r.mw(msg)
	return err
}

// deliverBeside processes n new events while a renewal may wait for a
// lock, and fails if they wait for it.
func (r *leaseRig) deliverBeside(t testing.TB, n int) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < n && err == nil; i++ {
			err = r.deliver()
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute): // bounds a failure only
		t.Fatalf("the messages wait for the renewal")
	}
}

// lease is the consumer's lease.
func (r *leaseRig) lease() *lease {
	r.guard.mu.Lock()
	defer r.guard.mu.Unlock()
	return r.guard.leases["billing"]
}

// settled waits for the renewal under way, if any, to end.
func (r *leaseRig) settled(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool { return !r.lease().renewing.Load() }, time.Minute, time.Millisecond)
}

type testClock struct {
	mu sync.Mutex
	at time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(d)
}

// leaseLog keeps the lines about the lease's check, safe to read while a
// renewal logs from its goroutine.
type leaseLog struct {
	mu               sync.Mutex
	unchecked, again int
	reasons, errors  []string
}

func (l *leaseLog) Info(msg string, fields watermill.LogFields) {
	if fields["check"] != leaseCheck {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.Contains(msg, "runs again") {
		l.again++
	} else {
		l.unchecked++
		l.reasons = append(l.reasons, fmt.Sprint(fields["reason"]))
	}
}

func (l *leaseLog) Error(msg string, err error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors = append(l.errors, fmt.Sprintf("%s: %v", msg, err))
}

func (l *leaseLog) Debug(string, watermill.LogFields)                {}
func (l *leaseLog) Trace(string, watermill.LogFields)                {}
func (l *leaseLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// said is the number of unchecked and recovered lines, and the errors.
func (l *leaseLog) said() (unchecked, again int, errors []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unchecked, l.again, append([]string(nil), l.errors...)
}

// firstReason is the reason the first unchecked line gave.
func (l *leaseLog) firstReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reasons[0]
}

// operatorLock is a lock an operator takes on the lease table: hold takes
// it on a connection of its own and returns its release; waiting counts
// the server's sessions waiting on the table.
type operatorLock struct {
	name        string
	dialect     sqlinbox.Dialect
	open        func(t testing.TB) *sql.DB
	driver, dsn string
	take        []string // run on the held connection; %s is the lease table
	release     string
	waiting     string // $1 / ? is a pattern of the lease table's name
}

var operatorLocks = []operatorLock{
	{
		name: "PostgreSQL DELETE in an open transaction", dialect: sqlinbox.PostgreSQL,
		open:   func(t testing.TB) *sql.DB { return testdb.PostgresIfServed(t, "pgx") },
		driver: "pgx", dsn: testdb.PostgresDSN(),
		take: []string{"BEGIN", "DELETE FROM %s"}, release: "COMMIT",
		waiting: "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
	},
	{
		name: "PostgreSQL LOCK TABLE", dialect: sqlinbox.PostgreSQL,
		open:   func(t testing.TB) *sql.DB { return testdb.PostgresIfServed(t, "pgx") },
		driver: "pgx", dsn: testdb.PostgresDSN(),
		take: []string{"BEGIN", "LOCK TABLE %s"}, release: "COMMIT",
		waiting: "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
	},
	{
		name: "MariaDB LOCK TABLES WRITE", dialect: sqlinbox.MySQL,
		open:   testdb.MySQLIfServed,
		driver: "mysql", dsn: testdb.MySQLDSN(),
		take: []string{"LOCK TABLES %s WRITE"}, release: "UNLOCK TABLES",
		waiting: "SELECT count(*) FROM information_schema.processlist WHERE state LIKE 'Waiting for table metadata lock' AND info LIKE ?",
	},
}

// countedRig is a rig on a pool of size connections whose statements to
// the lease table are counted, after its first reading, its renewals
// bounded by timeout; operator is a pool for the lock.
func (o operatorLock) countedRig(t testing.TB, size int, timeout time.Duration) (operator, db *sql.DB, statements *testdb.Statements, r *leaseRig) {
	t.Helper()
	operator = o.open(t)
	table := testdb.Table(t, operator, "inbox")
	db, statements = testdb.Counted(t, o.driver, o.dsn, table+"_leases")
	db.SetMaxOpenConns(size)
	r = newLeaseRig(t, db, o.dialect, table)
	r.guard.timeout = timeout
	require.NoError(t, r.deliver())
	return operator, db, statements, r
}

// hold takes the lock on table's lease table and returns its release.
func (o operatorLock) hold(t testing.TB, db *sql.DB, leases string) (release func()) {
	t.Helper()
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	for _, stmt := range o.take {
		if strings.Contains(stmt, "%s") {
			stmt = fmt.Sprintf(stmt, leases)
		}
		_, err := conn.ExecContext(context.Background(), stmt)
		require.NoError(t, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(context.Background(), o.release)
			require.NoError(t, err)
			require.NoError(t, conn.Close())
		})
	}
	t.Cleanup(release)
	return release
}

// waiters counts the server's sessions waiting for a lock on leases.
func (o operatorLock) waiters(t testing.TB, db *sql.DB, leases string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(o.waiting, "%"+leases+"%").Scan(&n))
	return n
}

// Each of the operator's locks held on the lease table for the test's
// duration, on a pool of two, with the renewal due: the renewal waits for
// the lock beside the messages (its timeout lengthened to outlast the
// test), and 50 messages complete while it still waits. Once the lock is
// released, the renewal completes and the lease is live again.
func TestLeaseRenewalWaitsBesideTheMessages(t *testing.T) {
	t.Parallel()
	const messages = 50
	for _, lock := range operatorLocks {
		t.Run(lock.name, func(t *testing.T) {
			t.Parallel()
			operator, _, _, r := lock.countedRig(t, 2, time.Hour)
			require.True(t, r.lease().live.Load(), "the first reading, before the lock")
			leases := r.store.LeaseTable()

			release := lock.hold(t, operator, leases)
			r.clock.add(leaseRenew)
			r.deliverBeside(t, messages) // the first starts the renewal
			require.Eventually(t, func() bool { return lock.waiters(t, operator, leases) == 1 }, time.Minute, 10*time.Millisecond,
				"%d messages completed while the renewal waits for the operator's lock", messages)
			require.True(t, r.lease().renewing.Load())

			release()
			r.settled(t)
			require.True(t, r.lease().live.Load(), "the renewal caught up after the release")
			require.Greater(t, r.lease().due.Load(), r.clock.now().UnixNano())
			unchecked, _, errs := r.log.said()
			require.Zero(t, unchecked)
			require.Empty(t, errs)
		})
	}
}

// Each operator lock held on a pool of one, with the renewal due and its
// timeout lengthened to outlast the test: the renewal holds the only
// connection only until a claim comes to wait for it, so 50 messages
// complete while the lock holds, and the renewal that gave way is tried
// again leaseRetry later, saying nothing.
func TestLeaseRenewalGivesWayOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	for _, lock := range operatorLocks {
		t.Run(lock.name, func(t *testing.T) {
			t.Parallel()
			operator, _, statements, r := lock.countedRig(t, 1, time.Hour)
			lock.hold(t, operator, r.store.LeaseTable())
			r.clock.add(leaseRenew)
			base := statements.Count()
			r.guard.start("billing", r.lease()) // as a message finding it due
			require.Eventually(t, func() bool { return lock.waiters(t, operator, r.store.LeaseTable()) == 1 }, time.Minute, 10*time.Millisecond,
				"the renewal holds the only connection, waiting for the lock")

			r.deliverBeside(t, 50)
			r.settled(t)
			require.Equal(t, int64(1), statements.Count()-base, "one try, given up for a claim")
			require.Greater(t, r.lease().due.Load(), r.clock.now().UnixNano(), "tried again later")
			unchecked, again, errs := r.log.said()
			require.Equal(t, [2]int{0, 0}, [2]int{unchecked, again}, "nothing to say")
			require.Empty(t, errs)
		})
	}
}

// Each operator lock held while the renewal's statements are bounded by
// 100 ms: a renewal ends by itself, its connection back in the pool, while
// the lock holds; the next one is sent leaseRetry later, not at the next
// message; the episode is said once, and the recovery once after the
// release. Statements are counted at the driver, around the real one.
func TestLeaseRenewalEndsByItselfUnderALock(t *testing.T) {
	t.Parallel()
	for _, lock := range operatorLocks {
		t.Run(lock.name, func(t *testing.T) {
			t.Parallel()
			operator, db, statements, r := lock.countedRig(t, 2, 100*time.Millisecond)
			release := lock.hold(t, operator, r.store.LeaseTable())

			base := statements.Count()
			r.clock.add(leaseRenew - leaseRetry)
			for try := range 3 {
				r.clock.add(leaseRetry)
				for range 20 {
					require.NoError(t, r.deliver())
				}
				r.settled(t)
				require.Zero(t, db.Stats().InUse, "the renewal gave its connection back")
				for range 20 { // after the failure, before the retry is due
					require.NoError(t, r.deliver())
				}
				r.settled(t)
				require.Equal(t, int64(try+1), statements.Count()-base, "one statement per retry, not per message")
			}
			unchecked, again, errs := r.log.said()
			require.Equal(t, [2]int{1, 0}, [2]int{unchecked, again}, "said once")
			require.Empty(t, errs)
			require.Contains(t, r.log.firstReason(), "not renewed within its timeout")

			release()
			r.guard.timeout = time.Minute // no renewal under way: settled
			r.clock.add(leaseRetry)
			require.NoError(t, r.deliver())
			r.settled(t)
			require.True(t, r.lease().live.Load())
			unchecked, again, _ = r.log.said()
			require.Equal(t, [2]int{1, 1}, [2]int{unchecked, again}, "the recovery said once")
		})
	}
}

// The lease table dropped (an upgrade whose role cannot create it): 300
// messages send one statement to it, said once; the next is sent an hour
// later, and once the table exists again, the recovery is said once.
// Statements are counted at the driver, around the real one.
func TestMissingLeaseTableTriedOnceAnHour(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(t testing.TB) (*sql.DB, string, string)
	}{
		{"PostgreSQL", sqlinbox.PostgreSQL, func(t testing.TB) (*sql.DB, string, string) {
			return testdb.PostgresIfServed(t, "pgx"), "pgx", testdb.PostgresDSN()
		}},
		{"MariaDB", sqlinbox.MySQL, func(t testing.TB) (*sql.DB, string, string) {
			return testdb.MySQLIfServed(t), "mysql", testdb.MySQLDSN()
		}},
		{"SQLite", sqlinbox.SQLite, func(t testing.TB) (*sql.DB, string, string) {
			return testdb.SQLite(t), "sqlite", sqlinbox.SQLiteDSN(testdb.SQLiteFile(t))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			admin, driver, dsn := c.open(t)
			table := testdb.Table(t, admin, "inbox")
			db, statements := testdb.Counted(t, driver, dsn, table+"_leases")
			r := newLeaseRig(t, db, c.dialect, table)
			_, err := admin.Exec("DROP TABLE " + r.store.LeaseTable())
			require.NoError(t, err)
			base := statements.Count() // CreateSchema's

			for range 300 {
				require.NoError(t, r.deliver())
			}
			r.settled(t)
			require.Equal(t, int64(1), statements.Count()-base, "one statement for 300 messages")
			unchecked, again, errs := r.log.said()
			require.Equal(t, [2]int{1, 0}, [2]int{unchecked, again}, "said once")
			require.Empty(t, errs)

			r.clock.add(leaseRecheck - time.Second)
			require.NoError(t, r.deliver())
			r.settled(t)
			require.Equal(t, int64(1), statements.Count()-base, "not before the hour")
			r.clock.add(time.Second)
			for range 10 {
				require.NoError(t, r.deliver())
			}
			r.settled(t)
			require.Equal(t, int64(2), statements.Count()-base, "one more at the hour")

			require.NoError(t, r.store.CreateSchema(context.Background()))
			r.clock.add(leaseRecheck)
			require.NoError(t, r.deliver())
			r.settled(t)
			require.True(t, r.lease().live.Load())
			unchecked, again, errs = r.log.said()
			require.Equal(t, [2]int{1, 1}, [2]int{unchecked, again}, "the outage and the recovery said once each")
			require.Empty(t, errs)
		})
	}
}

// Throughput while each operator lock holds the lease table, as a ratio of
// the throughput without it, measured in the same run: two middlewares, each
// on a table and a pool of two of its own, take messages in turns, one
// with its lease table locked and its renewals falling due as in a service
// (blocked for their timeout, tried again after leaseRetry), so that the
// machine's load weighs on both alike. A ratio near 1 is a lease out of
// the messages' path.
func BenchmarkLeaseLocked(b *testing.B) {
	for _, lock := range operatorLocks {
		b.Run(lock.name, func(b *testing.B) {
			rig := func() *leaseRig {
				db := lock.open(b)
				db.SetMaxOpenConns(2)
				r := newLeaseRig(b, db, lock.dialect, testdb.Table(b, db, "inbox"))
				require.NoError(b, r.deliver())
				return r
			}
			free, locked := rig(), rig()
			lock.hold(b, lock.open(b), locked.store.LeaseTable())
			locked.guard.now = func() time.Time { return time.Now().Add(leaseRenew) } // due now
			var took [2]time.Duration
			b.ResetTimer()
			for n := range b.N {
				for k := range 2 {
					i := (n + k) % 2 // each goes first every other turn
					start := time.Now()
					require.NoError(b, []*leaseRig{free, locked}[i].deliver())
					took[i] += time.Since(start)
				}
			}
			b.StopTimer()
			perSecond := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
			b.ReportMetric(perSecond(took[0]), "msgs/s-free")
			b.ReportMetric(perSecond(took[1]), "msgs/s-locked")
			b.ReportMetric(perSecond(took[1])/perSecond(took[0]), "locked/free")
		})
	}
}
