package prommetrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/prommetrics"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func TestWatchOldest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const name = "watermill_inbox_oldest_row_timestamp_seconds"
	require.NoError(t, f.metrics.WatchOldest(f.store))
	require.Equal(t, 0, testutil.CollectAndCount(f.reg, name), "an empty table has no sample")

	old := time.Date(2001, 2, 3, 4, 5, 6, 500e6, time.UTC)
	_, err := f.store.DB().Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES ('c', 'e', $1)`, f.store.Table()), old)
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(fmt.Sprintf(`
# HELP %[1]s When the oldest row still in the inbox table was claimed (database clock), as Unix seconds; time() minus it is the oldest row's age.
# TYPE %[1]s gauge
%[1]s{table=%[2]q} %[3]g
`, name, f.store.Table(), float64(old.UnixMilli())/1e3)), name))

	require.Error(t, f.metrics.WatchOldest(f.store), "one gauge per table")

	// A table that cannot be read reports it in oldest_row_up, and the
	// scrape succeeds.
	missing, err := sqlinbox.New(f.store.DB(), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: f.store.Table() + "_missing"})
	require.NoError(t, err)
	require.NoError(t, f.metrics.WatchOldest(missing))
	const up = "watermill_inbox_oldest_row_up"
	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(fmt.Sprintf(`
# HELP %[1]s 1 when this scrape read the inbox table's oldest row, 0 when the read failed (database unreachable, table missing, no privilege).
# TYPE %[1]s gauge
%[1]s{table=%[2]q} 1
%[1]s{table=%[3]q} 0
`, up, f.store.Table(), missing.Table())), up))
}

// While the database is down the oldest claim cannot be read, and the
// scrape still succeeds with promhttp's default options: the claim failures
// the rules alert on reach Prometheus, and oldest_row_up says the read
// failed. A failed read used to fail the whole scrape with HTTP 500.
func TestWatchOldestDuringOutage(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	reg := prometheus.NewRegistry()
	metrics, err := prommetrics.New(reg, "")
	require.NoError(t, err)
	require.NoError(t, metrics.WatchOldest(store))
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c", Observer: metrics})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = mw(ok)(event("e1"))
	require.Error(t, err)

	serve := func(opts promhttp.HandlerOpts) (int, string) {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, opts).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Code, rec.Body.String()
	}
	const failed = `watermill_inbox_messages_total{consumer="c",outcome="claim_failed"} 1`
	for _, opts := range []promhttp.HandlerOpts{{}, {ErrorHandling: promhttp.ContinueOnError}} {
		code, body := serve(opts)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, failed)
		require.Contains(t, body, `watermill_inbox_oldest_row_up{table="watermill_inbox"} 0`)
		require.NotContains(t, body, "oldest_row_timestamp_seconds{")
	}
}
