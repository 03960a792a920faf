package sqlinbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// TestConformance runs the middleware's whole behaviour against every
// dialect and driver.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, target := range []conformancetest.Target{
		postgresTarget("PostgreSQL/lib-pq", "postgres"),
		postgresTarget("PostgreSQL/pgx-stdlib", "pgx"),
		partitioned(postgresTarget("PostgreSQL/daily-partitions", "pgx"), sqlinbox.Daily),
		eventIDTime(postgresTarget("PostgreSQL/event-time-partitions", "postgres")),
		pooled(postgresTarget("PostgreSQL/pgbouncer/lib-pq", "postgres"), "postgres"),
		pooled(partitioned(postgresTarget("PostgreSQL/pgbouncer/pgx-stdlib/daily-partitions", "pgx"), sqlinbox.Daily), "pgx"),
		{
			Name:             "MySQL/go-sql-driver",
			Dialect:          sqlinbox.MySQL,
			Open:             testdb.MySQL,
			Placeholder:      conformancetest.Question,
			ClaimTimeout:     true,
			ClaimTimeoutUnit: time.Second,
			TextColumn:       "VARBINARY(255)",
		},
		{
			Name:        "SQLite/modernc",
			Dialect:     sqlinbox.SQLite,
			Open:        testdb.SQLite,
			Placeholder: conformancetest.Question,
			ProcessedAt: func(t time.Time) any { return t.UTC().Format("2006-01-02T15:04:05.000Z") },
		},
	} {
		t.Run(target.Name, func(t *testing.T) {
			t.Parallel()
			conformancetest.Run(t, target)
		})
	}
}

func postgresTarget(name, driver string) conformancetest.Target {
	return conformancetest.Target{
		Name:                    name,
		Dialect:                 sqlinbox.PostgreSQL,
		Open:                    func(t testing.TB) *sql.DB { return testdb.Postgres(t, driver) },
		Placeholder:             conformancetest.Dollar,
		FailedStatementAbortsTx: true,
		ClaimTimeout:            true,
	}
}

// pooled reaches the target's PostgreSQL through PgBouncer in transaction
// pooling mode with driver, and the DSN settings and the Config
// docs/poolers.md give.
func pooled(target conformancetest.Target, driver string) conformancetest.Target {
	target.Open = func(t testing.TB) *sql.DB { return testdb.PgBouncer(t, driver) }
	target.TransactionPooling = true
	return target
}

func partitioned(target conformancetest.Target, mode sqlinbox.Partitioning) conformancetest.Target {
	target.Partitioning = mode
	return target
}

func eventIDTime(target conformancetest.Target) conformancetest.Target {
	target.Partitioning, target.EventIDTime = sqlinbox.Daily, true
	return target
}

// claim claims (consumer, eventID) through store as the middleware does
// and returns the claim's transaction, nil for a duplicate.
func claim(ctx context.Context, store inboxdriver.Store, opts *sql.TxOptions, consumer, eventID string) (*claimed, bool, error) {
	tx, _, err := store.Claim(ctx, inboxdriver.Claim{TxOptions: opts, Consumer: consumer, EventID: eventID})
	if tx == nil {
		return nil, false, err
	}
	return &claimed{Tx: tx.Handle().(*sql.Tx), claim: tx}, true, err
}

// claimed is a claim's *sql.Tx that ends through the store's transaction,
// which gives the claim's place in the pool back.
type claimed struct {
	*sql.Tx
	claim inboxdriver.Tx
}

func (c *claimed) Commit() error   { return c.claim.Commit(context.Background()) }
func (c *claimed) Rollback() error { return c.claim.Rollback(context.Background()) }
