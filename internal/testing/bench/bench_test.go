package bench_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/bench"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// fixture is one driver's pool with an empty inbox, a business table and a
// set of events already claimed.
type fixture struct {
	rt    bench.RoundTrips
	admin *bench.Admin
	write bench.Write
	bare  message.HandlerFunc
	inbox message.HandlerFunc
	dups  []string
}

func setup(tb testing.TB, d bench.Driver, conns int) *fixture {
	tb.Helper()
	return setupOn(tb, d, conns, sqlinbox.Config{})
}

// setupOn is setup with the inbox table configured as sc (its Table is
// set here).
func setupOn(tb testing.TB, d bench.Driver, conns int, sc sqlinbox.Config) *fixture {
	tb.Helper()
	return setupWrite(tb, d, conns, sc, "one-row")
}

// setupWrite is setupOn with the business write of kind.
func setupWrite(tb testing.TB, d bench.Driver, conns int, sc sqlinbox.Config, kind string) *fixture {
	tb.Helper()
	ctx := context.Background()
	dsn := dsnFor(tb, d)
	admin, err := bench.OpenAdmin(ctx, d, dsn)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = admin.Close() })
	w, err := admin.CreateWrite(ctx, kind, "inbox_bench")
	require.NoError(tb, err)
	table := bench.Name("inbox_bench")
	tb.Cleanup(func() { _ = admin.Drop(ctx, append(w.Tables(), table)...) })
	sc.Table = table
	require.NoError(tb, admin.CreateInbox(ctx, sc))

	f := &fixture{admin: admin, write: w}
	// One connection more than messages in flight: the inbox leaves one
	// free (inbox.ClaimPool), and a pgxinbox.Store refuses a pool of one.
	conn, err := d.Open(ctx, dsn, conns+1, &f.rt)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close() })
	f.bare = conn.Bare(w)
	f.inbox, err = conn.Inbox(sc, w)
	require.NoError(tb, err)
	for range 100 {
		f.dups = append(f.dups, bench.Name("dup"))
	}
	// Claims the duplicates' events and prepares every statement.
	require.NoError(tb, bench.RunN(f.inbox, len(f.dups), sequence(f.dups)))
	require.NoError(tb, bench.RunN(f.bare, 10, bench.NewMessages()))
	return f
}

// dsnFor returns the test database of d's dialect (a fresh file for
// SQLite).
func dsnFor(tb testing.TB, d bench.Driver) string {
	switch d.Dialect() {
	case "mysql":
		return testdb.MySQLDSN()
	case "sqlite":
		return sqlinbox.SQLiteDSN(filepath.Join(tb.TempDir(), "bench.db"))
	}
	return testdb.PostgresDSN()
}

func sequence(ids []string) bench.Messages {
	i := 0
	return func(int) *message.Message {
		i++
		return message.NewMessage(ids[(i-1)%len(ids)], nil)
	}
}

// BenchmarkHandler is the hot path, one message at a time on one
// connection: the bare handler (its row in its own transaction), the same
// behind the inbox, and duplicates through the inbox. Run with -benchmem;
// roundtrips/op is counted on the wire.
//
//	go test -run '^$' -bench Handler -benchmem ./bench/  (from internal/testing)
func BenchmarkHandler(b *testing.B) {
	for _, d := range bench.Drivers {
		b.Run(d.Name, func(b *testing.B) {
			f := setup(b, d, 1)
			for _, m := range []struct {
				name string
				h    message.HandlerFunc
				msgs bench.Messages
			}{
				{"bare", f.bare, bench.NewMessages()},
				{"inbox", f.inbox, bench.NewMessages()},
				{"duplicate", f.inbox, bench.Duplicates(f.dups)},
			} {
				b.Run(m.name, func(b *testing.B) {
					b.ReportAllocs()
					rt0 := f.rt.Count()
					for b.Loop() {
						if _, err := m.h(m.msgs(0)); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(f.rt.Count()-rt0)/float64(b.N), "roundtrips/op")
				})
			}
		})
	}
}

// BenchmarkInboxOverBare alternates a bare message and an inbox message in
// every iteration, so both see the same load, and reports the inbox's time
// as a multiple of the bare handler's (inbox/bare; 1.0 is free).
func BenchmarkInboxOverBare(b *testing.B) {
	for _, d := range bench.Drivers {
		b.Run(d.Name, func(b *testing.B) {
			f := setup(b, d, 1)
			next := bench.NewMessages()
			var bare, inbox time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := f.bare(next(0)); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := f.inbox(next(0)); err != nil {
					b.Fatal(err)
				}
				bare += t1.Sub(t0)
				inbox += time.Since(t1)
			}
			b.ReportMetric(float64(inbox)/float64(bare), "inbox/bare")
		})
	}
}

