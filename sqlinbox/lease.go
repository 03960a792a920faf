package sqlinbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// heartbeatTimeout bounds a heartbeat's statements, once it has its
// connection, when [inboxdriver.Heartbeat.Timeout] does not.
const heartbeatTimeout = 5 * time.Second

// leaseSuffix names the lease table beside the inbox table:
// "watermill_inbox_leases".
const leaseSuffix = "leases"

// leaseQueries is the SQL of an inbox table's leases: one row per consumer,
// service and process, renewed while the process claims for the consumer
// ([inboxdriver.ConsumerRegistry]), so that two services claiming for one
// consumer at once can be told. A renewal only ever updates seen_at and
// warnings, never a key column: a table sharded by consumer (Vitess) takes
// no assignment of its vindex column. Times are compared on the database's
// clock, so that the processes' clocks do not matter.
type leaseQueries struct {
	// create makes the table; [Store.CreateSchema] and [Store.SchemaSQL]
	// end with it.
	create string
	// renew upserts (consumer, service, instance, warnings) as seen now,
	// since now for a new row;
	// others lists the services other than $2 with a lease on consumer $1
	// seen within $3 seconds; expire removes consumer $1's leases not seen
	// for a day.
	renew, others, expire string
	// list reads every lease, with its age in seconds, for the inbox check
	// command.
	list string
	// drop removes the table, for a migration tool's down step.
	drop string
}

func (postgresql) leases(t tableName) leaseQueries {
	table := t.derived(leaseSuffix).quoted('"')
	return leaseQueries{
		create: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
	service  text        NOT NULL CHECK (octet_length(service) BETWEEN 1 AND 255),
	instance text        NOT NULL CHECK (octet_length(instance) BETWEEN 1 AND 255),
	seen_at  timestamptz NOT NULL DEFAULT now(),
	since    timestamptz NOT NULL DEFAULT now(),
	warnings text        NOT NULL DEFAULT '',
	PRIMARY KEY (consumer, service, instance)
)`, table),
		renew: fmt.Sprintf(`INSERT INTO %s (consumer, service, instance, seen_at, since, warnings) VALUES ($1, $2, $3, now(), now(), $4)
ON CONFLICT (consumer, service, instance) DO UPDATE SET seen_at = excluded.seen_at, warnings = excluded.warnings`, table),
		others: fmt.Sprintf(`SELECT DISTINCT service FROM %s WHERE consumer = $1 AND service <> $2 AND seen_at > now() - $3 * interval '1 second' ORDER BY service`, table),
		expire: fmt.Sprintf(`DELETE FROM %s WHERE consumer = $1 AND seen_at < now() - interval '1 day'`, table),
		list:   fmt.Sprintf(`SELECT consumer, service, instance, warnings, extract(epoch FROM now() - seen_at)::float8, extract(epoch FROM seen_at - since)::float8 FROM %s ORDER BY consumer, service, instance`, table),
		drop:   `DROP TABLE IF EXISTS ` + table,
	}
}

func (mysqlDialect) leases(t tableName) leaseQueries {
	table := t.derived(leaseSuffix).quoted('`')
	return leaseQueries{
		// Binary columns, as the inbox's: names compare byte for byte.
		create: fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n"+
			"\tconsumer VARBINARY(255) NOT NULL,\n"+
			"\tservice  VARBINARY(255) NOT NULL,\n"+
			"\tinstance VARBINARY(255) NOT NULL,\n"+
			"\tseen_at  DATETIME(6)    NOT NULL,\n"+
			"\tsince    DATETIME(6)    NOT NULL,\n"+
			"\twarnings VARBINARY(255) NOT NULL DEFAULT '',\n"+
			"\tPRIMARY KEY (consumer, service, instance)\n"+
			") ENGINE=InnoDB", table),
		renew: fmt.Sprintf("INSERT INTO %s (consumer, service, instance, seen_at, since, warnings) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?)\n"+
			"ON DUPLICATE KEY UPDATE seen_at = VALUES(seen_at), warnings = VALUES(warnings)", table),
		others: fmt.Sprintf("SELECT DISTINCT service FROM %s WHERE consumer = ? AND service <> ? AND seen_at > UTC_TIMESTAMP(6) - INTERVAL ? SECOND ORDER BY service", table),
		expire: fmt.Sprintf("DELETE FROM %s WHERE consumer = ? AND seen_at < UTC_TIMESTAMP(6) - INTERVAL 1 DAY", table),
		list:   fmt.Sprintf("SELECT consumer, service, instance, warnings, TIMESTAMPDIFF(MICROSECOND, seen_at, UTC_TIMESTAMP(6)) / 1000000.0, TIMESTAMPDIFF(MICROSECOND, since, seen_at) / 1000000.0 FROM %s ORDER BY consumer, service, instance", table),
		drop:   "DROP TABLE IF EXISTS " + table,
	}
}

