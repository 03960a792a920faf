package prommetrics_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

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
