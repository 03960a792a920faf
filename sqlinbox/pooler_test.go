package sqlinbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A store not told it is behind a transaction-pooling proxy prepares its
// claim, and the proxy soon runs it on a server connection that does not
// have it: the store switches to unprepared claims for good, says so once,
// and retries that claim, so that every event is claimed once and no claim
// fails. (pgx names its prepared statements by their text, so the lost
// statement is never another one; lib/pq's numbered names can be, which is
// why TransactionPooling must be set: see the pooled conformance targets.)
func TestPreparedClaimLostToAPooler(t *testing.T) {
	t.Parallel()
	testdb.BusyPooler(t, 3)
	db := testdb.PgBouncer(t, "pgx")
	logs := watermill.NewCaptureLogger()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: testdb.Table(t, db, "inbox"), Logger: logs})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	t.Cleanup(func() { _ = store.Close() })
	for i := range 200 {
		require.True(t, claimOnce(t, store, "billing", fmt.Sprint("ev-", i)))
		require.False(t, claimOnce(t, store, "billing", fmt.Sprint("ev-", i)))
	}
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+store.Table()).Scan(&rows))
	require.Equal(t, 200, rows)
	lost := 0
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		require.Contains(t, m.Msg, "a transaction-pooling proxy lost the prepared claim; claiming unprepared from now on")
		lost++
	}
	require.Equal(t, 1, lost, "one line when the store switches, none before or after")
}

// With TransactionPooling the claim is never prepared: through a busy
// pool no claim fails, and the store has nothing to report.
func TestTransactionPoolingNeverPrepares(t *testing.T) {
	t.Parallel()
	testdb.BusyPooler(t, 3)
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.PgBouncer(t, driver)
			logs := watermill.NewCaptureLogger()
			store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: testdb.Table(t, db, "inbox"), TransactionPooling: true, Logger: logs})
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(context.Background()))
			for i := range 100 {
				require.True(t, claimOnce(t, store, "billing", fmt.Sprint("ev-", i)))
			}
			require.Empty(t, logs.Captured()[watermill.ErrorLogLevel])
		})
	}
}
