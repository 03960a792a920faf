package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// conflictCase opens one database behind a store and provokes its errors
// on a table of two rows (id 1 and 2).
type conflictCase struct {
	dialect sqlinbox.Dialect
	db      *sql.DB
	param   func(n int) string
}

func (c conflictCase) table(t *testing.T) string {
	t.Helper()
	name := testdb.Table(t, c.db, "conflict")
	_, err := c.db.Exec(`CREATE TABLE ` + name + ` (id int PRIMARY KEY, v int NOT NULL)`)
	require.NoError(t, err)
	_, err = c.db.Exec(`INSERT INTO ` + name + ` (id, v) VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)
	return name
}

// deadlock makes two transactions lock the rows in opposite orders and
// returns the error of the one the database chose as its victim.
func (c conflictCase) deadlock(t *testing.T, table string) error {
	t.Helper()
	ctx := context.Background()
	update := `UPDATE ` + table + ` SET v = v + 1 WHERE id = ` + c.param(1)
	tx1, err := c.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback() }()
	tx2, err := c.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx2.Rollback() }()
	_, err = tx1.Exec(update, 1)
	require.NoError(t, err)
	_, err = tx2.Exec(update, 2)
	require.NoError(t, err)
	second := make(chan error, 1)
	go func() { _, err := tx1.Exec(update, 2); second <- err }() // waits for tx2
	_, err2 := tx2.Exec(update, 1)
	if err2 == nil {
		return <-second
	}
	require.NoError(t, tx2.Rollback())
	require.NoError(t, <-second)
	return err2
}

// The store recognises a conflict by error number or SQLSTATE wherever
// errors.As finds it, and nothing else: not a lock wait timeout, not a
// unique violation, not a lookalike message.
func TestIsConflict(t *testing.T) {
	t.Parallel()
	cases := map[string]conflictCase{
		"lib-pq":     {dialect: sqlinbox.PostgreSQL, db: testdb.Postgres(t, "postgres"), param: pgParam},
		"pgx-stdlib": {dialect: sqlinbox.PostgreSQL, db: testdb.Postgres(t, "pgx"), param: pgParam},
		"mysql":      {dialect: sqlinbox.MySQL, db: testdb.MySQL(t), param: func(int) string { return "?" }},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, err := sqlinbox.New(c.db, sqlinbox.Config{Dialect: c.dialect, Table: testdb.Name("inbox")})
			require.NoError(t, err)
			table := c.table(t)

			deadlock := c.deadlock(t, table)
			require.Error(t, deadlock)
			require.True(t, store.IsConflict(deadlock), "deadlock: %v", deadlock)
			require.True(t, store.IsConflict(fmt.Errorf("handler: %w", deadlock)), "wrapped")
			require.True(t, store.IsConflict(errors.Join(errors.New("other"), deadlock)), "joined")

			_, dup := c.db.Exec(`INSERT INTO ` + table + ` (id, v) VALUES (1, 0)`)
			require.Error(t, dup)
			for what, err := range map[string]error{
				"nil":              nil,
				"unique violation": dup,
				"message text":     errors.New(deadlock.Error()),
				"lock wait":        c.lockWait(t, table),
			} {
				require.False(t, store.IsConflict(err), "%s: %v", what, err)
			}
			if c.dialect != sqlinbox.PostgreSQL {
				return
			}
			serialization := serializationFailure(t, c.db, table)
			require.True(t, store.IsConflict(serialization), "serialization failure: %v", serialization)
		})
	}
}

func pgParam(n int) string { return fmt.Sprintf("$%d", n) }

// lockWait returns the error of a statement that waited for a row lock
// longer than the session allows.
func (c conflictCase) lockWait(t *testing.T, table string) error {
	t.Helper()
	ctx := context.Background()
	holder, err := c.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback() }()
	_, err = holder.Exec(`UPDATE `+table+` SET v = v + 1 WHERE id = `+c.param(1), 1)
	require.NoError(t, err)
	waiter, err := c.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = waiter.Rollback() }()
	setting := `SET LOCAL lock_timeout = '100ms'`
	if c.dialect == sqlinbox.MySQL {
		setting = `SET SESSION innodb_lock_wait_timeout = 1`
	}
	_, err = waiter.Exec(setting)
	require.NoError(t, err)
	_, err = waiter.Exec(`UPDATE `+table+` SET v = v + 1 WHERE id = `+c.param(1), 1)
	require.Error(t, err)
	if c.dialect == sqlinbox.MySQL {
		// The setting outlives the transaction on this pooled connection.
		_, _ = waiter.Exec(`SET SESSION innodb_lock_wait_timeout = DEFAULT`)
	}
	return err
}

// serializationFailure returns the error of a REPEATABLE READ transaction
// that updates a row another transaction changed after its snapshot.
func serializationFailure(t *testing.T, db *sql.DB, table string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var v int
	require.NoError(t, tx.QueryRow(`SELECT v FROM `+table+` WHERE id = 2`).Scan(&v)) // takes the snapshot
	_, err = db.Exec(`UPDATE ` + table + ` SET v = v + 1 WHERE id = 2`)
	require.NoError(t, err)
	_, err = tx.Exec(`UPDATE ` + table + ` SET v = v + 1 WHERE id = 2`)
	require.Error(t, err)
	return err
}
