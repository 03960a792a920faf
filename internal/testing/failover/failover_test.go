package failover_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

// The stream of a failover: events with about a third as many copies,
// over six partitions, consumed by three routers, one per PostgreSQL
// driver, each through the multi-host connection string that follows the
// primary.
const (
	failoverEvents     = 1500
	failoverDeliveries = 2000
	failoverPartitions = 6
)

// replicationDelay is added each way between the servers of the cluster:
// by default 1 ms, a 2 ms round trip, as between availability zones;
// INBOX_TEST_REPLICATION_DELAY (a Go duration) changes it.
func replicationDelay(t testing.TB) time.Duration {
	v := os.Getenv("INBOX_TEST_REPLICATION_DELAY")
	if v == "" {
		return time.Millisecond
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "INBOX_TEST_REPLICATION_DELAY")
	return d
}

var postgresDrivers = []string{"lib-pq", "pgx-stdlib", "pgx"}

// A primary killed mid-stream (Patroni and PostgreSQL at once, as when its
// machine dies) while three routers consume a stream with duplicates:
// Patroni promotes a replica, the routers' new connections find it, and
// the stream drains. With synchronous replication every event has exactly
// one effect on the new primary. With asynchronous replication the commits
// the replica had not received are lost, claim and effect together (an
// acked event the broker will not redeliver): never a doubled effect, and
// the test reports how many were lost.
func TestFailover(t *testing.T) {
	for _, mode := range []struct {
		name string
		sync bool
	}{{"synchronous", true}, {"asynchronous", false}} {
		t.Run(mode.name, func(t *testing.T) {
			r := runFailover(t, mode.sync)
			t.Log(r)
			require.Zero(t, r.verdict.Doubled, "doubled effects: %s", r.verdict)
			require.Zero(t, r.verdict.Unknown, "%s", r.verdict)
			require.Equal(t, r.verdict.Effects, r.verdict.InboxRows, "claims and effects commit together: %s", r.verdict)
			require.Equal(t, r.verdict.Events, r.verdict.Effects+r.verdict.Missing, "%s", r.verdict)
			if mode.sync {
				r.verdict.RequireExactlyOnce(t)
			}
		})
	}
}

// failover is what one failover run measured.
type failover struct {
	sync       bool
	bootstrap  time.Duration // cluster start to healthy
	promoted   time.Duration // kill to a new leader running
	firstClaim time.Duration // kill to the first successful claim on the new primary
	lagBytes   []int64       // WAL each replica had not replayed, just before the kill
	during     stream.Snapshot
	total      stream.Snapshot
	stream     *stream.Stream
	verdict    stream.Verdict
}

func runFailover(t *testing.T, sync bool) failover {
	t0 := time.Now()
	cluster := dbserver.StartCluster(t, dbserver.ClusterConfig{Synchronous: sync, ReplicationDelay: replicationDelay(t)})
	r := failover{sync: sync, bootstrap: time.Since(t0)}

	tables := stream.NewTables()
	var targets []*stream.Target
	for _, d := range postgresDrivers {
		targets = append(targets, stream.Open(t, d, cluster.DSN(), tables, 4))
	}
	targets[0].CreateTables(t)
	s := stream.New(t, failoverPartitions)
	counts := stream.NewCounts()
	s.Publish(t, failoverEvents, failoverDeliveries)
	for _, tg := range targets {
		s.Join(t, tg, counts)
	}

	// Mid-stream: a third of the events have their effect.
	require.Eventually(t, func() bool { return counts.Snapshot().Processed >= failoverEvents/3 }, 2*time.Minute, 10*time.Millisecond)
	leader := cluster.Leader(t)
	r.lagBytes = replicationLag(t, cluster.NodeDSN(leader))
	before := counts.Snapshot()
	killed := cluster.Kill(t, leader)
	counts.Mark(killed)
	promoted := cluster.WaitNewLeader(t, leader)
	r.promoted = time.Since(killed)
	require.Eventually(t, func() bool { _, ok := counts.FirstClaim(); return ok }, 2*time.Minute, 10*time.Millisecond,
		"no claim succeeded after the kill")
	r.firstClaim, _ = counts.FirstClaim()
	r.during = counts.Snapshot().Sub(before)

	s.WaitDrained(t, time.Minute)
	r.total = counts.Snapshot()
	r.stream = s

	// The verdict, read on the primary itself: the promoted node, or the one
	// Patroni made primary since, should a loaded machine make it fail over
	// again.
	if current := cluster.Leader(t); current != promoted {
		t.Logf("the primary moved on from %s to %s after the failover", promoted.Name, current.Name)
		promoted = current
	}
	db := testdb.Open(t, "pgx", cluster.NodeDSN(promoted))
	var readOnly string
	require.NoError(t, db.QueryRow(`SHOW transaction_read_only`).Scan(&readOnly))
	require.Equal(t, "off", readOnly, "node %s is not the primary", promoted.Name)
	r.verdict = stream.Check(t, &stream.Target{DB: db, Inbox: tables.Inbox, Effects: tables.Effects}, s.Events)
	return r
}

// replicationLag returns, for each replica of the primary at dsn, the bytes
// of WAL it has not flushed yet.
func replicationLag(t *testing.T, dsn string) []int64 {
	t.Helper()
	db := testdb.Open(t, "pgx", dsn)
	rows, err := db.Query(`SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint, -1) FROM pg_stat_replication ORDER BY application_name`)
	require.NoError(t, err)
	defer rows.Close()
	var lag []int64
	for rows.Next() {
		var n int64
		require.NoError(t, rows.Scan(&n))
		lag = append(lag, n)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, db.Close())
	return lag
}
