package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// forgetBatch is how many event ids one statement, and one transaction of
// Forget, carries. On a table partitioned by processed_at each id holds an
// advisory lock until the transaction ends, and PostgreSQL's lock table is
// shared and sized by max_locks_per_transaction (64 per connection by
// default).
const forgetBatch = 500

// Claims implements [maintenance.Store].
func (m maintainer) Claims(ctx context.Context, f maintenance.ClaimFilter) ([]maintenance.Claim, error) {
	const doing = "listing the claims of"
	q, err := m.queries()
	if err != nil {
		return nil, err
	}
	var out []maintenance.Claim
	if len(f.EventIDs) == 0 {
		rows, err := m.s.db.QueryContext(ctx, q.claimsBetween, f.Consumer, q.timeArg(f.From), q.timeArg(f.To))
		if err != nil {
			return nil, m.fail(doing, err)
		}
		if out, err = scanClaims(rows, nil); err != nil {
			return nil, m.fail(doing, err)
		}
	}
	for ids := range slices.Chunk(f.EventIDs, forgetBatch) {
		args, err := m.lookupArgs(f.Consumer, ids)
		if err != nil {
			return nil, m.fail(doing, err)
		}
		rows, err := m.s.db.QueryContext(ctx, q.claimsOf(len(ids)), args...)
		if err != nil {
			return nil, m.fail(doing, err)
		}
		claims, err := scanClaims(rows, nil)
		if err != nil {
			return nil, m.fail(doing, err)
		}
		out = append(out, claims...)
	}
	sortClaims(out)
	return out, nil
}

// Forget implements [maintenance.Store], forgetBatch ids per transaction. A
// claim's lock differs per database, and Forget takes it the same way:
//
//   - PostgreSQL, plain table: the key's index entry. A DELETE does not see
//     a claim in flight (its row is not committed), so each pair is first
//     inserted as a claim does: that waits for the claim in flight, and a
//     claim arriving later waits for Forget, then finds no row.
//   - PostgreSQL, partitioned by processed_at: the advisory lock on the
//     event's key, which every claim takes first.
//   - PostgreSQL, partitioned by [EventIDTime]: as a plain table, each pair
//     inserted with its id's time, into the partition its claim goes to.
//   - MySQL/MariaDB: the rows' locks, through SELECT ... FOR UPDATE under
//     REPEATABLE READ, whose gap locks also hold back claims of ids that
//     have no row.
//   - SQLite: the database's one write lock.
func (m maintainer) Forget(ctx context.Context, consumer string, eventIDs []string) ([]maintenance.Claim, error) {
	q, err := m.queries()
	if err != nil {
		return nil, err
	}
	if err := m.checkLayout(ctx); err != nil {
		return nil, err
	}
	// One order for every transaction that locks several events, so two
	// of them never wait for each other.
	ids := slices.Compact(slices.Sorted(slices.Values(eventIDs)))
	var removed []maintenance.Claim
	for batch := range slices.Chunk(ids, forgetBatch) {
		claims, err := m.forget(ctx, q, consumer, batch)
		removed = append(removed, claims...)
		if err != nil {
			sortClaims(removed)
			return removed, m.fail("forgetting claims in", err)
		}
	}
	sortClaims(removed)
	return removed, nil
}

func (m maintainer) forget(ctx context.Context, q maintenanceQueries, consumer string, ids []string) ([]maintenance.Claim, error) {
	n := len(ids)
	args, err := m.lookupArgs(consumer, ids)
	if err != nil {
		return nil, err
	}
	tx, err := m.s.db.BeginTx(ctx, &sql.TxOptions{Isolation: q.forgetIsolation})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if q.forgetSetup != "" {
		if _, err := tx.ExecContext(ctx, q.forgetSetup); err != nil {
			return nil, err
		}
	}
	if q.forgetLock != nil {
		var locked int64
		if err := tx.QueryRowContext(ctx, q.forgetLock(n), args...).Scan(&locked); err != nil {
			return nil, err
		}
	}
	var placeholders map[string]bool
	if q.forgetProbe != nil {
		rows, err := tx.QueryContext(ctx, q.forgetProbe(n), args...)
		if err != nil {
			return nil, err
		}
		if placeholders, err = scanIDs(rows); err != nil {
			return nil, err
		}
	}
	var claims []maintenance.Claim
	if q.forgetLockRows != nil {
		rows, err := tx.QueryContext(ctx, q.forgetLockRows(n), args...)
		if err != nil {
			return nil, err
		}
		if claims, err = scanClaims(rows, nil); err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, q.forgetDelete(n), args...)
		if err != nil {
			return nil, err
		}
		if deleted, err := res.RowsAffected(); err != nil || deleted != int64(len(claims)) {
			return nil, fmt.Errorf("deleted %d rows where %d were locked (%v); rolled back", deleted, len(claims), err)
		}
	} else {
		rows, err := tx.QueryContext(ctx, q.forgetDelete(n), args...)
		if err != nil {
			return nil, err
		}
		if claims, err = scanClaims(rows, placeholders); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return claims, nil
}

// lookupArgs are the parameters of the statements that look up a
// consumer's claims of ids: the consumer, the ids, and on a table
// partitioned by [EventIDTime] each id's time after them, as the claim
// computes it, so that PostgreSQL reads only the ids' partitions.
func (m maintainer) lookupArgs(consumer string, ids []string) ([]any, error) {
	args := claimArgs(consumer, ids)
	if !m.s.q.idTime {
		return args, nil
	}
	for _, id := range ids {
		at, err := m.s.eventIDTime(id)
		if err != nil {
			return nil, err
		}
		args = append(args, at)
	}
	return args, nil
}

func claimArgs(consumer string, ids []string) []any {
	args := make([]any, 0, len(ids)+1)
	args = append(args, consumer)
	for _, id := range ids {
		args = append(args, id)
	}
	return args
}

// scanClaims reads rows of (event id, processed_at), leaving out the event
// ids in skip.
func scanClaims(rows *sql.Rows, skip map[string]bool) ([]maintenance.Claim, error) {
	defer rows.Close()
	var out []maintenance.Claim
	for rows.Next() {
		var id, at string
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		if skip[id] {
			continue
		}
		t, err := parseTime(at)
		if err != nil {
			return nil, err
		}
		out = append(out, maintenance.Claim{EventID: id, ProcessedAt: t})
	}
	return out, rows.Err()
}

func scanIDs(rows *sql.Rows) (map[string]bool, error) {
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out[id] = true
	}
	return out, rows.Err()
}

// sortClaims orders claims by processed_at, then event id.
func sortClaims(c []maintenance.Claim) {
	slices.SortFunc(c, func(a, b maintenance.Claim) int {
		if n := a.ProcessedAt.Compare(b.ProcessedAt); n != 0 {
			return n
		}
		return strings.Compare(a.EventID, b.EventID)
	})
}
