package purge_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// benchRows is the number of expired rows each benchmark purges.
var benchRows = flag.Int("purge-rows", 1_000_000, "expired rows BenchmarkPurge seeds and purges")

// BenchmarkPurge purges a million expired rows from a plain table of each
// dialect in batches while four workers keep claiming new events, and
// reports the purge's throughput and the claims' p99 and longest latency
// with and without the purge running. It seeds a million rows per
// iteration (-purge-rows), so run it once, and repeat with -count:
//
//	go test ./purge/ -run '^$' -bench 'BenchmarkPurge$' -benchtime 1x        # every dialect
//	go test ./purge/ -run '^$' -bench 'BenchmarkPurge$/MySQL' -benchtime 1x  # one
//	go test ./purge/ -run '^$' -bench 'BenchmarkPurge$/SQLite' -benchtime 1x -count 3 -args -purge-rows 500000
func BenchmarkPurge(b *testing.B) {
	for _, tg := range targets() {
		b.Run(tg.name, func(b *testing.B) {
			for b.Loop() {
				benchmarkPurge(b, tg)
			}
		})
	}
}

func benchmarkPurge(b *testing.B, tg target) {
	bb := setup(b, tg)
	bb.seed(b, "billing", "old-", *benchRows, 30*day)
	analyze := map[sqlinbox.Dialect]string{ // as a long-lived table's statistics would be
		sqlinbox.PostgreSQL: "VACUUM ANALYZE ", sqlinbox.MySQL: "ANALYZE TABLE ", sqlinbox.SQLite: "ANALYZE ",
	}[tg.dialect]
	_, err := bb.db.Exec(analyze + bb.table)
	require.NoError(b, err)

	idle, idleBusy := claimLatencies(b, bb, "idle", nil)

	logs := watermill.NewCaptureLogger()
	p, err := purge.New(bb.store, purge.Config{Retention: 7 * day, Logger: logs})
	require.NoError(b, err)
	var (
		deleted int64
		took    time.Duration
	)
	during, duringBusy := claimLatencies(b, bb, "busy", func() {
		start := time.Now()
		deleted, err = p.PurgeOnce(context.Background())
		took = time.Since(start)
	})
	require.NoError(b, err)
	require.EqualValues(b, *benchRows, deleted)

	var round watermill.LogFields
	for _, l := range logs.Captured()[watermill.InfoLogLevel] {
		if l.Msg == "Inbox purge round done" {
			round = l.Fields
		}
	}
	b.ReportMetric(float64(deleted)/took.Seconds(), "purged_rows/s")
	b.ReportMetric(ms(p99(idle)), "claim_p99_idle_ms")
	b.ReportMetric(ms(p99(during)), "claim_p99_purging_ms")
	b.ReportMetric(ms(p99(during))/ms(p99(idle)), "p99_ratio")
	b.ReportMetric(ms(p999(during)), "claim_p999_purging_ms")
	b.ReportMetric(ms(idle[len(idle)-1]), "claim_max_idle_ms")
	b.ReportMetric(ms(during[len(during)-1]), "claim_max_purging_ms")
	b.ReportMetric(float64(duringBusy), "claims_busy_purging")
	b.Logf("purged %d rows in %s (%v batches, %v timed out); claims idle: %d (%d busy), p50 %.2fms p99 %.2fms max %.1fms; during the purge: %d (%d busy), p50 %.2fms p99 %.2fms max %.1fms",
		deleted, took.Round(time.Millisecond), round["batches"], round["timeouts"], len(idle), idleBusy, ms(p50(idle)), ms(p99(idle)), ms(idle[len(idle)-1]),
		len(during), duringBusy, ms(p50(during)), ms(p99(during)), ms(during[len(during)-1]))
}

