package sqlinbox

import "context"

// MySQLErrorNumber exposes mysqlErrorNumber to the tests that reach a real
// server, which live in package sqlinbox_test (they import internal/testdb,
// which imports sqlinbox).
var MySQLErrorNumber = mysqlErrorNumber

// ExplainClaims returns PostgreSQL's EXPLAIN (ANALYZE, FORMAT JSON) of the
// statement s.Maintenance().Claims runs for consumer's claims of ids.
func ExplainClaims(ctx context.Context, s *Store, consumer string, ids []string) (string, error) {
	q, args, err := lookup(s, consumer, ids)
	if err != nil {
		return "", err
	}
	var plan string
	err = s.db.QueryRowContext(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q.claimsOf(len(ids)), args...).Scan(&plan)
	return plan, err
}

// ExplainForget returns the same of the DELETE s.Maintenance().Forget runs
// for ids, in a transaction it rolls back.
func ExplainForget(ctx context.Context, s *Store, consumer string, ids []string) (string, error) {
	q, args, err := lookup(s, consumer, ids)
	if err != nil {
		return "", err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // the plan is all it wants
	if q.forgetSetup != "" {
		if _, err := tx.ExecContext(ctx, q.forgetSetup); err != nil {
			return "", err
		}
	}
	var plan string
	err = tx.QueryRowContext(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q.forgetDelete(len(ids)), args...).Scan(&plan)
	return plan, err
}

func lookup(s *Store, consumer string, ids []string) (maintenanceQueries, []any, error) {
	m := maintainer{s}
	q, err := m.queries()
	if err != nil {
		return q, nil, err
	}
	args, err := m.lookupArgs(consumer, ids)
	return q, args, err
}
