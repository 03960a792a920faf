package sqlinbox_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("postgres", "postgres://unused")
	require.NoError(t, err)
	defer db.Close()

	_, err = sqlinbox.New(nil, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.ErrorContains(t, err, "db is nil")
	_, err = sqlinbox.New(db, sqlinbox.Config{})
	require.ErrorContains(t, err, "Dialect")
	_, err = sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: `inbox"; DROP TABLE users; --`})
	require.ErrorContains(t, err, "Table")
	_, err = sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, ClaimTimeout: -time.Second})
	require.ErrorContains(t, err, "ClaimTimeout")

	s, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err, "New must not touch the database")
	require.Equal(t, sqlinbox.DefaultTable, s.Table())
	require.Contains(t, s.SchemaSQL(), `CREATE TABLE IF NOT EXISTS "watermill_inbox"`)
}
