package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// sqliteBusyTimeout gives a modernc.org/sqlite DSN the busy timeout
// sqlinbox.SQLiteDSN sets, unless it sets one itself. Without one SQLite
// fails a statement at once when another connection holds the write lock,
// and every claim of a running service holds it: each batch would time out
// at once and the round give up within a second.
func sqliteBusyTimeout(dsn string) string {
	_, query, hasQuery := strings.Cut(dsn, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return dsn // the driver reports it
	}
	// The driver's shorthands for the pragma.
	if q.Has("_busy_timeout") || q.Has("_timeout") {
		return dsn
	}
	for _, p := range q["_pragma"] {
		if strings.HasPrefix(strings.ToLower(strings.TrimSpace(p)), "busy_timeout") {
			return dsn
		}
	}
	sep := "?"
	if hasQuery {
		sep = "&"
	}
	pragma := fmt.Sprintf("busy_timeout(%d)", sqlinbox.DefaultSQLiteBusyTimeout.Milliseconds())
	return dsn + sep + url.Values{"_pragma": {pragma}}.Encode()
}

// sqliteExists fails unless the database file of a modernc.org/sqlite DSN
// exists: opening a mistyped path creates an empty database there.
func sqliteExists(dsn string) error {
	path, query, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	if q, err := url.ParseQuery(query); path == "" || path == ":memory:" || (err == nil && q.Get("mode") == "memory") {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("cannot open the SQLite database %s: %w; check -dsn (inbox schema -apply creates a new database)", path, err)
	}
	return nil
}
