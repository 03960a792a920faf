package sqlinbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func TestShardKeyColumnConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/unused")
	require.NoError(t, err)
	defer db.Close()
	for col, want := range map[string]string{
		"Shard":                 "lowercase letters",
		"shard-key":             "lowercase letters",
		strings.Repeat("s", 41): "at most 40 bytes",
		"event_id":              "a column the inbox table already has",
		"fingerprint":           "a column the inbox table already has",
	} {
		_, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, ShardKeyColumn: col})
		require.ErrorContains(t, err, want, col)
		require.ErrorContains(t, err, "invalid config: ShardKeyColumn", col)
	}
	pg, err := sql.Open("postgres", "postgres://unused")
	require.NoError(t, err)
	defer pg.Close()
	_, err = sqlinbox.New(pg, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, ShardKeyColumn: "shard_key"})
	require.ErrorContains(t, err, "ShardKeyColumn is for MySQL sharded by Vitess, not postgresql")

	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: "inbox", ShardKeyColumn: "customer"})
	require.NoError(t, err)
	require.Contains(t, store.SchemaSQL(), "\t`customer`   VARBINARY(255) NOT NULL,\n")
	require.Equal(t, "customer", store.ShardKeyColumn())
}

// On MariaDB alone the shard key is a column like another: stored with each
// claim, required by a store that has it, refused by one that has not; a
// duplicate is found by (consumer, event_id), its fingerprint read with the
// key; inbox check wants the column.
func TestShardKeyColumnOnMariaDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQL(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "inbox"), ShardKeyColumn: "shard_key", Fingerprints: true})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))

	_, _, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: "event-1"})
	require.ErrorIs(t, err, sqlinbox.ErrShardKey)
	require.ErrorContains(t, err, "set inbox.Config.ShardKey")
	_, _, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: "event-1", ShardKey: strings.Repeat("k", sqlinbox.MaxShardKeyLength+1)})
	require.ErrorIs(t, err, sqlinbox.ErrShardKey)

	tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: "event-1", ShardKey: "customer-42", Fingerprint: []byte("first")})
	require.NoError(t, err)
	require.NotNil(t, tx)
	require.NoError(t, tx.Commit(ctx))
	tx, stored, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: "event-1", ShardKey: "customer-42", Fingerprint: []byte("second")})
	require.NoError(t, err)
	require.Nil(t, tx, "a duplicate")
	require.Equal(t, "first", string(stored))
	var key string
	require.NoError(t, db.QueryRow("SELECT shard_key FROM "+store.Table()+" WHERE event_id = 'event-1'").Scan(&key))
	require.Equal(t, "customer-42", key)

	check, err := store.Maintenance().Check(ctx, 0)
	require.NoError(t, err)
	require.True(t, check.OK(), "%+v", check.Findings)
	noKey, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: store.Table(), ShardKeyColumn: "customer_id"})
	require.NoError(t, err)
	check, err = noKey.Maintenance().Check(ctx, 0)
	require.NoError(t, err)
	require.False(t, check.OK(), "a table without the configured column")

	plain, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "inbox")})
	require.NoError(t, err)
	require.NoError(t, plain.CreateSchema(ctx))
	_, _, err = plain.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: "event-1", ShardKey: "customer-42"})
	require.ErrorIs(t, err, sqlinbox.ErrShardKey)
	require.ErrorContains(t, err, "has no shard key column")
}
