package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
)

// txWritesDialect is what a dialect offers to count the rows a
// transaction wrote, for [inboxdriver.TxWriteCounter].
type txWritesDialect interface {
	// txWrites returns rows whose last columns, added up, count the rows
	// the current transaction (MySQL, SQLite: connection) has written, the
	// claim's included; NULL or no row when the database cannot tell.
	txWrites() string
}

// PostgreSQL keeps each table's row counts of the current transaction in
// the backend's statistics until it ends; track_counts off leaves them at
// zero, which the middleware takes for "cannot tell" (the claim's own row
// is missing). The sum also holds the counts of the backend's earlier
// transactions that it has not yet flushed to the shared statistics (it
// flushes between transactions, at most once a second), so only the
// difference of two readings within one transaction means anything. A scan
// of the catalog, run once per consumer.
func (postgresql) txWrites() string {
	return `SELECT COALESCE(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_xact_user_tables`
}

// The session's handler counters count the rows its statements wrote;
// the transaction holds the session's connection. No privilege needed,
// unlike information_schema.innodb_trx, whose cache also refreshes only
// every 100 ms. SHOW, because MariaDB and MySQL 8 keep the counters in
// different tables.
func (mysqlDialect) txWrites() string {
	return `SHOW SESSION STATUS WHERE Variable_name IN ('Handler_write', 'Handler_update', 'Handler_delete')`
}

// total_changes counts the rows the connection changed since it opened;
// the transaction holds the connection, so the difference is its own.
func (sqlite) txWrites() string { return `SELECT total_changes()` }

// sumLastColumn adds up the last column of query's rows, integers; ok is
// false when there is no row or a NULL.
func sumLastColumn(ctx context.Context, tx *sql.Tx, query string) (sum int64, ok bool, err error) {
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, false, err
	}
	dest := make([]any, len(cols))
	for i := range dest {
		dest[i] = new(sql.RawBytes)
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return 0, false, err
		}
		last := *dest[len(dest)-1].(*sql.RawBytes)
		if last == nil {
			return 0, false, rows.Err()
		}
		n, err := strconv.ParseInt(string(last), 10, 64)
		if err != nil {
			return 0, false, err
		}
		sum, ok = sum+n, true
	}
	return sum, ok, rows.Err()
}

// txWritesGrantDialect is a dialect whose txWrites needs a privilege the
// session may lack.
type txWritesGrantDialect interface {
	// txWritesGranted returns one boolean: whether txWrites may run. It
	// cannot fail for lack of a privilege itself.
	txWritesGranted() string
}

// On PostgreSQL a failed statement aborts the transaction, the claim and
// the handler's writes with it: a hardened server that revokes SELECT on
// pg_stat_xact_user_tables must make the count say "cannot tell", never
// fail. has_table_privilege needs no privilege. (Not a savepoint around
// the count: under PgBouncer it made the count miss the publisher's rows
// now and then, a false publisher_outside_tx.)
func (postgresql) txWritesGranted() string {
	return `SELECT has_table_privilege('pg_catalog.pg_stat_xact_user_tables', 'SELECT')`
}

// errTxWritesDenied is the count's error when the session may not read
// the statistics it needs.
var errTxWritesDenied = errors.New("SELECT on pg_stat_xact_user_tables is not granted (SQLSTATE 42501)")
