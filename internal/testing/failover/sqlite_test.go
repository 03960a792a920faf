package failover_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// sqliteConsumer is the spec of a consumer child on a SQLite file.
type sqliteConsumer struct {
	Addrs        []string
	Topic, Group string
	Path         string
	Tables       stream.Tables
}

// SQLite is embedded: its crash is the consumer's. A consumer process on a
// SQLite file in WAL mode is SIGKILLed mid-stream, twice, at whatever it
// was doing (inside a transaction, between commit and ack), and a new one
// takes over: every event has exactly one effect, and the file is intact.
func TestSQLiteConsumerKilled(t *testing.T) {
	var child sqliteConsumer
	if killtest.Child(&child) {
		tg := stream.Open(t, "sqlite", sqlinbox.SQLiteDSN(child.Path), child.Tables, 4)
		s := &stream.Stream{Addrs: child.Addrs, Topic: child.Topic, Group: child.Group}
		s.Join(t, tg, stream.NewCounts())
		killtest.LingerFor(t, 5*time.Minute)
		return
	}
	spec := sqliteConsumer{Path: filepath.Join(t.TempDir(), "inbox.db"), Tables: stream.NewTables()}
	tg := stream.Open(t, "sqlite", sqlinbox.SQLiteDSN(spec.Path), spec.Tables, 4)
	tg.CreateTables(t)
	s := stream.New(t, 4)
	spec.Addrs, spec.Topic, spec.Group = s.Addrs, s.Topic, s.Group
	s.Publish(t, crashEvents, crashDeliveries)

	effects := func() (n int) {
		require.NoError(t, tg.DB.QueryRow(`SELECT count(*) FROM `+tg.Effects).Scan(&n))
		return n
	}
	for range 2 {
		c := killtest.Start(t, spec, 5*time.Minute)
		want := effects() + crashEvents/4
		require.Eventually(t, func() bool { return effects() >= want || c.Exited() }, 2*time.Minute, 10*time.Millisecond)
		c.Kill(t)
	}
	killed := effects()
	counts := stream.NewCounts()
	s.Join(t, tg, counts)
	s.WaitDrained(t, time.Minute)
	stream.Check(t, tg, s.Events).RequireExactlyOnce(t)
	var integrity string
	require.NoError(t, tg.DB.QueryRow(`PRAGMA integrity_check`).Scan(&integrity))
	require.Equal(t, "ok", integrity)
	snap := counts.Snapshot()
	t.Logf("%d events, %d deliveries: %d effects committed by the two killed consumers, then %d handled by the next, %d duplicates skipped",
		s.Events, s.Deliveries, killed, snap.Deliveries, snap.Duplicates)
}
