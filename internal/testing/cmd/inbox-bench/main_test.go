package main

import (
	"bytes"
	"context"
	"database/sql"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/bench"
)

// A short run of every driver and mode: the program works end to end and
// prints every table. Its numbers mean nothing at this length.
func TestSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "all", dsn: testdb.PostgresDSN(), mysqlDSN: testdb.MySQLDSN(), conc: []int{2},
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "all", out: &out,
	})
	require.NoError(t, err, out.String())
	for _, want := range []string{"round trips/msg", "c=2", "bare", "inbox", "dup", "dedup", "ratio"} {
		require.Contains(t, out.String(), want)
	}
	requireNoErrors(t, out.String())
}

// The batch modes run on every driver, beside the per-message ones, and
// print their ratios to the per-message inbox and to the bare batch.
func TestBatchSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "all", dsn: testdb.PostgresDSN(), mysqlDSN: testdb.MySQLDSN(), conc: []int{2},
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, batch: []int{1, 10},
		modes: "bare,inbox,batch1-bare,batch1-inbox,batch10-bare,batch10-inbox,batch10-dup", out: &out,
	})
	require.NoError(t, err, out.String())
	for _, want := range []string{"batch10-inbox", "batch10-dup", "batch10-inbox / inbox", "/ batch10-bare"} {
		require.Contains(t, out.String(), want)
	}
	requireNoErrors(t, out.String())
}

// With a simulated round trip every measured connection goes through the
// delay proxy, and round trips are still counted on the wire: native pgx's
// BEGIN and claim travel together, so the inbox adds none.
func TestRTTSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "postgresql,mysql", dsn: testdb.PostgresDSN(), mysqlDSN: testdb.MySQLDSN(), conc: []int{2}, rtt: 500 * time.Microsecond,
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "bare,inbox,dup", out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "network: +500µs round trip")
	_, pgx, _ := strings.Cut(out.String(), "== postgresql/pgx\n")
	require.Regexp(t, `(?m)^\s+bare\s+3\.00\s`, pgx)
	requireInboxTrips(t, pgx, "inbox", 3, 5)
	requireNoErrors(t, out.String())
}

// requireInboxTrips asserts the round trips per message of an inbox mode in
// a driver's section of the output, measured over samples of sample
// messages: at least the claim's path, trips, and at most one lease
// heartbeat more (3 round trips, once in 20 s, in the background on the same
// pool), which may have reached each of the three samples.
func requireInboxTrips(t *testing.T, section, mode string, trips float64, sample int) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(mode) + `\s+(\d+\.\d\d)\s`).FindStringSubmatch(section)
	require.NotNil(t, m, section)
	got, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	require.GreaterOrEqual(t, got, trips, section)
	require.LessOrEqual(t, got, trips+3/float64(sample), section)
}

// -pooler runs bare and inbox through PgBouncer beside the direct modes,
// on database/sql (lib/pq) and native pgx, and prints the pooled/direct ratios; the
// round trips are the direct ones (with lib/pq's binary_parameters its
// write takes one fewer).
func TestPoolerSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "lib-pq,pgx", dsn: testdb.PostgresDSN(), pooler: testdb.PgBouncerDSN(), conc: []int{2},
		duration: 20 * time.Millisecond, rounds: 2, sample: 5, dupIDs: 10, modes: "bare,inbox,bare-pooled,inbox-pooled", out: &out,
	})
	require.NoError(t, err, out.String())
	for driver, trips := range map[string]float64{"lib-pq": 4, "pgx": 3} {
		_, section, _ := strings.Cut(out.String(), "== postgresql/"+driver+"\n")
		section, _, _ = strings.Cut(section, "\n== ")
		requireInboxTrips(t, section, "inbox-pooled", trips, 5)
		require.Regexp(t, `(?m)^inbox-pooled / inbox: \d+\.\d\d, rounds `, section, driver)
	}
	requireNoErrors(t, out.String())
}

// The invoice write runs on every dialect, and the WAL of the one-at-a-time
// pass counts its tables: more than the one-row write's 126 bytes bare.
func TestInvoiceSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "all", dsn: testdb.PostgresDSN(), mysqlDSN: testdb.MySQLDSN(), conc: []int{2}, write: "invoice",
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "bare,inbox,dup", out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "business write: invoice")
	_, pgx, _ := strings.Cut(out.String(), "== postgresql/pgx\n")
	m := regexp.MustCompile(`(?m)^\s+bare\s+\S+\s+(\d+)\s`).FindStringSubmatch(pgx)
	require.NotNil(t, m, pgx)
	bareWAL, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.Greater(t, bareWAL, 300, "WAL of the invoice row, its two index entries and the total's update")
	_, rest, _ := strings.Cut(out.String(), "\n")
	requireNoErrors(t, rest)
}

