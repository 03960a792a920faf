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

	// A table that does not exist fails the scrape, with the reason.
	missing, err := sqlinbox.New(f.store.DB(), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: f.store.Table() + "_missing"})
	require.NoError(t, err)
	require.NoError(t, f.metrics.WatchOldest(missing))
	_, err = f.reg.Gather()
	require.ErrorContains(t, err, "does not exist")
}

// While the database is down the oldest claim cannot be read: the default
// handler then serves no metric at all, ContinueOnError still serves the
// claim failures the rules alert on (what WatchOldest's doc advises).
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
	code, body := serve(promhttp.HandlerOpts{})
	require.Equal(t, http.StatusInternalServerError, code)
	require.NotContains(t, body, failed)
	code, body = serve(promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, failed)
	require.NotContains(t, body, "oldest_row_timestamp_seconds{")
}
