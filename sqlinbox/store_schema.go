package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// SchemaLockTimeout is the longest [Store.CreateSchema] waits for a table lock
// on PostgreSQL. Claims queue behind DDL waiting for a lock, so this is also
// the longest a claim waits behind CreateSchema, as at every rolling deploy.
const SchemaLockTimeout = time.Second

// ErrLockTimeout is wrapped by the error of DDL that did not get its table
// lock within its lock timeout and gave up, changing nothing:
// [Store.CreateSchema] adding the index of an existing table
// ([SchemaLockTimeout]), or the purge dropping a partition
// ([purge.Config.LockTimeout]). A long transaction holds the table; retry when
// it is gone. It is not [inbox.ErrInFlight], which is a claim's.
//
// [purge.Config.LockTimeout]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge#Config.LockTimeout
// [inbox.ErrInFlight]: https://pkg.go.dev/github.com/watermill-inbox/inbox#ErrInFlight
var ErrLockTimeout = maintenance.ErrLockTimeout

// SchemaSQL returns the DDL [Store.CreateSchema] runs, as one script, for
// migration tools. Every statement is idempotent. It ends with the lease
// table ([Store.LeaseTable]).
//
// CreateSchema leaves an existing table as it is: to turn [Config.Fingerprints]
// on for a table made without it, run [Store.AddFingerprintColumnSQL] once.
func (s *Store) SchemaSQL() string {
	return strings.Join(s.q.schema, ";\n\n") + ";\n"
}

// SchemaStatements returns the statements of [Store.SchemaSQL] one by one,
// without their final semicolons, for a migration tool that takes statements
// rather than a script. A tool that splits a file at semicolons must be told
// where a statement ends: on a partitioned table the last one is a DO block
// with semicolons of its own (goose: between -- +goose StatementBegin and --
// +goose StatementEnd, as inbox schema -format goose prints it).
func (s *Store) SchemaStatements() []string { return slices.Clone(s.q.schema) }

// AddFingerprintColumnSQL returns the statement that adds the fingerprint
// column ([Config.Fingerprints]) to an inbox table created without it, for a
// migration tool. It adds a nullable column in place, without rewriting the
// table on PostgreSQL and MariaDB:
//
//	ALTER TABLE watermill_inbox ADD COLUMN IF NOT EXISTS fingerprint bytea  -- PostgreSQL
//	ALTER TABLE watermill_inbox ADD COLUMN fingerprint VARBINARY(64) NULL   -- MySQL/MariaDB
//	ALTER TABLE watermill_inbox ADD COLUMN fingerprint BLOB                 -- SQLite
//
// Only PostgreSQL's form may run twice.
func (s *Store) AddFingerprintColumnSQL() string { return s.q.addFingerprint + ";\n" }

