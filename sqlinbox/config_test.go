package sqlinbox_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
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
	_, err = sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, TransactionPooling: true})
	require.ErrorContains(t, err, "TransactionPooling is for PostgreSQL")

	s, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err, "New must not touch the database")
	require.Equal(t, sqlinbox.DefaultTable, s.Table())
	require.Contains(t, s.SchemaSQL(), `CREATE TABLE IF NOT EXISTS "watermill_inbox"`)
}

// An id refused in UUID mode is quoted as the middleware quotes ids: Go
// syntax, cut after 64 bytes, the dots outside the quotes.
func TestCheckEventIDQuotesLikeTheMiddleware(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("postgres", "postgres://unused")
	require.NoError(t, err)
	defer db.Close()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, UUIDEventIDs: true})
	require.NoError(t, err)
	for _, id := range []string{strings.Repeat("x", inbox.MaxEventIDLength+1), "nul\x00" + strings.Repeat("é", 40)} {
		_, err := store.CheckEventID(id)
		require.ErrorIs(t, err, inbox.ErrInvalidEventID)
		middleware := inboxdriver.ValidateEventID(id).Error()
		quoted := middleware[strings.LastIndex(middleware, ": ")+2:]
		require.Contains(t, err.Error(), ": "+quoted+" is not a UUID")
	}
}
