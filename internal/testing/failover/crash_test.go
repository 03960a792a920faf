package failover_test

import (
	"fmt"
	"log"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

// The stream of a crash test, and how long its database stays down.
const (
	crashEvents     = 1200
	crashDeliveries = 1600
	outage          = 10 * time.Second
)

// server is a database server of the test's own.
type server interface {
	Kill(t testing.TB) (killed time.Time)
	Start(t testing.TB)
	RecoveredFromCrash() bool
	Log() string
}

// router is one consumer of a crash test: a driver, and how the router
// retries.
type router struct {
	name   string
	target *stream.Target
	counts *stream.Counts
	opts   []stream.JoinOption
}

func newRouter(t *testing.T, name, driver, dsn string, tables stream.Tables, opts ...stream.JoinOption) router {
	return router{name: name, target: stream.Open(t, driver, dsn, tables, 4), counts: stream.NewCounts(), opts: opts}
}

// A PostgreSQL server killed (the postmaster and every backend, SIGKILL)
// twice under a stream with duplicates: restarted at once the first time
// (crash recovery under load), after a 10 s outage the second, while the
// routers (lib/pq, pgx stdlib and native pgx behind the Retry middleware,
// and pgx stdlib without it) keep trying. Every event has exactly one
// effect; during the outage no router spins, and each resumes by itself.
func TestPostgresCrash(t *testing.T) {
	srv := dbserver.StartPostgres(t)
	tables := stream.NewTables()
	routers := []router{
		newRouter(t, "lib-pq", "lib-pq", srv.DSN(), tables),
		newRouter(t, "pgx-stdlib", "pgx-stdlib", srv.DSN(), tables),
		newRouter(t, "pgx", "pgx", srv.DSN(), tables),
		newRouter(t, "pgx-stdlib, no Retry", "pgx-stdlib", srv.DSN(), tables, stream.WithoutRetry()),
	}
	crashTwice(t, srv, routers, 8)
}

// The same on MariaDB (mariadbd SIGKILLed, InnoDB recovers from its redo
// log), with a router behind the Retry middleware and one without it.
func TestMariaDBCrash(t *testing.T) {
	// go-sql-driver/mysql logs broken connections to a logger of its own
	// (the standard library's, on stderr): count its lines too.
	var driverLines atomic.Int64
	require.NoError(t, mysql.SetLogger(lineCounter(func() { driverLines.Add(1) })))
	t.Cleanup(func() { _ = mysql.SetLogger(log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime|log.Lshortfile)) })
	srv := dbserver.StartMariaDB(t)
	tables := stream.NewTables()
	routers := []router{
		newRouter(t, "mysql", "mysql", srv.DSN(), tables),
		newRouter(t, "mysql, no Retry", "mysql", srv.DSN(), tables, stream.WithoutRetry()),
	}
	crashTwice(t, srv, routers, 4)
	t.Logf("go-sql-driver/mysql's own logger wrote %d lines over the two crashes", driverLines.Load())
}

// lineCounter is a mysql.Logger that counts what it is given.
type lineCounter func()

func (c lineCounter) Print(...any) { c() }

func crashTwice(t *testing.T, srv server, routers []router, partitions int) {
	routers[0].target.CreateTables(t)
	s := stream.New(t, partitions)
	s.Publish(t, crashEvents/2, crashDeliveries/2)
	for _, r := range routers {
		s.Join(t, r.target, r.counts, r.opts...)
	}
	processed := func() (n int64) {
		for _, r := range routers {
			n += r.counts.Snapshot().Processed
		}
		return n
	}
	waitProcessed := func(n int64) {
		require.Eventually(t, func() bool { return processed() >= n }, 2*time.Minute, 10*time.Millisecond,
			"%d of %d events processed", processed(), n)
	}

	// A crash, and a restart at once.
	waitProcessed(crashEvents / 8)
	srv.Kill(t)
	srv.Start(t)
	require.True(t, srv.RecoveredFromCrash(), "no crash recovery in the server's log:\n%s", srv.Log())

	// A crash, and the database down for outage, while every partition
	// has messages to deliver.
	waitProcessed(crashEvents / 4)
	s.Publish(t, crashEvents/2, crashDeliveries/2)
	killed := srv.Kill(t)
	before := make([]stream.Snapshot, len(routers))
	for i, r := range routers {
		before[i] = r.counts.Snapshot()
		r.counts.Mark(killed)
	}
	cpu0 := cpuTime(t)
	time.Sleep(outage) // the outage itself, not a wait for a condition
	cpu := cpuTime(t) - cpu0
	during := make([]stream.Snapshot, len(routers))
	succeeded := make([]int64, len(routers))
	for i, r := range routers {
		during[i] = r.counts.Snapshot().Sub(before[i])
		succeeded[i] = r.counts.ClaimedSinceMark()
	}
	srv.Start(t)
	restarted := time.Now()
	for _, r := range routers {
		r.counts.Mark(restarted)
	}
	// Every router held a message it could not claim: the stream drains
	// only once each has resumed by itself.
	s.WaitDrained(t, time.Minute)
	stream.Check(t, routers[0].target, s.Events).RequireExactlyOnce(t)

	var report strings.Builder
	fmt.Fprintf(&report, "%d events, %d deliveries; during the %s outage the test process used %.0f%% of a core:", s.Events, s.Deliveries, outage, 100*cpu.Seconds()/outage.Seconds())
	for i, r := range routers {
		d := during[i]
		resumed, _ := r.counts.FirstClaim()
		fmt.Fprintf(&report, "\n  %s: %d attempts (%.1f/s), %d retries, %d nacks, %d log lines (%.1f/s); first claim %s after the restart, %d since; in all %d handled, %d duplicates skipped",
			r.name, d.Attempts(), perSecond(d.Attempts()), d.Retries, d.Nacks, d.LogLines, perSecond(d.LogLines), round(resumed),
			r.counts.ClaimedSinceMark(), r.counts.Snapshot().Deliveries, r.counts.Snapshot().Duplicates)
	}
	t.Log(report.String())
	for i, r := range routers {
		d := during[i]
		// The middleware failed every claim (and nacked), nothing was
		// processed, and no router spun: a message retried in place waits
		// 0.1 s or more, a nacked one NackResendSleep, so each partition
		// sees at most about ten attempts a second.
		require.Positive(t, d.ClaimFailed, "router %s: no claim failed during the outage", r.name)
		require.Zero(t, succeeded[i], "router %s claimed messages with its database down", r.name)
		require.Less(t, perSecond(d.Attempts()), float64(12*partitions), "router %s spun during the outage: %d attempts", r.name, d.Attempts())
	}
}

func perSecond(n int64) float64 { return float64(n) / outage.Seconds() }

// cpuTime is the CPU time this process has used, user and system.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
