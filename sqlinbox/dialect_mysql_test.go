package sqlinbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// With clientFoundRows a duplicate reports one row, like a new claim: the
// store must refuse to claim rather than run the handler twice.
func TestMySQLRefusesClientFoundRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	cfg.ClientFoundRows = true
	db := testdb.Open(t, "mysql", cfg.FormatDSN())
	for _, uuidIDs := range []bool{false, true} {
		store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "inbox"), UUIDEventIDs: uuidIDs})
		require.NoError(t, err)
		require.NoError(t, store.CreateSchema(ctx))
		mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
		require.NoError(t, err)
		called := false
		msg := message.NewMessage(watermill.NewUUID(), nil)
		_, err = mw(func(*message.Message) ([]*message.Message, error) {
			called = true
			return nil, nil
		})(msg)
		require.ErrorIs(t, err, sqlinbox.ErrClientFoundRows)
		require.ErrorContains(t, err, "remove clientFoundRows")
		require.False(t, called, "handler called")

		// The probe left nothing behind, and the same table works through
		// a connection without the option.
		var n int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+store.Table()).Scan(&n))
		require.Zero(t, n)
		good, err := sqlinbox.New(testdb.MySQL(t), sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: store.Table(), UUIDEventIDs: uuidIDs})
		require.NoError(t, err)
		tx, claimed, err := claim(ctx, good, nil, "c", msg.UUID)
		require.NoError(t, err)
		require.True(t, claimed)
		require.NoError(t, tx.Commit())
		_, claimed, err = claim(ctx, good, nil, "c", msg.UUID)
		require.NoError(t, err)
		require.False(t, claimed)
	}
}

// The key columns are binary: ids that a default collation would merge
// (case, trailing spaces, accents) stay distinct.
func TestMySQLKeysCompareBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQL(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "inbox")})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	for _, consumer := range []string{"C", "c", "c ", "é", "e"} {
		for _, id := range []string{"A", "a", "a ", "á"} {
			tx, claimed, err := claim(ctx, store, nil, consumer, id)
			require.NoError(t, err)
			require.True(t, claimed, "%q/%q", consumer, id)
			require.NoError(t, tx.Commit())
		}
	}
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+store.Table()).Scan(&n))
	require.Equal(t, 20, n)
}

// The purge's named lock is the table's, whether its name is qualified
// with the database or not: a second purge skips the round.
func TestMySQLPurgeLockIgnoresTableSpelling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQL(t)
	table := testdb.Table(t, db, "inbox")
	var database string
	require.NoError(t, db.QueryRow("SELECT DATABASE()").Scan(&database))
	var stores []*sqlinbox.Store
	for _, name := range []string{table, database + "." + table} {
		store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: name})
		require.NoError(t, err)
		stores = append(stores, store)
	}
	require.NoError(t, stores[0].CreateSchema(ctx))
	sess, busy, err := stores[0].Maintenance().BeginPurge(ctx)
	require.NoError(t, err)
	require.Nil(t, busy)
	_, busy, err = stores[1].Maintenance().BeginPurge(ctx)
	require.NoError(t, err)
	require.NotNil(t, busy, "a second purge of the same table must skip")
	require.NoError(t, sess.Close())
	sess, busy, err = stores[1].Maintenance().BeginPurge(ctx)
	require.NoError(t, err)
	require.Nil(t, busy, "the lock is released")
	require.NoError(t, sess.Close())
}
