package pgxinbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// pooledPool opens a pool through the test PgBouncer on dsn.
func pooledPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TransactionPooling on a pool whose exec mode names prepared statements
// (pgx's default) is refused, naming the DSN setting; with it, the store
// is built.
func TestTransactionPoolingNeedsAnExecMode(t *testing.T) {
	t.Parallel()
	sc := sqlinbox.Config{TransactionPooling: true}
	for _, mode := range []string{"", "&default_query_exec_mode=describe_exec"} {
		_, err := pgxinbox.NewStore(pooledPool(t, testdb.PgBouncerDSN()+mode), sc)
		require.ErrorContains(t, err, "add default_query_exec_mode=exec to the DSN", mode)
	}
	for _, mode := range []string{"exec", "simple_protocol", "cache_describe"} {
		store, err := pgxinbox.NewStore(pooledPool(t, testdb.PgBouncerDSN()+"&default_query_exec_mode="+mode), sc)
		require.NoError(t, err, mode)
		require.NoError(t, store.Close())
	}
}

// Without the DSN setting, pgx's statement cache fails behind the pooler as
// soon as a statement meets another server connection: the claim fails
// (the message is nacked, nothing is claimed) with an error that names the
// proxy and what to set, never the schema.
func TestPoolerErrorSaysWhatToSet(t *testing.T) {
	t.Parallel()
	testdb.BusyPooler(t, 3)
	table := testdb.Name("inbox")
	direct := newStore(t, sqlinbox.Config{Table: table})
	require.NoError(t, direct.CreateSchema(context.Background()))
	t.Cleanup(func() { _, _ = direct.Pool().Exec(context.Background(), "DROP TABLE "+table) })
	store, err := pgxinbox.NewStore(pooledPool(t, testdb.PgBouncerDSN()), sqlinbox.Config{Table: table})
	require.NoError(t, err)
	failed := 0
	for i := 0; i < 200 && failed == 0; i++ {
		tx, _, err := store.Claim(context.Background(), inboxdriver.Claim{Consumer: "billing", EventID: fmt.Sprint("ev-", i)})
		if err != nil {
			require.ErrorContains(t, err, "a transaction-pooling proxy switched server connections between two statements: set sqlinbox.Config.TransactionPooling")
			require.NotContains(t, err.Error(), "CreateSchema")
			failed++
			continue
		}
		require.NoError(t, tx.Commit(context.Background()))
	}
	require.Equal(t, 1, failed, "200 claims through a busy pooler with pgx's statement cache all went through")
}
