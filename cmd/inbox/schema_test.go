package main

import (
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Without -apply, schema prints what sqlinbox would run, and connects to
// nothing.
func TestSchemaPrints(t *testing.T) {
	t.Parallel()
	for name, d := range map[string]sqlinbox.Dialect{"postgresql": sqlinbox.PostgreSQL, "mysql": sqlinbox.MySQL, "sqlite": sqlinbox.SQLite} {
		db, err := sql.Open(map[string]string{"postgresql": "pgx", "mysql": "mysql", "sqlite": "sqlite"}[name], "") // never used: New does not connect
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		for _, fingerprints := range []bool{false, true} {
			store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: d, Table: "app.inbox", Fingerprints: fingerprints})
			require.NoError(t, err)
			args := []string{"schema", "-dialect", name, "-table", "app.inbox"}
			if fingerprints {
				args = append(args, "-fingerprints")
			}
			code, out, errOut := runCmd(args...)
			require.Equal(t, exitOK, code, errOut)
			require.Equal(t, store.SchemaSQL(), out, name)
			code, out, errOut = runCmd(append(args, "-add-fingerprint-column")...)
			require.Equal(t, exitOK, code, errOut)
			require.Equal(t, store.AddFingerprintColumnSQL(), out, name)
		}
	}
	code, out, _ := runCmd("schema", "-partitioning", "monthly", "-uuid-event-ids")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "PARTITION BY RANGE (processed_at)")
	require.Contains(t, out, "event_id     uuid")
	code, out, _ = runCmd("schema", "-dialect", "mysql", "-shard-key-column", "customer")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "\t`customer`   VARBINARY(255) NOT NULL,\n")

	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"-dialect", "oracle"}, `-dialect "oracle": use postgresql, mysql or sqlite`},
		{[]string{"-dialect", "mysql", "-partitioning", "daily"}, "-partitioning daily needs -dialect postgresql"},
		{[]string{"-partition-key", "event_time"}, "-partition-key event_time needs -partitioning daily or monthly"},
		{[]string{"-partitioning", "weekly"}, `-partitioning "weekly"`},
		{[]string{"-table", "App.Inbox"}, "-table: table name"},
		{[]string{"-apply"}, "-dsn is required"},
		{[]string{"-shard-key-column", "customer"}, "ShardKeyColumn is for MySQL sharded by Vitess, not postgresql"},
	} {
		code, out, errOut := runCmd(append([]string{"schema"}, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v", tc.args)
		require.Empty(t, out)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
}

// Applying creates the table once, then leaves it alone, adds the
// fingerprint column when asked, and refuses a table made for another
// configuration; a user that may not create tables gets told so.
func TestSchemaApply(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		db := tg.open(t)
		table := sqlinbox.DefaultTable
		if tg.dialect != "sqlite" {
			table = testdb.Table(t, db, "cmd_schema")
		}
		f := &fixture{tg: tg, db: db, table: table}
		code, out, errOut := f.run(t, "schema", "-apply")
		require.Equal(t, exitOK, code, errOut)
		require.Equal(t, "created "+table+"\n", out)
		code, out, errOut = f.run(t, "check")
		require.Equal(t, exitOK, code, out+errOut)

		code, out, errOut = f.run(t, "schema", "-apply")
		require.Equal(t, exitOK, code, errOut)
		require.Equal(t, table+" already matches the configuration; nothing to do\n", out)

		if tg.dialect != "sqlite" { // SQLite keeps UUIDs as text
			code, out, errOut = f.run(t, "schema", "-apply", "-uuid-event-ids", "-fingerprints")
			require.Equal(t, exitFailed, code)
			require.Contains(t, out, "FAIL  columns: ")
			require.Contains(t, errOut, "the table does not match the configuration, and applying the schema does not change an existing table")
			code, out, _ = f.run(t, "check", "-fingerprints")
			require.Equal(t, exitFailed, code, "a table made for another configuration is left as it was")
			require.Contains(t, out, "FAIL  fingerprint column: none")
		}

		code, out, errOut = f.run(t, "schema", "-apply", "-fingerprints")
		require.Equal(t, exitOK, code, errOut)
		require.Equal(t, "added the fingerprint column to "+table+"\n", out)
		code, out, errOut = f.run(t, "check", "-fingerprints")
		require.Equal(t, exitOK, code, out+errOut)
		code, out, errOut = f.run(t, "schema", "-apply", "-add-fingerprint-column")
		require.Equal(t, exitOK, code, errOut)
		require.Equal(t, table+" already has the fingerprint column\n", out)

		ro := tg.readOnly(t, db, table)
		code, out, errOut = runCmd("schema", "-apply", "-dialect", tg.dialect, "-dsn", ro, "-table", table)
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "nothing to do")
		code, _, errOut = runCmd("schema", "-apply", "-dialect", tg.dialect, "-dsn", ro, "-table", "not_created")
		require.Equal(t, exitFailed, code)
		require.Contains(t, errOut, "the user needs the privilege to create tables; or apply the DDL of inbox schema with your migration tool")

		code, _, errOut = runCmd("schema", "-apply", "-dialect", tg.dialect, "-dsn", unreachable(tg))
		require.Equal(t, exitConnect, code, errOut)
	})
}

