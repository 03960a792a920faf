package failover_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

// The stream of a restart test: 600 events, 900 deliveries with the
// copies, half published at the start and half just before the database
// stops.
const (
	restartEvents     = 600
	restartDeliveries = 900
	poisonTopic       = "poisoned"
)

// restartOutage is how long the database stays stopped: 20 s by default;
// INBOX_TEST_RESTART_OUTAGE (a Go duration) changes it.
func restartOutage(t testing.TB) time.Duration {
	v := os.Getenv("INBOX_TEST_RESTART_OUTAGE")
	if v == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "INBOX_TEST_RESTART_OUTAGE")
	return d
}

// restartable is a database server a test may kill, stop and start.
type restartable interface {
	server
	Stop(t testing.TB)
}

// PostgreSQL crashed (SIGKILL, started again at once) and then stopped
// cleanly (fast shutdown) for restartOutage under a stream with duplicates,
// consumed by routers on lib/pq, pgx stdlib and native pgx behind the
// recommended stack: every event has exactly one effect, the poison
// queue gets nothing, and each router logs a few lines during the outage,
// not one per attempt.
func TestPostgresRestart(t *testing.T) {
	srv := dbserver.StartPostgres(t)
	tables := stream.NewTables()
	var routers []router
	for _, d := range postgresDrivers {
		routers = append(routers, newRouter(t, d, d, srv.DSN(), tables))
	}
	restartUnder(t, srv, routers, 6)
}

// The same on MariaDB (mariadbd SIGKILLed, then stopped by SIGTERM), with
// two routers.
func TestMariaDBRestart(t *testing.T) {
	// go-sql-driver/mysql logs broken connections to a logger of its own
	// (the standard library's, on stderr): count its lines instead.
	var driverLines atomic.Int64
	require.NoError(t, mysql.SetLogger(lineCounter(func() { driverLines.Add(1) })))
	t.Cleanup(func() { _ = mysql.SetLogger(log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime|log.Lshortfile)) })
	srv := dbserver.StartMariaDB(t)
	tables := stream.NewTables()
	routers := []router{
		newRouter(t, "mysql 1", "mysql", srv.DSN(), tables),
		newRouter(t, "mysql 2", "mysql", srv.DSN(), tables),
	}
	restartUnder(t, srv, routers, 4)
	t.Logf("go-sql-driver/mysql's own logger wrote %d lines", driverLines.Load())
}

// recommendedStack is the middleware stack of the root package's
// Example_retriesAndPoisonQueue, outermost first (the inbox goes around
// the handler function): PoisonQueue for what is not transient, Retry for
// what is not permanent, Recoverer, Backoff for what is transient. Its
// hook and loggers only count.
func recommendedStack(t *testing.T, c *stream.Counts, poison message.Publisher) []message.HandlerMiddleware {
	t.Helper()
	poisonQueue, err := middleware.PoisonQueueWithFilter(poison, poisonTopic, func(err error) bool {
		return !inbox.IsTransient(err)
	})
	require.NoError(t, err)
	retry := middleware.Retry{
		MaxRetries:      3,
		InitialInterval: 100 * time.Millisecond,
		ShouldRetry:     func(p middleware.RetryParams) bool { return !inbox.IsPermanent(p.Err) },
		OnRetryHook:     func(int, time.Duration) { c.Retries.Add(1) },
		Logger:          c.Logger(),
	}
	backoff, err := inbox.NewBackoff(inbox.BackoffConfig{}, c.Logger())
	require.NoError(t, err)
	return []message.HandlerMiddleware{poisonQueue, retry.Middleware, middleware.Recoverer, backoff}
}

// poisonQueue is the topic the routers poison messages to, on an in-memory
// pub/sub, and what reached it.
type poisonQueue struct {
	pubSub *gochannel.GoChannel
	mu     sync.Mutex
	got    []string // event id and reason of each poisoned message
}

