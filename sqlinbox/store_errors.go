package sqlinbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// IsUnavailable implements [inboxdriver.UnavailableDetector]: err is the
// database or the connection to it going away, by its SQLSTATE or error
// number, so that the middleware reports a handler statement failing that
// way as transient (nothing committed; retry) rather than as the handler's
// own failure.
func (s *Store) IsUnavailable(err error) bool {
	if code := pgCode(err); code != "" {
		switch code {
		case "57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now: starting up, or in recovery
			"53300": // too_many_connections
			return true
		}
		return strings.HasPrefix(code, "08") // connection_exception
	}
	if number, ok := mysqlErrorNumber(err); ok {
		switch number {
		case 1040, // too many connections
			1053,       // server shutdown in progress
			1927,       // connection was killed
			2002, 2003, // cannot connect
			2006, // server has gone away
			2013: // lost connection during query
			return true
		}
	}
	return false
}

// IsCancelled implements [inboxdriver.DBProber]: err is the database
// cancelling a statement at its client's request or by a timeout the
// session set (PostgreSQL 57014 query_canceled, MySQL 1317
// ER_QUERY_INTERRUPTED, 3024 max_execution_time, MariaDB 1969
// max_statement_time). lib/pq reports a statement its context cancelled so,
// not with the context's error.
func (s *Store) IsCancelled(err error) bool {
	if number, ok := mysqlErrorNumber(err); ok {
		return number == 1317 || number == 3024 || number == 1969
	}
	return pgCode(err) == "57014"
}

// IsConflict reports whether err is the database aborting the transaction
// because a concurrent transaction conflicted with it, so that running the
// message again is the whole remedy: on MySQL and MariaDB error 1213
// (ER_LOCK_DEADLOCK, also what a Galera cluster returns when another node
// committed a conflicting write set first), on PostgreSQL SQLSTATE 40001
// (serialization_failure) and 40P01 (deadlock_detected). The database has
// rolled back the whole transaction in every one of these cases.
//
// On a multi-primary cluster such an error on a handler's own statement or
// at COMMIT, after the claim succeeded, usually means a copy of the event
// committed its claim on another node first; the engine asks this method so
// that it can say so rather than report a handler failure. Errors are
// recognised by error number or SQLSTATE, wherever [errors.As] finds them,
// never by message text.
//
// A lock wait timeout (MySQL 1205, PostgreSQL 55P03) is not a conflict: it
// rolls back only the statement, and on a handler's statement it means a
// lock held too long, not a lost race (on the claim it already wraps
// [inbox.ErrInFlight]). SQLite never reports one: the claim takes the
// database's write lock, so a handler's statements cannot conflict.
func (s *Store) IsConflict(err error) bool { return s.dialect.conflict(err) }

// dialectErr wraps err, returned by the database for the store's SQL, with
// the dialect mismatch it shows, if any: the check in [New] lets wrapped
// drivers through, the database's own errors do not.
func (s *Store) dialectErr(err error) error {
	found := answeredAs(err)
	if found == nil || found == s.dialect {
		return err
	}
	return fmt.Errorf("Dialect is %s but the database answered as %s, set Config.Dialect to sqlinbox.%s: %w", s.dialect, found, dialectName(found), err)
}

// maintenanceErr wraps err for a maintenance operation on the table,
// marking refused writes with [maintenance.ErrReadOnly].
func (s *Store) maintenanceErr(doing string, err error) error {
	if md, ok := s.dialect.(maintenanceDialect); ok && md.readOnly(err) {
		return fmt.Errorf("sqlinbox: %s %s: %w: %w", doing, s.table, maintenance.ErrReadOnly, err)
	}
	return fmt.Errorf("sqlinbox: %s %s: %w", doing, s.table, s.dialect.classify(err))
}

// leaseErr says what kept a lease from being renewed: a lock or the
// database out of reach (the middleware tries again soon), the lease table
// missing or out of the role's privileges (which only a migration or a
// grant mends).
func (s *Store) leaseErr(err error) error {
	table := s.LeaseTable()
	switch {
	case missingTable(err):
		return fmt.Errorf("sqlinbox: the lease table %s does not exist: run Store.CreateSchema as a role that may create it, or apply Store.SchemaSQL: %w: %w", table, inboxdriver.ErrNoLease, err)
	case s.readOnly(err):
		return fmt.Errorf("sqlinbox: the role may not write the lease table %s: grant it SELECT, INSERT, UPDATE, DELETE there: %w: %w", table, inboxdriver.ErrNoLease, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sqlinbox: the lease in %s was not renewed within its timeout (the table locked, or the database slow): %w", table, err)
	case s.unreachable(err):
		return fmt.Errorf("sqlinbox: the database is unreachable, so the lease in %s was not renewed: %w", table, err)
	}
	return fmt.Errorf("sqlinbox: renewing a lease in %s: %w", table, s.dialectErr(s.dialect.classify(err)))
}

// missingTable reports whether err says a table does not exist.
func missingTable(err error) bool {
	if pgCode(err) == "42P01" { // undefined_table
		return true
	}
	if number, ok := mysqlErrorNumber(err); ok {
		return number == mysqlNoSuchTable
	}
	// SQLite has one code (SQLITE_ERROR) for every statement it refuses.
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// readOnly reports whether err is the database refusing the role a write.
func (s *Store) readOnly(err error) bool {
	md, ok := s.dialect.(maintenanceDialect)
	return ok && md.readOnly(err)
}

// unreachable reports whether err is the database or the way to it gone.
func (s *Store) unreachable(err error) bool {
	var ne net.Error
	return s.IsUnavailable(err) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ne)
}
