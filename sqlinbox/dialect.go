package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"
)

// Dialect is the SQL flavour of a database: [PostgreSQL], [MySQL] or [SQLite].
// Its methods are unexported; the dialects this package offers are the only
// ones.
type Dialect interface {
	fmt.Stringer

	// queries builds every statement once, when the [Store] is created.
	queries(t tableName, c Config) queries
	// classify turns a driver error into one the middleware understands
	// (lock and busy timeouts wrap [inbox.ErrInFlight]); others pass through.
	//
	// [inbox.ErrInFlight]: https://pkg.go.dev/github.com/watermill-inbox/inbox#ErrInFlight
	classify(err error) error
	// conflict reports whether err aborted the transaction for a
	// concurrent one ([Store.IsConflict]).
	conflict(err error) bool
	// claimTimeoutLimit is the longest [Config.ClaimTimeout] the database's
	// setting takes, and that setting; 0 where ClaimTimeout is refused
	// anyway.
	claimTimeoutLimit() (time.Duration, string)
	// leases builds the statements of the table's leases.
	leases(t tableName) leaseQueries
}

// queries holds a store's SQL text, built once. Differences between dialects
// live here as data rather than as branches in [Store].
type queries struct {
	// schema is the DDL, run in order by [Store.CreateSchema].
	schema []string
	// schemaInTx runs schema inside one transaction.
	schemaInTx bool
	// schemaObjects, when set, names the relation each statement of schema
	// creates, and [Store.CreateSchema] runs only the statements whose
	// relation is missing, in one transaction that first takes the schema
	// lock, under a lock timeout (PostgreSQL: even CREATE INDEX IF NOT
	// EXISTS first takes a lock that waits for every transaction writing to
	// the table, and claims queue behind that wait). partitionsStep marks
	// the DO block creating the coming time partitions: CreateSchema makes
	// them one by one instead, each under a lock timeout, as the purge
	// does.
	schemaObjects []tableName
	// claim inserts (consumer, event_id) and affects one row when the pair is
	// new, zero when it already exists; it must never fail on a conflict.
	claim string
	// idTime makes the time inside the event id the claim's third
	// parameter (and the fingerprint read's), before the fingerprint: the
	// partition key of a table partitioned by [EventIDTime].
	idTime bool
	// fingerprint reads the fingerprint stored with (consumer, event_id),
	// for a duplicate under [Config.Fingerprints]. claim then takes the
	// fingerprint as its third parameter.
	fingerprint string
	// addFingerprint adds the fingerprint column to an existing table.
	addFingerprint string
	// oldest returns min(processed_at), read from the index, as UTC text
	// in RFC 3339 form, or NULL for an empty table.
	oldest string
	// afterClaim runs after a new claim, before the handler ("" for none).
	afterClaim string
	// beforeClaim, when set, runs in the claim's transaction before claim,
	// as a statement of its own, with the consumer and the event id as
	// parameters (partitioned PostgreSQL: the lock on the event's key). It
	// returns one text value, which checkBeforeClaim judges. Empty keeps
	// the claim at one statement.
	beforeClaim      string
	checkBeforeClaim func(result string) error
	// verify checks, once per [Store] before the first claim, that the
	// connection settings let claim report affected rows exactly.
	verify func(ctx context.Context, db *sql.DB, q queries) error
	// vitess, when set, is set by verify once it finds Vitess's vtgate
	// in front of MySQL (see vitess.go).
	vitess *atomic.Bool
	// configErr, when set, is why the dialect cannot honour the [Config];
	// [New] returns it.
	configErr error
	// leases is the lease table's SQL; its table ends schema.
	leases leaseQueries
	// batch is the multi-row claim (batch.go); its insert is nil for a
	// dialect that cannot claim in batches.
	batch batchQueries
}
