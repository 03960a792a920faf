package sqlinbox

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// SQLite is the dialect for SQLite 3.35 and later through modernc.org/sqlite
// (driver name "sqlite", pure Go).
//
// SQLite has one writer at a time: a claim takes the database's write lock
// and keeps it until the handler's transaction ends, so handlers run one
// after another, and a second router on the same file waits for the lock.
// Open the database with [SQLiteDSN], or with the same three settings:
//
//   - _pragma=busy_timeout(ms): wait this long for the write lock instead of
//     failing at once. When it expires the claim fails with an error wrapping
//     [inboxdriver.ErrInFlight], the message is nacked and retried; nothing was
//     written. It is SQLite's claim timeout ([Config.ClaimTimeout] is refused).
//   - _pragma=journal_mode(WAL): readers do not block the writer, so COMMIT
//     never waits for them.
//   - _txlock=immediate: BEGIN takes the write lock, so the wait happens
//     there, under busy_timeout, rather than as a lock upgrade later in the
//     transaction, which SQLite fails at once.
//
// Use a file, even in tests (a temporary directory): an in-memory database
// exists once per connection, so the pool's other connections would not see
// the inbox table.
var SQLite Dialect = sqlite{}

type sqlite struct{}

func (sqlite) String() string { return "sqlite" }

// DefaultSQLiteBusyTimeout is the write-lock wait [SQLiteDSN] sets.
const DefaultSQLiteBusyTimeout = 5 * time.Second

// SQLiteDSN returns a modernc.org/sqlite data source name for the database
// file at path with the settings the inbox needs under concurrency: a busy
// timeout of [DefaultSQLiteBusyTimeout], WAL journal and transactions that
// take the write lock at BEGIN.
//
//	db, err := sql.Open("sqlite", sqlinbox.SQLiteDSN("app.db"))
func SQLiteDSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", DefaultSQLiteBusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

func (sqlite) queries(t tableName, c Config) queries {
	table := t.quoted('"')
	cols, fpCol, fpVal := "consumer, event_id", "", ""
	if c.Fingerprints {
		cols, fpCol, fpVal = "consumer, event_id, fingerprint", "\n\tfingerprint  BLOB,", ", ?"
	}
	q := queries{
		// SQLite DDL is transactional: both statements or neither, and
		// concurrent calls take turns on the write lock.
		schemaInTx: true,
		schema: []string{
			// TEXT compares with the BINARY collation: byte for byte,
			// trailing spaces included. In UUID mode ids are text too, in
			// the canonical lowercase form CheckEventID returns.
			//
			// processed_at is the database clock in UTC as ISO 8601 text
			// with milliseconds ("2006-01-02T15:04:05.000Z"): it sorts as it
			// compares, so a purge compares it with
			// strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-N seconds').
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer     TEXT NOT NULL CHECK (length(CAST(consumer AS BLOB)) BETWEEN 1 AND 255),
	event_id     TEXT NOT NULL,
	processed_at TEXT NOT NULL DEFAULT (strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now')),%s
	PRIMARY KEY (consumer, event_id)
) WITHOUT ROWID`, table, fpCol),
			// The purge deletes by age; without this index each batch would
			// scan the table.
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)`, t.derived("processed_at_idx").quoted('"'), table),
		},
		// ON CONFLICT DO NOTHING never fails on the key: the change count
		// says new (1) or duplicate (0). processed_at is written in the
		// one form the purge compares, whatever the column's default
		// (CURRENT_TIMESTAMP writes "2026-12-01 10:26:00").
		claim: fmt.Sprintf(`INSERT INTO %s (%s, processed_at) VALUES (?, ?%s, strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now')) ON CONFLICT DO NOTHING`, table, cols, fpVal),
	}
	if c.Fingerprints {
		q.fingerprint = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = ? AND event_id = ?`, table)
	}
	q.addFingerprint = fmt.Sprintf(`ALTER TABLE %s ADD COLUMN fingerprint BLOB`, table)
	q.oldest = fmt.Sprintf(`SELECT min(processed_at) FROM %s`, table)
	if c.ClaimTimeout > 0 {
		q.configErr = errors.New("ClaimTimeout is not supported on SQLite: the write lock is the whole database's, so bound the wait with the DSN's busy_timeout pragma instead (see sqlinbox.SQLiteDSN)")
	}
	return q
}

// SQLite result codes; extended codes carry the primary code in the low byte.
const (
	sqliteBusy   = 5 // SQLITE_BUSY: another connection holds the lock
	sqliteLocked = 6 // SQLITE_LOCKED: a conflict inside a shared cache
)

// sqliteCoder is implemented by modernc.org/sqlite's [*sqlite.Error], so
// errors are recognised by result code without importing the driver (and
// its C-to-Go translated library) into every program that uses sqlinbox.
//
// [*sqlite.Error]: https://pkg.go.dev/modernc.org/sqlite#Error
type sqliteCoder interface{ Code() int }

func (sqlite) claimTimeoutLimit() (time.Duration, string) { return 0, "" }

// conflict is always false: the claim holds the write lock, so nothing
// conflicts with the transaction once it succeeded.
func (sqlite) conflict(error) bool { return false }

func (sqlite) classify(err error) error {
	if sqliteBusyErr(err) {
		// The busy timeout expired before this transaction got the write
		// lock, so it wrote nothing: retry later.
		return fmt.Errorf("%w: %w", inboxdriver.ErrInFlight, err)
	}
	return err
}

// sqliteBusyErr reports whether err is SQLite giving up on a lock after the
// busy timeout.
func sqliteBusyErr(err error) bool {
	var e sqliteCoder
	if !errors.As(err, &e) {
		return false
	}
	code := e.Code() & 0xff
	return code == sqliteBusy || code == sqliteLocked
}