// Applied to a SQLite file that does not exist yet, schema creates it; the
// other subcommands refuse a missing file instead of creating an empty
// database there.
func TestSchemaCreatesTheSQLiteFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "new.db")
	code, _, errOut := runCmd("stats", "-dialect", "sqlite", "-dsn", path)
	require.Equal(t, exitConnect, code)
	require.Contains(t, errOut, "cannot open the SQLite database "+path)
	_, err := os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)

	code, out, errOut := runCmd("schema", "-apply", "-dialect", "sqlite", "-dsn", "file:"+path)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "created watermill_inbox\n", out)
	code, out, errOut = runCmd("stats", "-dialect", "sqlite", "-dsn", path)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "no claims")
}

// A partitioned table gets its partitions ahead, so that check passes at
// once.
func TestSchemaApplyPartitioned(t *testing.T) {
	t.Parallel()
	db := postgres.open(t)
	f := &fixture{tg: postgres, db: db, table: testdb.Table(t, db, "cmd_schema")}
	code, out, errOut := f.run(t, "schema", "-apply", "-partitioning", "monthly", "-partitions-ahead", "2")
	require.Equal(t, exitOK, code, errOut)
	// CreateSchema makes the current month's and the next three.
	require.Regexp(t, `^created \S+\n(created partition \S+_p\d{6}\n){4}$`, out)
	code, out, errOut = f.run(t, "check", "-partitioning", "monthly", "-partitions-ahead", "2")
	require.Equal(t, exitOK, code, out+errOut)
}

// -format goose marks the statement that holds semicolons of its own (a
// partitioned table's DO block) for goose, which splits the rest at each
// semicolon that ends a line; -down prints the down migration. The test
// rig applies both with the tools (internal/testing/migrations).
func TestSchemaFormats(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd("schema", "-format", "goose", "-partitioning", "daily", "-table", "app.inbox")
	require.Equal(t, exitOK, code, errOut)
	require.True(t, strings.HasPrefix(out, "-- +goose Up\nCREATE TABLE IF NOT EXISTS \"app\".\"inbox\""), out)
	require.Contains(t, out, "-- +goose StatementBegin\nDO $$")
	require.Contains(t, out, "END $$;\n-- +goose StatementEnd\n")
	require.Equal(t, 1, strings.Count(out, "StatementBegin"), "only the DO block needs it")
	require.True(t, strings.HasSuffix(out, "-- +goose Down\n"+dropWarning+"DROP TABLE IF EXISTS \"app\".\"inbox\";\nDROP TABLE IF EXISTS \"app\".\"inbox_leases\";\n"), out)

	code, out, errOut = runCmd("schema", "-down", "-dialect", "mysql")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, dropWarning+"DROP TABLE IF EXISTS `watermill_inbox`;\nDROP TABLE IF EXISTS `watermill_inbox_leases`;\n", out)
	code, out, errOut = runCmd("schema", "-down", "-add-fingerprint-column", "-dialect", "sqlite")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "ALTER TABLE \"watermill_inbox\" DROP COLUMN fingerprint;\n", out)

	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"-format", "atlas"}, `-format "atlas": use plain or goose`},
		{[]string{"-format", "goose", "-down"}, "-format goose prints the Down section"},
		{[]string{"-apply", "-format", "goose", "-dsn", "x"}, "-format and -down are for printing it"},
	} {
		code, out, errOut := runCmd(append([]string{"schema"}, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v", tc.args)
		require.Empty(t, out)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
}
