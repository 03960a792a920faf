package vitess_test

import (
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// vt is the package's Vitess: vtgate in transaction_mode SINGLE, which
// refuses a transaction that reaches a second shard.
var vt *dbserver.Vitess

func TestMain(m *testing.M) {
	start := time.Now()
	v, err := dbserver.StartVitess(dbserver.VitessConfig{Keyspace: "inbox", Shards: 2, TransactionMode: "SINGLE"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting Vitess:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "Vitess %s: binaries built or found in the build cache in %s, serving %d shards after %s more\n",
		dbserver.VitessVersion, v.Built.Round(time.Millisecond), len(v.Shards()), v.Started.Round(time.Millisecond))
	vt = v
	code := m.Run()
	v.Stop()
	fmt.Fprintf(os.Stderr, "Vitess tests took %s in all\n", time.Since(start).Round(time.Millisecond))
	os.Exit(code)
}

// open connects to vtgate; params are DSN parameters ("a=b").
func open(t testing.TB, params ...string) *sql.DB {
	t.Helper()
	dsn := vt.DSN()
	if len(params) > 0 {
		dsn += "?" + strings.Join(params, "&")
	}
	db := testdb.Open(t, "mysql", dsn)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	return db
}

// shardBy adds table to the keyspace's vschema, sharded by column with
// vindex (hash, xxhash), before it exists: vtgate sends DDL for a table of
// a sharded keyspace to every shard.
func shardBy(t testing.TB, db *sql.DB, table, column, vindex string) {
	t.Helper()
	// vtgate refuses a vschema change made from a stale copy, which a
	// parallel test's change makes this one: one at a time, and again.
	vschemaMu.Lock()
	defer vschemaMu.Unlock()
	var err error
	for range 20 {
		if _, err = db.Exec(fmt.Sprintf("ALTER VSCHEMA ON %s ADD VINDEX %s(%s) USING %s", table, vindex, column, vindex)); err == nil || !strings.Contains(err.Error(), "stale") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err)
}

var vschemaMu sync.Mutex

// newStore makes an inbox table sharded by column (event_id, or the shard
// key column) with vindex, and its consumer registry sharded by consumer,
// as docs/databases.md says, then runs CreateSchema through vtgate.
func newStore(t testing.TB, db *sql.DB, config sqlinbox.Config, column, vindex string) *sqlinbox.Store {
	t.Helper()
	config.Dialect = sqlinbox.MySQL
	config.Table = testdb.Table(t, db, "inbox")
	shardBy(t, db, config.Table, column, vindex)
	shardBy(t, db, config.Table+"_consumers", "consumer", "xxhash")
	store, err := sqlinbox.New(db, config)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(t.Context()))
	return store
}

// newEffects makes the handler's table, sharded by its own key, customer_id
// (BIGINT, the hash vindex): one row per handled delivery, with no key
// that would refuse a second, so a doubled effect shows as a second row.
func newEffects(t testing.TB, db *sql.DB) string {
	t.Helper()
	name := testdb.Name("effects")
	shardBy(t, db, name, "customer_id", "hash")
	_, err := db.Exec("CREATE TABLE " + name + " (customer_id BIGINT NOT NULL, event_id VARBINARY(255) NOT NULL, copy INT NOT NULL, PRIMARY KEY (customer_id, event_id, copy))")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}

// perShard returns column's values in table on each shard, read from that
// shard alone.
func perShard(t testing.TB, table, column string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, shard := range vt.Shards() {
		db := testdb.Open(t, "mysql", vt.ShardDSN(shard))
		rows, err := db.Query("SELECT " + column + " FROM " + table)
		require.NoError(t, err)
		for rows.Next() {
			var v string
			require.NoError(t, rows.Scan(&v))
			out[shard] = append(out[shard], v)
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		require.NoError(t, db.Close())
	}
	return out
}

// counts formats a per-shard map's sizes: "-80: 980, 80-: 1020".
func counts(m map[string][]string) string {
	var parts []string
	for _, shard := range vt.Shards() {
		parts = append(parts, fmt.Sprintf("%s: %d", shard, len(m[shard])))
	}
	return strings.Join(parts, ", ")
}