// BenchmarkDropMonthPartition drops a monthly partition holding a million
// rows, the partitioned table's whole purge of that month.
//
//	go test ./purge/ -run '^$' -bench BenchmarkDropMonthPartition -benchtime 1x
func BenchmarkDropMonthPartition(b *testing.B) {
	for b.Loop() {
		bb := setup(b, postgres, func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Monthly })
		// A month that ended at least a month ago.
		month := dbDay(b, bb.db, 62*day)
		month = time.Date(month.Year(), month.Month(), 1, 0, 0, 0, 0, time.UTC)
		name := bb.table + "_p" + month.Format("200601")
		_, err := bb.db.Exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s+00') TO ('%s+00')`,
			name, bb.table, month.Format(time.DateTime), month.AddDate(0, 1, 0).Format(time.DateTime)))
		require.NoError(b, err)
		_, err = bb.db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at)
SELECT 'billing', 'ev-' || g, $1::timestamptz + (g %% 2500000) * interval '1 second' FROM generate_series(1, $2::int) g`, bb.table), month, *benchRows)
		require.NoError(b, err)

		sess, busy, err := bb.store.Maintenance().BeginPurge(context.Background())
		require.NoError(b, err)
		require.Nil(b, busy)
		expired, err := sess.ExpiredPartitions(context.Background(), 7*day)
		require.NoError(b, err)
		require.Len(b, expired, 1)
		start := time.Now()
		require.NoError(b, sess.DropPartition(context.Background(), expired[0], time.Second))
		took := time.Since(start)
		require.NoError(b, sess.Close())
		require.Empty(b, bb.rows(b))
		b.ReportMetric(ms(took), "drop_ms")
		b.Logf("dropped %s (%d rows) in %s", name, *benchRows, took.Round(time.Microsecond))
	}
}

// claimInterval paces each claiming worker: four of them offer 2,000
// claims/s, a steady load every dialect carries, so the latencies show
// what the purge adds rather than a saturated database's queue. (Flat out,
// four SQLite writers leave the purge no turn at the write lock at all.)
const claimInterval = 2 * time.Millisecond

// poisson spaces each worker's claims at random (exponential gaps of
// claimInterval on average), as independent messages arrive, rather than
// every claimInterval: workers in lockstep meet SQLite's busy handler,
// which looks at the write lock at fixed steps, at the same phase of
// their cycle each time, and a waiting claim can miss the lock for
// seconds.
var poisson = flag.Bool("purge-poisson", false, "BenchmarkPurge: claims at random intervals instead of every 2 ms")

// claimLatencies runs four claiming workers, each claim and commit timed,
// for ten seconds (long enough for the idle tail to show) or, when work
// is set, while work runs.
func claimLatencies(b *testing.B, bb *bundle, prefix string, work func()) (lat []time.Duration, busy int64) {
	var (
		mu    sync.Mutex
		stop  atomic.Bool
		wg    sync.WaitGroup
		count atomic.Int64
		nBusy atomic.Int64
	)
	for w := range 4 {
		wg.Go(func() {
			next := time.Now()
			for !stop.Load() {
				time.Sleep(time.Until(next))
				gap := claimInterval
				if *poisson {
					gap = time.Duration(rand.ExpFloat64() * float64(claimInterval))
				}
				next = next.Add(gap)
				id := fmt.Sprintf("%s-%d-%d", prefix, w, count.Add(1))
				start := time.Now()
				tx, ok, err := claim(context.Background(), bb.store, nil, "live", id)
				if err == nil && ok {
					err = tx.Commit()
				}
				d := time.Since(start)
				if errors.Is(err, inbox.ErrInFlight) {
					// SQLite: the write lock stayed taken past the busy
					// timeout; a router would nack and retry.
					nBusy.Add(1)
					continue
				}
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	if work != nil {
		work()
	} else {
		time.Sleep(10 * time.Second)
	}
	stop.Store(true)
	wg.Wait()
	slices.Sort(lat)
	return lat, nBusy.Load()
}

func p50(d []time.Duration) time.Duration  { return d[len(d)/2] }
func p99(d []time.Duration) time.Duration  { return d[len(d)*99/100] }
func p999(d []time.Duration) time.Duration { return d[len(d)*999/1000] }
func ms(d time.Duration) float64           { return float64(d) / float64(time.Millisecond) }