func newPoisonQueue(t *testing.T) *poisonQueue {
	t.Helper()
	q := &poisonQueue{pubSub: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
	t.Cleanup(func() { _ = q.pubSub.Close() })
	msgs, err := q.pubSub.Subscribe(context.Background(), poisonTopic)
	require.NoError(t, err)
	go func() {
		for msg := range msgs {
			q.mu.Lock()
			q.got = append(q.got, msg.Metadata.Get(inbox.DefaultEventIDMetadataKey)+": "+msg.Metadata.Get(middleware.ReasonForPoisonedKey))
			q.mu.Unlock()
			msg.Ack()
		}
	}()
	return q
}

func (q *poisonQueue) poisoned() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string(nil), q.got...)
}

func restartUnder(t *testing.T, srv restartable, routers []router, partitions int) {
	outage := restartOutage(t)
	routers[0].target.CreateTables(t)
	poison := newPoisonQueue(t)
	s := stream.New(t, partitions)
	s.Publish(t, restartEvents/2, restartDeliveries/2)
	for _, r := range routers {
		s.Join(t, r.target, r.counts, stream.WithStack(recommendedStack(t, r.counts, poison.pubSub)...))
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

	// A crash mid-stream, and a start at once: crash recovery under load.
	waitProcessed(restartEvents / 8)
	srv.Kill(t)
	srv.Start(t)

	// A clean stop while every partition has messages to deliver, the
	// database down for the outage, and a start.
	waitProcessed(restartEvents / 4)
	s.Publish(t, restartEvents/2, restartDeliveries/2)
	t0 := time.Now()
	srv.Stop(t)
	stopping := time.Since(t0)
	before := make([]stream.Snapshot, len(routers))
	for i, r := range routers {
		before[i] = r.counts.Snapshot()
	}
	time.Sleep(outage) // the outage itself, not a wait for a condition
	during := make([]stream.Snapshot, len(routers))
	for i, r := range routers {
		during[i] = r.counts.Snapshot().Sub(before[i])
	}
	srv.Start(t)
	restarted := time.Now()
	s.WaitDrained(t, time.Minute)
	drained := time.Since(restarted)
	v := stream.Check(t, routers[0].target, s.Events)

	var report strings.Builder
	var transient, permanent int64
	fmt.Fprintf(&report, "%d events, %d deliveries; a crash, then a clean stop (%s) and %s down; drained %s after the start; %s; poisoned %d:",
		s.Events, s.Deliveries, round(stopping), outage, round(drained), v, len(poison.poisoned()))
	for i, r := range routers {
		total, d := r.counts.Snapshot(), during[i]
		transient += r.counts.Transient.Load()
		permanent += r.counts.Permanent.Load()
		fmt.Fprintf(&report, "\n  %s: %d deliveries (redeliveries included), %d nacked after failing transiently, %d attempts failed transiently, %d permanently, %d neither %q, %d retries; %d processed, %d duplicates skipped; during the outage %d attempts, %d nacks, %d log lines",
			r.name, total.Deliveries, total.Nacks, r.counts.Transient.Load(), r.counts.Permanent.Load(), r.counts.Neither.Load(), r.counts.NeitherErrors(),
			total.Retries, total.Processed, total.Duplicates, d.Attempts(), d.Nacks, d.LogLines)
	}
	t.Log(report.String())
	// Backoff's line when the outage starts, one per LogInterval, the one
	// when it ends, and a line or two of the lease's heartbeat.
	maxLines := int64(outage/inbox.DefaultBackoffLogInterval) + 4
	for i, r := range routers {
		require.LessOrEqual(t, during[i].LogLines, maxLines, "%s: log lines during the outage", r.name)
	}
	require.Empty(t, poison.poisoned(), "live messages poisoned")
	v.RequireExactlyOnce(t)
	require.Zero(t, permanent, "permanent failures")
	require.Positive(t, transient, "no attempt failed during the restart: the test did not test it")
}