func (sqlite) leases(t tableName) leaseQueries {
	table := t.derived(leaseSuffix).quoted('"')
	const now = `strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`
	return leaseQueries{
		create: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer TEXT NOT NULL CHECK (length(CAST(consumer AS BLOB)) BETWEEN 1 AND 255),
	service  TEXT NOT NULL CHECK (length(CAST(service AS BLOB)) BETWEEN 1 AND 255),
	instance TEXT NOT NULL CHECK (length(CAST(instance AS BLOB)) BETWEEN 1 AND 255),
	seen_at  TEXT NOT NULL,
	since    TEXT NOT NULL,
	warnings TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (consumer, service, instance)
) WITHOUT ROWID`, table),
		renew: fmt.Sprintf(`INSERT INTO %s (consumer, service, instance, seen_at, since, warnings) VALUES (?, ?, ?, %s, %s, ?)
ON CONFLICT (consumer, service, instance) DO UPDATE SET seen_at = excluded.seen_at, warnings = excluded.warnings`, table, now, now),
		others: fmt.Sprintf(`SELECT DISTINCT service FROM %s WHERE consumer = ? AND service <> ? AND julianday(seen_at) > julianday('now') - ? / 86400.0 ORDER BY service`, table),
		expire: fmt.Sprintf(`DELETE FROM %s WHERE consumer = ? AND julianday(seen_at) < julianday('now') - 1`, table),
		list:   fmt.Sprintf(`SELECT consumer, service, instance, warnings, (julianday('now') - julianday(seen_at)) * 86400.0, (julianday(seen_at) - julianday(since)) * 86400.0 FROM %s ORDER BY consumer, service, instance`, table),
		drop:   `DROP TABLE IF EXISTS ` + table,
	}
}

// LeaseTable returns the lease table's name: the inbox table's with the
// suffix "_leases", in the same schema. Each process claiming for a
// consumer renews a row there, so that the inbox check command can tell
// two services claiming with one consumer.
func (s *Store) LeaseTable() string { return s.table.derived(leaseSuffix).String() }

// Heartbeat implements [inboxdriver.ConsumerRegistry]: it renews h's lease
// and lists the other services with a live lease on h.Consumer. Statements
// outside any transaction, so that the list sees the leases of services
// that renewed concurrently; h.Timeout bounds them. It takes the
// connection the claims leave free, one heartbeat of the pool at a time, so
// that a heartbeat blocked by a lock on the lease table never holds one a
// claim waits for; on a pool of one, the only connection, waited for behind
// the claims rather than in the pool's queue, where it would be taken for a
// handler waiting for itself ([Store.watchPoolOfOne]), and given up, with
// [inboxdriver.ErrGaveWay], as soon as a claim waits for it.
func (s *Store) Heartbeat(ctx context.Context, h inboxdriver.Heartbeat) ([]string, error) {
	ctx, ticket, err := s.gate.Beside(ctx, s.poolSize)
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: waiting for the connection the claims leave free: %w", err)
	}
	defer ticket.Leave()
	others, err := s.heartbeat(ctx, h)
	if err != nil && errors.Is(context.Cause(ctx), inboxdriver.ErrGaveWay) {
		return nil, fmt.Errorf("sqlinbox: renewing the lease in %s: %w", s.LeaseTable(), inboxdriver.ErrGaveWay)
	}
	return others, err
}

// heartbeat is [Store.Heartbeat] on the connection it waited for.
func (s *Store) heartbeat(ctx context.Context, h inboxdriver.Heartbeat) ([]string, error) {
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = heartbeatTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	q := s.q.leases
	if h.First {
		if _, err := s.db.ExecContext(ctx, q.expire, h.Consumer); err != nil {
			return nil, s.leaseErr(err)
		}
	}
	if _, err := s.db.ExecContext(ctx, q.renew, h.Consumer, h.Service, h.Instance, h.Warnings); err != nil {
		return nil, s.leaseErr(err)
	}
	rows, err := s.db.QueryContext(ctx, q.others, h.Consumer, h.Service, int64(h.Lease/time.Second))
	if err != nil {
		return nil, s.leaseErr(err)
	}
	defer rows.Close()
	var others []string
	for rows.Next() {
		var service string
		if err := rows.Scan(&service); err != nil {
			return nil, s.leaseErr(err)
		}
		others = append(others, service)
	}
	if err := rows.Err(); err != nil {
		return nil, s.leaseErr(err)
	}
	return others, nil
}

// Leases implements [maintenance.Store]. A table made before the lease
// table has none: an error wrapping [maintenance.ErrNoLeaseTable], with the
// statement that creates it.
func (m maintainer) Leases(ctx context.Context) ([]maintenance.Lease, error) {
	s := m.s
	rows, err := s.db.QueryContext(ctx, s.q.leases.list)
	if err != nil {
		// A role not granted the table may not see it in the catalog
		// either: it is not missing.
		if exists, cerr := m.leaseTableExists(ctx); !s.readOnly(err) && cerr == nil && !exists {
			return nil, fmt.Errorf("%w: %s, so the shared consumer check is off; create it as the schema's owner:\n%s;", maintenance.ErrNoLeaseTable, s.LeaseTable(), s.q.leases.create)
		}
		return nil, m.fail("reading the leases", err)
	}
	defer rows.Close()
	var leases []maintenance.Lease
	for rows.Next() {
		var l maintenance.Lease
		var age, claiming float64
		if err := rows.Scan(&l.Consumer, &l.Service, &l.Instance, &l.Warnings, &age, &claiming); err != nil {
			return nil, m.fail("reading the leases", err)
		}
		l.Age = time.Duration(age * float64(time.Second))
		l.Claiming = time.Duration(claiming * float64(time.Second))
		leases = append(leases, l)
	}
	if err := rows.Err(); err != nil {
		return nil, m.fail("reading the leases", err)
	}
	return leases, nil
}

func (m maintainer) leaseTableExists(ctx context.Context) (bool, error) {
	md, ok := m.s.dialect.(maintenanceDialect)
	if !ok {
		return true, nil
	}
	cols, err := columns(ctx, m.s.db, md.maintenanceQueries(m.s.table.derived(leaseSuffix), m.s.config))
	return len(cols) > 0, err
}
