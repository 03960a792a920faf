// Package stream runs a stream of events with duplicates from an in-process
// Kafka broker (kfake) through consumer groups of routers behind the inbox,
// on any driver, into a table of effects without a unique key (a doubled
// effect is a second row), and reads the verdict from the database. The
// failover, crash and outage tests share it.
package stream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Drivers names every way a Target reaches a database: PostgreSQL through
// lib/pq, pgx's database/sql driver and native pgx, MySQL/MariaDB through
// go-sql-driver/mysql, SQLite through modernc.
var Drivers = []string{"lib-pq", "pgx-stdlib", "pgx", "mysql", "sqlite"}

// Target is one driver's connection to a database behind the inbox: a
// store on the inbox table and the effect table beside it.
type Target struct {
	Driver  string
	DSN     string
	DB      *sql.DB // database/sql, on the same database: setup and checks
	Pool    *pgxpool.Pool
	Store   inboxdriver.Store
	Inbox   string // table names
	Effects string

	dialect sqlinbox.Dialect
	schema  func(context.Context) error
}

// Tables names an inbox table and an effect table, unique to one test.
type Tables struct{ Inbox, Effects string }

// NewTables returns fresh table names; Open's caller creates them with
// Target.CreateTables.
func NewTables() Tables {
	return Tables{Inbox: testdb.Name("inbox"), Effects: testdb.Name("effects")}
}

// Open connects driver to dsn with at most maxConns connections and builds
// the store on tables. The pools are closed when the test ends.
func Open(t testing.TB, driver, dsn string, tables Tables, maxConns int) *Target {
	t.Helper()
	tg, err := Connect(context.Background(), driver, dsn, tables, maxConns)
	require.NoError(t, err)
	t.Cleanup(tg.Close)
	return tg
}

// Connect is Open for programs: the caller closes the target.
func Connect(ctx context.Context, driver, dsn string, tables Tables, maxConns int) (*Target, error) {
	tg := &Target{Driver: driver, DSN: dsn, Inbox: tables.Inbox, Effects: tables.Effects}
	config := sqlinbox.Config{Table: tables.Inbox}
	sqlDriver := map[string]string{"lib-pq": "postgres", "pgx-stdlib": "pgx", "pgx": "pgx", "mysql": "mysql", "sqlite": "sqlite"}[driver]
	if sqlDriver == "" {
		return nil, fmt.Errorf("unknown driver %q (known: %v)", driver, Drivers)
	}
	switch driver {
	case "mysql":
		tg.dialect = sqlinbox.MySQL
	case "sqlite":
		tg.dialect = sqlinbox.SQLite
	default:
		tg.dialect = sqlinbox.PostgreSQL
	}
	var err error
	if tg.DB, err = sql.Open(sqlDriver, dsn); err != nil {
		return nil, err
	}
	tg.DB.SetMaxOpenConns(maxConns)
	tg.DB.SetMaxIdleConns(maxConns)
	config.Dialect = tg.dialect
	if driver == "pgx" {
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			tg.Close()
			return nil, err
		}
		pc.MaxConns = int32(maxConns)
		if tg.Pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			tg.Close()
			return nil, err
		}
		s, err := pgxinbox.NewStore(tg.Pool, config)
		if err != nil {
			tg.Close()
			return nil, err
		}
		tg.Store, tg.schema = s, s.CreateSchema
		return tg, nil
	}
	s, err := sqlinbox.New(tg.DB, config)
	if err != nil {
		tg.Close()
		return nil, err
	}
	tg.Store, tg.schema = s, s.CreateSchema
	return tg, nil
}

// Close closes the target's pools.
func (tg *Target) Close() {
	if tg.Pool != nil {
		tg.Pool.Close()
	}
	if tg.DB != nil {
		_ = tg.DB.Close()
	}
}

// Dialect is the target's database.
func (tg *Target) Dialect() sqlinbox.Dialect { return tg.dialect }

// CreateTables creates the inbox table and the effect table.
func (tg *Target) CreateTables(t testing.TB) {
	t.Helper()
	require.NoError(t, tg.Create(context.Background()))
}

// Create is CreateTables for programs.
func (tg *Target) Create(ctx context.Context) error {
	if err := tg.schema(ctx); err != nil {
		return err
	}
	ddl := `CREATE TABLE %s (id bigserial PRIMARY KEY, event_id text NOT NULL)`
	switch tg.dialect {
	case sqlinbox.MySQL:
		ddl = `CREATE TABLE %s (id bigint AUTO_INCREMENT PRIMARY KEY, event_id varchar(64) NOT NULL)`
	case sqlinbox.SQLite:
		ddl = `CREATE TABLE %s (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL)`
	}
	_, err := tg.DB.ExecContext(ctx, fmt.Sprintf(ddl, tg.Effects))
	return err
}

// Drop drops the target's tables: the effect table, the inbox table and
// the store's consumer registry beside it.
func (tg *Target) Drop(ctx context.Context) error {
	var errs []error
	for _, table := range []string{tg.Effects, tg.Inbox, tg.Inbox + "_consumers"} {
		if _, err := tg.DB.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WriteEffect writes the effect of event id in the inbox transaction of
// ctx, the handler's context.
func (tg *Target) WriteEffect(ctx context.Context, id string) error {
	if tg.Pool != nil {
		tx, ok := pgxinbox.TxFromContext(ctx)
		if !ok {
			return errors.New("no inbox transaction")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+tg.Effects+` (event_id) VALUES ($1)`, id)
		return err
	}
	tx, ok := inbox.TxFromContext(ctx)
	if !ok {
		return errors.New("no inbox transaction")
	}
	q := `INSERT INTO ` + tg.Effects + ` (event_id) VALUES ($1)`
	if tg.dialect != sqlinbox.PostgreSQL {
		q = `INSERT INTO ` + tg.Effects + ` (event_id) VALUES (?)`
	}
	_, err := tx.ExecContext(ctx, q, id)
	return err
}
