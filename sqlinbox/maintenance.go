package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// maintainer implements [maintenance.Store] with the store's dialect.
type maintainer struct{ s *Store }

var _ maintenance.Store = maintainer{}

func (m maintainer) Table() string     { return m.s.table.String() }
func (m maintainer) Dialect() string   { return m.s.dialect.String() }
func (m maintainer) Partitioned() bool { return m.s.config.Partitioning != NoPartitioning }

func (m maintainer) Limits() maintenance.Limits {
	if pd, ok := m.s.dialect.(purgeDialect); ok {
		return pd.purgeLimits()
	}
	return maintenance.Limits{}
}

func (m maintainer) BeginPurge(ctx context.Context) (maintenance.PurgeSession, *maintenance.Busy, error) {
	sess, busy, err := m.s.beginPurge(ctx)
	if sess == nil {
		// Not sess: a nil *purgeSession in the interface is not nil.
		return nil, busy, err
	}
	return sess, nil, nil
}

func (m maintainer) ClaimSQL() maintenance.ClaimSQL {
	s := m.s
	var verify func(ctx context.Context) error
	if s.q.verify != nil {
		verify = func(ctx context.Context) error { return s.q.verify(ctx, s.db, s.q) }
	}
	return maintenance.ClaimSQL{
		Before:          s.q.beforeClaim,
		CheckBefore:     s.q.checkBeforeClaim,
		Insert:          s.q.claim,
		Args:            s.claimArgs,
		OnlyIDs:         s.onlyIDs(),
		Claimed:         s.claimed,
		After:           s.q.afterClaim,
		Fingerprint:     s.q.fingerprint,
		Classify:        s.dialect.classify,
		Verify:          verify,
		TxWrites:        s.txWritesSQL(),
		TxWritesGranted: s.txWritesGrantedSQL(),
		Batch:           s.batchSQL(),
	}
}

// DownSQL implements [maintenance.Store].
func (m maintainer) DownSQL() (dropTable, dropFingerprint string) {
	q, err := m.queries()
	if err != nil {
		return "", ""
	}
	// The lease table goes with the table: its leases are on the table's
	// consumers, and an Up after this Down creates both again.
	return q.dropTable + ";\n" + m.s.q.leases.drop, q.dropFingerprint
}

// maintenanceDialect is what a dialect offers the maintenance seam besides
// the purge: statistics, checks, and forgetting claims.
type maintenanceDialect interface {
	maintenanceQueries(t tableName, c Config) maintenanceQueries
	// readOnly reports whether err is the database refusing a write
	// (privileges, a read-only database or connection).
	readOnly(err error) bool
}

// maintenanceQueries holds the SQL text of the maintenance seam's
// operations. Times come back as UTC RFC 3339 text, event ids as text, so
// that results do not depend on the driver or its settings (MySQL's
// parseTime).
type maintenanceQueries struct {
	// now returns the database clock.
	now string
	// consumerStats returns, per consumer: the consumer, its rows, the
	// oldest and newest processed_at, and its rows of the last hour and of
	// the last day by the database clock; on a table partitioned by event
	// time, then the oldest and newest event_time.
	consumerStats string
	// sizes returns the bytes of the table (all its partitions) and of its
	// indexes, NULL when unknown.
	sizes string
	// partitions returns, for a partitioned table, each partition's name,
	// estimated rows (negative: unknown) and whether it is the default
	// partition; "" where tables are not partitioned.
	partitions string
	// consumers returns the distinct consumers.
	consumers string

	// claimsOf returns event_id and processed_at of a consumer's claims of
	// n event ids; parameters: the consumer, then the ids, then on a table
	// partitioned by [EventIDTime] each id's time (lookupArgs).
	claimsOf func(n int) string
	// claimsBetween returns the same for from <= processed_at < to;
	// parameters: the consumer, timeArg(from), timeArg(to).
	claimsBetween string
	timeArg       func(time.Time) any

	// Forget runs these in one transaction, in this order, each with the
	// parameters of claimsOf: lock takes the claim's lock on each event
	// (when set); probe inserts each pair as a claim does, which waits for
	// a claim of it in flight, and returns the event ids it inserted
	// itself, which delete removes again (when set); lockRows returns and
	// locks the rows delete removes, for a database whose DELETE cannot
	// return them (when set); delete removes the claims and, unless
	// lockRows is set, returns them as claimsOf does.
	forgetLock, forgetProbe, forgetLockRows, forgetDelete func(n int) string
	// forgetSetup runs first in each of Forget's transactions (when set).
	forgetSetup string
	// forgetIsolation is the isolation level of Forget's transactions.
	forgetIsolation sql.IsolationLevel

	// kind returns "p" for a partitioned table, followed by its partition
	// key on PostgreSQL ("p RANGE (processed_at)"), another value for a
	// plain one, no row when it does not exist; "" where tables are not
	// partitioned: columns then tells whether the table exists.
	kind string
	// columns returns each column's name and type, spelled as in
	// wantColumns; a PostgreSQL domain is its base type.
	columns string
	// primaryKey returns the primary key's columns in key order.
	primaryKey string
	// indexLeads returns the first column of each index.
	indexLeads string
	// wantColumns are the columns the configuration needs, with their
	// types; fingerprint is wanted only with [Config.Fingerprints].
	wantColumns map[string]string
	// timeDefault reads processed_at's default, where one can write a
	// local time (local_times.go); nil elsewhere.
	timeDefault *localDefault

	// dropTable and dropFingerprint undo the schema and the fingerprint
	// column, for a migration tool's down step.
	dropTable, dropFingerprint string
}

// placeholders renders n placeholders from the first-th on, separated by
// commas; ph renders one by its 1-based position.
func placeholders(ph func(i int) string, first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ph(first + i))
	}
	return b.String()
}

func (m maintainer) queries() (maintenanceQueries, error) {
	md, ok := m.s.dialect.(maintenanceDialect)
	if !ok {
		return maintenanceQueries{}, fmt.Errorf("sqlinbox: the %s dialect has no maintenance operations", m.s.dialect)
	}
	return md.maintenanceQueries(m.s.table, m.s.config), nil
}

func (m maintainer) fail(doing string, err error) error { return m.s.maintenanceErr(doing, err) }

// checkLayout refuses a PostgreSQL table partitioned otherwise than the
// configuration says, as the claim and the purge do.
func (m maintainer) checkLayout(ctx context.Context) error {
	if m.s.dialect != PostgreSQL {
		return nil
	}
	return checkLayout(ctx, m.s.db, m.s.table, m.s.config)
}

// parseTime reads a time the queries return as UTC RFC 3339 text.
func parseTime(text string) (time.Time, error) {
	at, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading a time from the database: %w", err)
	}
	return at.UTC(), nil
}

func (m maintainer) dbNow(ctx context.Context, q maintenanceQueries) (time.Time, error) {
	var text string
	if err := m.s.db.QueryRowContext(ctx, q.now).Scan(&text); err != nil {
		return time.Time{}, err
	}
	return parseTime(text)
}
