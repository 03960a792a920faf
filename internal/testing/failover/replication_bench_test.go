package failover_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/bench"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

// replicationModes are the settings BenchmarkReplication compares: Patroni's
// synchronous_mode, and PostgreSQL's synchronous_commit, which decides what
// a commit waits for from the synchronous standby.
var replicationModes = []struct {
	name   string
	sync   bool
	commit string
}{
	{"asynchronous", false, "on"},
	{"synchronous, remote_write", true, "remote_write"},
	{"synchronous, on", true, "on"},
	{"synchronous, remote_apply", true, "remote_apply"},
}

// BenchmarkReplication measures what each replication setting costs: events
// claimed and handled per second through the inbox (native pgx, 8 workers,
// one effect row each) on one Patroni cluster whose servers are
// replicationDelay apart each way, switched from mode to mode round after
// round so that every mode sees the same machine. It reports the median of
// each and its ratio to asynchronous replication.
//
//	go test -run '^$' -bench BenchmarkReplication -benchtime 1x ./failover/
func BenchmarkReplication(b *testing.B) {
	const (
		workers = 8
		rounds  = 5
		measure = 5 * time.Second
	)
	cluster := dbserver.StartCluster(b, dbserver.ClusterConfig{Synchronous: true, ReplicationDelay: replicationDelay(b)})
	tg := stream.Open(b, "pgx", cluster.DSN(), stream.NewTables(), workers)
	tg.CreateTables(b)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: tg.Store, Consumer: stream.Consumer})
	require.NoError(b, err)
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		return nil, tg.WriteEffect(msg.Context(), msg.UUID)
	})
	ctx := context.Background()
	rates := map[string][]float64{}
	for range b.N {
		for range rounds {
			for _, m := range replicationModes {
				cluster.Configure(b, m.sync, m.commit)
				waitSetting(b, cluster.DSN(), m.commit)
				r := bench.Run(ctx, h, workers, measure, bench.NewMessages())
				require.Zero(b, r.Errors, "%s: %v", m.name, r.FirstErr)
				rates[m.name] = append(rates[m.name], r.Rate())
			}
		}
	}
	var report strings.Builder
	fmt.Fprintf(&report, "claims with their effect per second, %d workers, servers %s apart each way, median of %d rounds of %s (min-max):", workers, replicationDelay(b), rounds*b.N, measure)
	base := median(rates[replicationModes[0].name])
	for _, m := range replicationModes {
		rs := rates[m.name]
		fmt.Fprintf(&report, "\n  %-26s %6.0f/s (%4.0f-%4.0f)  %.2fx asynchronous", m.name, median(rs), slices.Min(rs), slices.Max(rs), median(rs)/base)
		b.ReportMetric(median(rs), strings.NewReplacer(", ", "-", " ", "-").Replace(m.name)+"/s")
	}
	b.Log(report.String())
}

// waitSetting waits until new connections to the primary see
// synchronous_commit = want (Patroni applies it with a reload).
func waitSetting(b *testing.B, dsn, want string) {
	b.Helper()
	db := testdb.Open(b, "pgx", dsn)
	defer db.Close()
	require.Eventually(b, func() bool {
		var got string
		return db.QueryRow(`SHOW synchronous_commit`).Scan(&got) == nil && got == want
	}, time.Minute, 50*time.Millisecond, "synchronous_commit never became %s", want)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
