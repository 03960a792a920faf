package main

import (
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Two runs at once on one server, as two people trying the example on a
// shared database: each has its own tables, each counts exactly, and
// neither leaves a table behind.
func TestRunsAtOnce(t *testing.T) {
	dsn := os.Getenv("INBOX_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	tables := []string{fmt.Sprintf("example_test_%08x", rand.Uint32()), ""} // a chosen name, and the default
	errs := make(chan error, len(tables))
	for _, table := range tables {
		go func() { errs <- run(io.Discard, dsn, table, false) }()
	}
	for range tables {
		require.NoError(t, <-errs)
	}
	db, err := sql.Open("postgres", dsn)
	require.NoError(t, err)
	defer db.Close()
	var left sql.NullString
	require.NoError(t, db.QueryRow(`SELECT to_regclass($1)::text || to_regclass($2)::text`, tables[0], tables[0]+"_invoices").Scan(&left))
	require.False(t, left.Valid, "the run dropped its tables")
}
