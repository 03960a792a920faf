package sqlinbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// MySQL is the dialect for MySQL 8 and MariaDB 10.11 and later, through
// github.com/go-sql-driver/mysql, which the program imports: sqlinbox
// recognises the driver's errors without linking it.
//
// The DSN must not set clientFoundRows=true: it makes a duplicate report one
// affected row, like a new claim, and the store refuses to claim on such a
// connection. [Config.ClaimTimeout] needs MariaDB (see there); on MySQL 8,
// bound every lock wait of the connection with the DSN parameter
// innodb_lock_wait_timeout=N instead, whose expiry also surfaces as
// [inboxdriver.ErrInFlight].
var MySQL Dialect = mysqlDialect{}

type mysqlDialect struct{}

func (mysqlDialect) String() string { return "mysql" }

// ErrClientFoundRows is returned by the first claim on a MySQL connection
// opened with clientFoundRows=true, where a duplicate cannot be told from a
// new claim.
var ErrClientFoundRows = errors.New("sqlinbox: the MySQL connection reports found rows instead of affected rows (DSN option clientFoundRows=true), so a duplicate looks like a new claim; remove clientFoundRows from the DSN")

// ErrClaimTimeoutUnsupported is returned by the first claim when
// [Config.ClaimTimeout] is set and the database cannot bound a single
// statement's lock wait (MySQL 8, unlike MariaDB).
var ErrClaimTimeoutUnsupported = errors.New("sqlinbox: ClaimTimeout is not supported by this database")

func (mysqlDialect) queries(t tableName, c Config) queries {
	table := t.quoted('`')
	// VARBINARY compares bytes: a case-insensitive or PAD SPACE collation
	// would make "Case" and "case", or "a" and "a ", one event. It also keeps
	// the key independent of the connection's character set.
	idType, idValue := "VARBINARY(255)", "?"
	if c.UUIDEventIDs {
		// CheckEventID hands over the canonical 36-character form.
		idType, idValue = "BINARY(16)", "UNHEX(REPLACE(?, '-', ''))"
	}
	cols, vals, extraCols, key := "consumer, event_id", "?, "+idValue, "", "consumer = ? AND event_id = "+idValue
	if sk := c.ShardKeyColumn; sk != "" {
		// Vitess routes the claim, and the fingerprint read of a
		// duplicate, to the shard of this column's vindex; without it in
		// the WHERE clause that read would scatter to every shard.
		sk = quoteName(sk, '`')
		cols, vals, key = cols+", "+sk, vals+", ?", key+" AND "+sk+" = ?"
		extraCols += fmt.Sprintf("\t%-12s VARBINARY(%d) NOT NULL,\n", sk, MaxShardKeyLength)
	}
	if c.Fingerprints {
		cols, vals = cols+", fingerprint", vals+", ?"
		extraCols += "\tfingerprint  VARBINARY(64) NULL,\n"
	}
	q := queries{
		schema: []string{
			// DDL commits implicitly in MySQL, so there is no transaction to
			// share; CREATE TABLE IF NOT EXISTS with the index inside it is
			// one atomic statement, safe to race (the metadata lock
			// serialises concurrent calls).
			//
			// processed_at is UTC from the database clock, as DATETIME(6):
			// TIMESTAMP would stop in 2038 and DATETIME with NOW() would
			// follow each session's time_zone. Compare it with
			// UTC_TIMESTAMP(6).
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n"+
				"\tconsumer     VARBINARY(255) NOT NULL,\n"+
				"\tevent_id     %s NOT NULL,\n"+
				"\tprocessed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n"+
				"%s"+
				"\tPRIMARY KEY (consumer, event_id),\n"+
				"\tKEY %s (processed_at)\n"+
				") ENGINE=InnoDB",
				table, idType, extraCols, quoteName(t.name+"_processed_at_idx", '`')),
		},
		// Not INSERT IGNORE: it turns every error (truncation, a bad value)
		// into a warning and zero rows, which would ack a message as a
		// duplicate. ON DUPLICATE KEY UPDATE with a no-op assignment fails
		// only on real errors and reports 1 row for an insert, 0 for an
		// unchanged existing row. A copy of the event still inside another
		// transaction makes it wait for that row's lock. The no-op assigns
		// processed_at, which no vschema shards by: Vitess refuses an
		// assignment to a vindex column (consumer, event_id or the shard
		// key), even of the column to itself (VT12001).
		//
		// processed_at is written, not left to the column's default: a
		// DATETIME default of CURRENT_TIMESTAMP, or NOW() anywhere, follows
		// the writer's session time_zone, and the purge, comparing with
		// UTC_TIMESTAMP(6), would delete the rows of a writer east of UTC
		// early.
		claim: fmt.Sprintf("INSERT INTO %s (%s, processed_at) VALUES (%s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE processed_at = processed_at", table, cols, vals),
	}
	if c.Fingerprints {
		q.fingerprint = fmt.Sprintf("SELECT fingerprint FROM %s WHERE %s", table, key)
	}
	// MySQL 8 has no ADD COLUMN IF NOT EXISTS; both add a last nullable
	// column in place (ALGORITHM=INSTANT where the server can).
	q.addFingerprint = fmt.Sprintf("ALTER TABLE %s ADD COLUMN fingerprint VARBINARY(64) NULL", table)
	// Text, so the result does not depend on the DSN's parseTime;
	// processed_at is already UTC.
	q.oldest = fmt.Sprintf("SELECT DATE_FORMAT(MIN(processed_at), '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ') FROM %s", table)
	if c.ClaimTimeout > 0 {
		// innodb_lock_wait_timeout counts whole seconds; round up. MariaDB's
		// SET STATEMENT scopes it to this statement, so the handler's own
		// statements keep the server's setting.
		secs := int64((c.ClaimTimeout + time.Second - 1) / time.Second)
		q.claim = fmt.Sprintf("SET STATEMENT innodb_lock_wait_timeout=%d FOR %s", secs, q.claim)
	}
	q.vitess = new(atomic.Bool)
	q.verify = func(ctx context.Context, db *sql.DB, q queries) error {
		if c.ClaimTimeout > 0 {
			var version string
			if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
				return fmt.Errorf("sqlinbox: checking the server version: %w", err)
			}
			if !strings.Contains(strings.ToLower(version), "mariadb") {
				return fmt.Errorf("%w: server %s cannot scope innodb_lock_wait_timeout to one statement (MariaDB's SET STATEMENT); leave ClaimTimeout at 0 and set innodb_lock_wait_timeout=N in the DSN", ErrClaimTimeoutUnsupported, version)
			}
		}
		vitess, err := checkVitessTransactionMode(ctx, db)
		if err != nil {
			return err
		}
		q.vitess.Store(vitess)
		return verifyAffectedRows(ctx, db, q, c)
	}
	return q
}