// The counter sees the round trips the bare handler must make on every
// driver: BEGIN, the INSERT, COMMIT, plus one when the driver prepares
// each parameterised statement separately (lib/pq without
// binary_parameters). The inbox then adds at most one through database/sql
// and none on native pgx, where a duplicate costs two.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	for _, d := range bench.Drivers {
		if d.Embedded {
			continue // no network
		}
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d, 1)
			per := func(h message.HandlerFunc, msgs bench.Messages) float64 {
				rt0 := f.rt.Count()
				require.NoError(t, bench.RunN(h, 20, msgs))
				return float64(f.rt.Count()-rt0) / 20
			}
			bare := per(f.bare, bench.NewMessages())
			require.GreaterOrEqual(t, bare, 3.0)
			if d.Pipelined {
				// BEGIN+claim, INSERT, COMMIT; a duplicate: BEGIN+claim, ROLLBACK.
				require.Equal(t, bare, per(f.inbox, bench.NewMessages()))
				require.Equal(t, 2.0, per(f.inbox, bench.Duplicates(f.dups)))
				// On a partitioned table the event's lock travels in the
				// same batch, between BEGIN and the claim; a claim timeout
				// and the restoring of the session's lock_timeout after the
				// claim travel in it too.
				for name, sc := range map[string]sqlinbox.Config{
					"partitioned":                {Partitioning: sqlinbox.Daily},
					"claim timeout":              {ClaimTimeout: time.Second},
					"partitioned, claim timeout": {Partitioning: sqlinbox.Daily, ClaimTimeout: time.Second},
				} {
					f = setupOn(t, d, 1, sc)
					require.Equal(t, bare, per(f.inbox, bench.NewMessages()), name)
					require.Equal(t, 2.0, per(f.inbox, bench.Duplicates(f.dups)), name)
				}
				return
			}
			require.LessOrEqual(t, per(f.inbox, bench.NewMessages()), bare+1)
			require.LessOrEqual(t, per(f.inbox, bench.Duplicates(f.dups)), 3.0)
		})
	}
}

// The invoice write adds one invoice per message and one to a customer's
// count of invoices, bare and behind the inbox alike, on every dialect.
func TestInvoiceWrite(t *testing.T) {
	t.Parallel()
	for _, d := range bench.Drivers {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setupWrite(t, d, 1, sqlinbox.Config{}, "invoice")
			rows0, counted0, err := f.admin.Invoices(ctx, f.write)
			require.NoError(t, err)
			require.Equal(t, rows0, counted0)
			require.NoError(t, bench.RunN(f.bare, 7, bench.NewMessages()))
			require.NoError(t, bench.RunN(f.inbox, 5, bench.NewMessages()))
			require.NoError(t, bench.RunN(f.inbox, 5, bench.Duplicates(f.dups)))
			rows, counted, err := f.admin.Invoices(ctx, f.write)
			require.NoError(t, err)
			require.Equal(t, rows0+12, rows)
			require.Equal(t, rows0+12, counted)
		})
	}
}

// The floor's scripts run under pgbench: the one with the claim writes a
// claim and a business row per transaction, the other the business row
// alone.
func TestFloor(t *testing.T) {
	t.Parallel()
	pgbench, err := bench.FindPgbench()
	if err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	pg, err := bench.FindDrivers("postgresql/pgx")
	require.NoError(t, err)
	for _, kind := range bench.WriteKinds {
		for _, uuidIDs := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s uuid=%v", kind, uuidIDs), func(t *testing.T) {
				t.Parallel()
				admin, err := bench.OpenAdmin(ctx, pg[0], testdb.PostgresDSN())
				require.NoError(t, err)
				t.Cleanup(func() { _ = admin.Close() })
				f, err := admin.NewFloor(ctx, pgbench, testdb.PostgresDSN(), sqlinbox.Config{UUIDEventIDs: uuidIDs}, kind)
				require.NoError(t, err)
				t.Cleanup(func() { _ = f.Close(ctx) })
				tps, err := f.Run(ctx, false, 1, time.Second)
				require.NoError(t, err)
				require.Positive(t, tps)
				claims, writes, err := f.Rows(ctx)
				require.NoError(t, err)
				require.Zero(t, claims)
				require.Positive(t, writes)
				require.NoError(t, f.Reset(ctx))
				tps, err = f.Run(ctx, true, 2, time.Second)
				require.NoError(t, err)
				require.Positive(t, tps)
				claims, writes, err = f.Rows(ctx)
				require.NoError(t, err)
				require.Positive(t, claims)
				require.Equal(t, claims, writes)
			})
		}
	}
	// A partitioned table's claim is more than the INSERT.
	admin, err := bench.OpenAdmin(ctx, pg[0], testdb.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	_, err = admin.NewFloor(ctx, pgbench, testdb.PostgresDSN(), sqlinbox.Config{Partitioning: sqlinbox.Daily}, "one-row")
	require.ErrorContains(t, err, "plain table")
}
