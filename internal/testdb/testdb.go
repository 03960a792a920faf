// Package testdb hands tests real databases: connections from environment
// variables with localhost defaults, and table names unique to each test so
// tests run in parallel on one database. The repository's test.sh starts
// throwaway servers when none answers and exports these variables.
package testdb

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "github.com/lib/pq"              // registers "postgres"
	"github.com/stretchr/testify/require"
)

// PostgresDSN is the PostgreSQL URL tests use: INBOX_TEST_POSTGRES_DSN, or a
// local server with trust authentication and a "test" database.
func PostgresDSN() string {
	if dsn := os.Getenv("INBOX_TEST_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Open opens driverName on dsn, checks the server answers, and closes the
// pool when the test ends.
func Open(t testing.TB, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.Ping(), "no database answers at %s (run ./test.sh, which starts one)", dsn)
	return db
}

// Postgres opens the test PostgreSQL through lib/pq ("postgres") or pgx's
// stdlib ("pgx").
func Postgres(t testing.TB, driverName string) *sql.DB {
	return Open(t, driverName, PostgresDSN())
}

// Name returns a fresh lowercase identifier starting with prefix, unique
// across tests and runs.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// Table returns a unique table name and drops that table (if it was
// created) when the test ends.
func Table(t testing.TB, db *sql.DB, prefix string) string {
	t.Helper()
	name := Name(prefix)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}