// verifyAffectedRows claims one probe key twice in a transaction it rolls
// back: the second claim must report 0 rows. With clientFoundRows=true it
// reports 1 and every duplicate would run the handler again.
func verifyAffectedRows(ctx context.Context, db *sql.DB, q queries, c Config) error {
	// A random id keeps concurrent probes from waiting on each other; the
	// NUL in the consumer keeps the probe apart from every valid consumer.
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	if !c.UUIDEventIDs {
		id = "probe-" + id
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlinbox: checking affected-rows reporting: %w", MySQL.classify(err))
	}
	defer tx.Rollback() //nolint:errcheck // the probe never commits
	args := []any{"\x00sqlinbox-probe", id}
	if c.ShardKeyColumn != "" {
		// A number: every vindex maps one, Vitess's hash only numbers.
		args = append(args, "0")
	}
	if c.Fingerprints {
		args = append(args, nil)
	}
	for i, want := range []int64{1, 0} {
		res, err := tx.ExecContext(ctx, q.claim, args...)
		if err != nil {
			return fmt.Errorf("sqlinbox: checking affected-rows reporting: %w", MySQL.classify(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("sqlinbox: checking affected-rows reporting: %w", err)
		}
		if n != want {
			if i == 1 && n == 1 {
				return ErrClientFoundRows
			}
			return fmt.Errorf("sqlinbox: probe claim %d affected %d rows, want %d", i+1, n, want)
		}
	}
	return nil
}

// MySQL and MariaDB error numbers.
const (
	mysqlLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	mysqlDeadlock        = 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back (Galera: certification failed)
	mysqlNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	mysqlPacketTooLarge  = 1153 // ER_NET_PACKET_TOO_LARGE: max_allowed_packet
	mysqlLockTableFull   = 1206 // ER_LOCK_TABLE_FULL: the buffer pool's locks
)

// mariadbMaxLockWait is the longest innodb_lock_wait_timeout MariaDB takes
// (MySQL 8's is longer, but it cannot scope one to a claim). Beyond it a
// strict sql_mode fails every claim, a lax one cuts it silently.
const mariadbMaxLockWait = 100_000_000 * time.Second

func (mysqlDialect) claimTimeoutLimit() (time.Duration, string) {
	return mariadbMaxLockWait, "MariaDB's innodb_lock_wait_timeout"
}

func (mysqlDialect) conflict(err error) bool {
	number, ok := mysqlErrorNumber(err)
	return ok && number == mysqlDeadlock
}

func (mysqlDialect) classify(err error) error {
	number, ok := mysqlErrorNumber(err)
	if !ok {
		return err
	}
	switch number {
	case mysqlLockWaitTimeout, mysqlDeadlock:
		// A deadlock on the claim, the transaction's first statement, can
		// only involve other claims of the same key range: retrying later
		// is the whole remedy.
		return fmt.Errorf("%w: %w", inboxdriver.ErrInFlight, err)
	case mysqlNoSuchTable:
		return fmt.Errorf("inbox table does not exist, run Store.CreateSchema or apply Store.SchemaSQL: %w", err)
	}
	return err
}
