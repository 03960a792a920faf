package pgxinbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Native pgx's errors are conflicts by SQLSTATE as database/sql's are: a
// deadlock and a serialization failure are, a unique violation and a lock
// timeout are not.
func TestIsConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, sqlinbox.Config{})
	pool := f.store.Pool()
	table := testdb.Name("conflict")
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int NOT NULL); INSERT INTO `+table+` VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table) })
	update := `UPDATE ` + table + ` SET v = v + 1 WHERE id = $1`
	begin := func(opts pgx.TxOptions) pgx.Tx {
		tx, err := pool.BeginTx(ctx, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}

	// A deadlock: two transactions lock the rows in opposite orders.
	tx1, tx2 := begin(pgx.TxOptions{}), begin(pgx.TxOptions{})
	_, err = tx1.Exec(ctx, update, 1)
	require.NoError(t, err)
	_, err = tx2.Exec(ctx, update, 2)
	require.NoError(t, err)
	second := make(chan error, 1)
	go func() { _, err := tx1.Exec(ctx, update, 2); second <- err }()
	_, deadlock := tx2.Exec(ctx, update, 1)
	if deadlock == nil { // tx1 was the victim; tx2 holds both rows until it ends
		deadlock = <-second
		require.NoError(t, tx2.Rollback(ctx))
	} else {
		require.NoError(t, tx2.Rollback(ctx))
		require.NoError(t, <-second)
	}
	require.NoError(t, tx1.Rollback(ctx))
	require.True(t, f.store.IsConflict(deadlock), "deadlock: %v", deadlock)
	require.True(t, f.store.IsConflict(fmt.Errorf("handler: %w", deadlock)), "wrapped")

	// A serialization failure: the row changed after the snapshot.
	rr := begin(pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	var v int
	require.NoError(t, rr.QueryRow(ctx, `SELECT v FROM `+table+` WHERE id = 2`).Scan(&v))
	_, err = pool.Exec(ctx, update, 2)
	require.NoError(t, err)
	_, serialization := rr.Exec(ctx, update, 2)
	require.True(t, f.store.IsConflict(serialization), "serialization failure: %v", serialization)
	require.NoError(t, rr.Rollback(ctx))

	// Not conflicts.
	_, dup := pool.Exec(ctx, `INSERT INTO `+table+` VALUES (1, 0)`)
	holder := begin(pgx.TxOptions{})
	_, err = holder.Exec(ctx, update, 1)
	require.NoError(t, err)
	waiter := begin(pgx.TxOptions{})
	_, err = waiter.Exec(ctx, `SET LOCAL lock_timeout = '100ms'`)
	require.NoError(t, err)
	_, lockTimeout := waiter.Exec(ctx, update, 1)
	for what, err := range map[string]error{"nil": nil, "unique violation": dup, "lock timeout": lockTimeout, "message text": errors.New(deadlock.Error())} {
		require.False(t, f.store.IsConflict(err), "%s: %v", what, err)
	}
	require.Error(t, dup)
	require.Error(t, lockTimeout)
}