// -claim-parts measures every part of the claim, with text and uuid ids:
// each part adds WAL to the one before.
func TestClaimPartsSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), options{dsn: testdb.PostgresDSN(), sample: 20, parts: true, out: &out}))
	rows := regexp.MustCompile(`(?m)^\+ .*\s(\d+)\s+\+(\d+)\s+(\d+)\s+\+(\d+)\s*$`).FindAllStringSubmatch(out.String(), -1)
	require.Len(t, rows, 2, out.String())
	for _, r := range rows {
		for _, adds := range []string{r[2], r[4]} {
			n, err := strconv.Atoi(adds)
			require.NoError(t, err)
			require.Positive(t, n, r[0])
		}
	}
	require.Contains(t, out.String(), "the inbox table as sqlinbox creates it")
}

// The end-to-end run through an in-process Kafka broker works too.
func TestKafkaSmoke(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "pgx", dsn: testdb.PostgresDSN(), conc: []int{2},
		duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "bare,inbox", kafka: 20, out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "kafka, 2 partitions")
}

// The 10M-claim modes run against a small partitioned prefill too,
// claiming through the partitioned store.
func TestPrefillPartitionedSmoke(t *testing.T) {
	t.Parallel()
	// The partitions a purge keeps: one per day (or month) of the past
	// days, the current one and those ahead, and the default partition.
	want := func(layout string) int {
		if layout != "monthly" {
			return prefillDays + 1 + prefillAhead + 1
		}
		months := map[string]bool{}
		today := time.Now().UTC()
		for d := 1; d <= prefillDays; d++ {
			months[today.AddDate(0, 0, -d).Format("200601")] = true
		}
		for m := 0; m <= prefillAhead; m++ {
			months[time.Date(today.Year(), today.Month()+time.Month(m), 1, 0, 0, 0, 0, time.UTC).Format("200601")] = true
		}
		return len(months) + 1
	}
	for _, layout := range []string{"daily", "monthly", "daily-event_time"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			layout, key, _ := strings.Cut(layout, "-")
			table := testdb.Name("inbox_bench_prefill_" + layout)
			dsn := testdb.PostgresDSN()
			db, err := sql.Open("pgx", dsn)
			require.NoError(t, err)
			t.Cleanup(func() {
				_, _ = db.Exec(`DROP TABLE IF EXISTS ` + table)
				_ = db.Close()
			})
			var out bytes.Buffer
			err = run(context.Background(), options{
				drivers: "pgx", dsn: dsn, conc: []int{2}, prefill: 3000, prefillP: layout, prefillK: key, prefillT: table,
				duration: 20 * time.Millisecond, rounds: 1, sample: 5, dupIDs: 10, modes: "bare,inbox-full,dup-full", out: &out,
			})
			require.NoError(t, err, out.String())
			require.Contains(t, out.String(), "inbox-full")
			_, rates, _ := strings.Cut(out.String(), "c=2")
			requireNoErrors(t, rates)
			var parts, inDefault int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass`, table).Scan(&parts))
			require.Equal(t, want(layout), parts, "the past days, the current period, those ahead and the default partition")
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table+`_default`).Scan(&inDefault))
			require.Zero(t, inDefault, "every claim has a partition of its own period")
			if key == "event_time" {
				// The duplicates mode redelivers ids the table holds.
				var comment string
				require.NoError(t, db.QueryRow(`SELECT obj_description($1::regclass, 'pg_class')`, table).Scan(&comment))
				filledOn, err := time.Parse(time.DateOnly, comment)
				require.NoError(t, err)
				var n int
				require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table+` WHERE event_id = $1`, bench.PrefilledIDTime(3000, filledOn, prefillDays)).Scan(&n))
				require.Equal(t, 1, n)
			}
		})
	}
}

// requireNoErrors fails on every line of the program's output that reports
// an error or an inexact measurement (in parentheses), quoting only those
// lines.
func requireNoErrors(t *testing.T, out string) {
	t.Helper()
	var bad []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "(") {
			bad = append(bad, strings.TrimSpace(line))
		}
	}
	require.Empty(t, bad, "lines reporting errors or inexact measurements")
}

// -floor prints, per PostgreSQL driver and concurrency, the inbox's ratio
// beside pgbench's floor, measured in the same rounds.
func TestFloorSmoke(t *testing.T) {
	t.Parallel()
	if _, err := bench.FindPgbench(); err != nil {
		t.Skip(err)
	}
	var out bytes.Buffer
	err := run(context.Background(), options{
		drivers: "pgx,sqlite", dsn: testdb.PostgresDSN(), conc: []int{1, 2}, floor: true,
		duration: 20 * time.Millisecond, rounds: 2, sample: 5, dupIDs: 10, modes: "bare,inbox", out: &out,
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "floor = ")
	for _, c := range []string{"1", "2"} {
		require.Regexp(t, `(?m)^postgresql/pgx c=`+c+`: inbox \d+\.\d\d of bare, rounds \d+\.\d\d to \d+\.\d\d; floor \d+\.\d\d, rounds \d+\.\d\d to \d+\.\d\d; inbox - floor [+-]\d+\.\d\d$`, out.String())
	}
	require.NotContains(t, out.String(), "sqlite/modernc c=")
	requireNoErrors(t, out.String())
}