// CreateSchema creates the inbox table, its index and the lease table
// ([Store.LeaseTable]) if they do not exist, and on a partitioned table the
// partitions of the current period and the [SchemaPartitionsAhead] next ones.
// It is safe to call on every start, from several instances at once, while
// others claim and purge.
//
// On PostgreSQL it runs only the DDL of what is missing, and no statement
// waits longer than [SchemaLockTimeout] for a table lock, so claims never
// queue behind it for longer: a partition it cannot create in time, or
// whose period's rows already went to the default partition, is left to
// the purge and logged through [Config.Logger]; the index of an existing
// table that lacks it fails with an error wrapping [ErrLockTimeout].
func (s *Store) CreateSchema(ctx context.Context) error {
	if s.q.schemaObjects != nil {
		return s.createSchemaPostgres(ctx)
	}
	if !s.q.schemaInTx {
		for i, stmt := range s.q.schema {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				if i == len(s.q.schema)-1 && s.leaseNotCreated(err) {
					return nil
				}
				return fmt.Errorf("sqlinbox: creating schema for %s: %w", s.table, s.dialectErr(err))
			}
		}
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlinbox: creating schema for %s: %w", s.table, s.dialectErr(err))
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	for _, stmt := range s.q.schema {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("sqlinbox: creating schema for %s: %w", s.table, s.dialectErr(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlinbox: creating schema for %s: %w", s.table, s.dialectErr(err))
	}
	return nil
}

// createSchemaPostgres is [Store.CreateSchema] on PostgreSQL: the statements of
// what is missing in one transaction, then the partitions one by one.
func (s *Store) createSchemaPostgres(ctx context.Context) error {
	if err := s.createMissing(ctx); err != nil {
		return fmt.Errorf("sqlinbox: creating schema for %s: %w", s.table, s.dialectErr(err))
	}
	if s.config.Partitioning == NoPartitioning {
		return nil
	}
	parts, err := makePartitions(ctx, s.db, s.table, s.config, SchemaPartitionsAhead, SchemaLockTimeout)
	for _, part := range parts.Blocked {
		s.config.Logger.Info("Inbox partition not created: rows of its period are already in the default partition (the purge deletes them there)", watermill.LogFields{"table": s.table.String(), "partition": part.Name})
	}
	for _, part := range parts.TimedOut {
		s.config.Logger.Info("Inbox partition not created: the table lock was not granted within sqlinbox.SchemaLockTimeout; the purge creates it, and claims go to the default partition meanwhile", watermill.LogFields{"table": s.table.String(), "partition": part.Name, "lock_timeout": SchemaLockTimeout.String()})
	}
	if err != nil {
		return fmt.Errorf("sqlinbox: creating schema for %s: %w", s.table, err)
	}
	return nil
}

// createMissing runs, in one transaction holding the schema lock, the
// statements of the schema whose relation does not exist. Even CREATE
// INDEX IF NOT EXISTS takes its table lock before it finds the index
// there, and a DEFAULT partition's index locks that partition before the
// parent, the reverse of a partition's DDL, which deadlocked against the
// purge: statements with nothing to create are not sent at all.
func (s *Store) createMissing(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	// Other instances' CreateSchema hold the lock briefly: each of their
	// statements waits at most [SchemaLockTimeout], so this wait has no
	// timeout of its own.
	if _, err := tx.ExecContext(ctx, pgSchemaLock(s.table)); err != nil {
		return err
	}
	if err := pgSetLockTimeout(ctx, tx, SchemaLockTimeout); err != nil {
		return err
	}
	probes := make([]string, len(s.q.schemaObjects))
	var args []any
	exists := make([]any, len(s.q.schemaObjects))
	for i, obj := range s.q.schemaObjects {
		exists[i] = new(bool)
		if obj == partitionsStep { // made by makePartitions instead
			probes[i] = "true"
			continue
		}
		args = append(args, obj.quoted('"'))
		probes[i] = fmt.Sprintf("to_regclass($%d) IS NOT NULL", len(args))
	}
	if err := tx.QueryRowContext(ctx, "SELECT "+strings.Join(probes, ", "), args...).Scan(exists...); err != nil {
		return err
	}
	for i, stmt := range s.q.schema {
		if *exists[i].(*bool) {
			continue
		}
		if i == len(s.q.schema)-1 { // the lease table's
			return s.createLeaseTablePostgres(ctx, tx, stmt)
		}
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return pgDDLErr(err)
		}
	}
	return tx.Commit()
}

// createLeaseTablePostgres creates the lease table last in tx, and commits:
// a role that may not create it (PostgreSQL 15's default for a role that
// does not own the schema, upgrading a schema made before the lease table)
// still gets the rest.
func (s *Store) createLeaseTablePostgres(ctx context.Context, tx *sql.Tx, stmt string) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT inbox_leases"); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		if !s.leaseNotCreated(err) {
			return pgDDLErr(err)
		}
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT inbox_leases"); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// leaseNotCreated reports whether err is the role refused the lease
// table's creation, and if so says so: the middleware then runs without
// the shared consumer check, and inbox check fails until the table exists.
func (s *Store) leaseNotCreated(err error) bool {
	if !s.readOnly(err) {
		return false
	}
	s.config.Logger.Info("Inbox: warning: the lease table could not be created (no privilege), so the shared consumer check is off; create it as the schema's owner", watermill.LogFields{
		"table": s.LeaseTable(), "ddl": s.q.leases.create, "reason": err.Error(),
	})
	return true
}
