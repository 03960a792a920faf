package sqlinbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// PostgreSQL is the dialect for PostgreSQL 12 and later, through lib/pq or
// pgx's stdlib.
var PostgreSQL Dialect = postgresql{}

type postgresql struct{}

func (postgresql) String() string { return "postgresql" }

func (postgresql) queries(t tableName, c Config) queries {
	table := t.quoted('"')
	idType := "text"
	if c.UUIDEventIDs {
		idType = "uuid"
	}
	// With fingerprints the claim inserts a third column.
	cols, fpCol, fpVal := "consumer, event_id", "", ""
	if c.Fingerprints {
		cols, fpCol, fpVal = "consumer, event_id, fingerprint", "\n\tfingerprint  bytea,", ", $3::bytea"
	}
	// On a partitioned table min() reads each partition's index.
	oldest := fmt.Sprintf(`SELECT %s FROM %s`, pgUTC("min(processed_at)"), table)
	if c.Partitioning != NoPartitioning && c.PartitionKey == EventIDTime {
		return idTimeQueries(t, c, idType, fpCol)
	}
	if c.Partitioning != NoPartitioning {
		q := partitionedQueries(t, c, idType, cols, fpCol, fpVal)
		q.addFingerprint = fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS fingerprint bytea`, table)
		q.oldest = oldest
		return q
	}
	q := queries{
		schema: []string{
			pgCreateTable(table, idType, fpCol, "consumer, event_id", ""),
			// The purge deletes by age; without this index each batch would
			// scan the table.
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)`, quoteName(t.derived("processed_at_idx").name, '"'), table),
		},
		schemaObjects: []tableName{t, t.derived("processed_at_idx")},
	}
	q.claim, q.afterClaim = pgInsertClaim(c.ClaimTimeout, table, cols, "$1::text, $2::"+idType+fpVal)
	if c.Fingerprints {
		q.fingerprint = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = $1 AND event_id = $2`, table)
	}
	// A nullable column without a default: a catalog change, no rewrite.
	q.addFingerprint = fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS fingerprint bytea`, table)
	q.oldest = oldest
	q.verify = verifyLayout(t, c)
	return q
}

func (postgresql) claimTimeoutLimit() (time.Duration, string) {
	return pgMaxTimeout, "PostgreSQL's lock_timeout"
}

func (postgresql) conflict(err error) bool {
	switch pgCode(err) {
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return true
	}
	return false
}

func (postgresql) classify(err error) error {
	switch pgCode(err) {
	case "55P03": // lock_not_available: lock_timeout expired
		return fmt.Errorf("%w: %w", inboxdriver.ErrInFlight, err)
	case "42P01": // undefined_table
		return fmt.Errorf("inbox table does not exist, run Store.CreateSchema or apply Store.SchemaSQL: %w", err)
	case "26000", "42P05": // a prepared statement missing, or there already
		return fmt.Errorf("%w: %w", errPooler, err)
	}
	return err
}

// errPooler explains a prepared statement PostgreSQL lost between two
// statements of one client connection.
var errPooler = errors.New("a transaction-pooling proxy switched server connections between two statements: set sqlinbox.Config.TransactionPooling and the DSN's setting (docs/poolers.md)")
