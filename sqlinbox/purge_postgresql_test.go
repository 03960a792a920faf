package sqlinbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The purge lock is the table's too: a purge configured with the other
// spelling skips the round instead of running beside the first.
func TestPurgeLockIgnoresTableSpelling(t *testing.T) {
	plainAndDaily(t, func(t *testing.T, mode sqlinbox.Partitioning) {
		db, first, table := partitionedStore(t, "pgx", mode)
		_, b := spellings(t, db, table)
		second, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: b, Partitioning: mode})
		require.NoError(t, err)
		sess, busy, err := first.Maintenance().BeginPurge(context.Background())
		require.NoError(t, err)
		require.Nil(t, busy)
		_, busy, err = second.Maintenance().BeginPurge(context.Background())
		require.NoError(t, err)
		require.NotNil(t, busy, "a second purge of the same table must skip")
		require.NoError(t, sess.Close())
		sess, busy, err = second.Maintenance().BeginPurge(context.Background())
		require.NoError(t, err)
		require.Nil(t, busy, "the lock is released")
		require.NoError(t, sess.Close())
	})
}
