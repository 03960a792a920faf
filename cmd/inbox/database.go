package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// dialects maps -dialect to the dialect, the database/sql driver, and a
// check of the DSN's syntax (pgx reports a bad one only when it connects).
var dialects = map[string]struct {
	dialect  sqlinbox.Dialect
	driver   string
	parseDSN func(dsn string) error
}{
	"postgresql": {sqlinbox.PostgreSQL, "pgx", func(dsn string) error { _, err := pgconn.ParseConfig(dsn); return err }},
	"mysql":      {sqlinbox.MySQL, "mysql", func(dsn string) error { _, err := mysql.ParseDSN(dsn); return err }},
	"sqlite":     {sqlinbox.SQLite, "sqlite", func(string) error { return nil }},
}

var partitionings = map[string]sqlinbox.Partitioning{
	"none":    sqlinbox.NoPartitioning,
	"daily":   sqlinbox.Daily,
	"monthly": sqlinbox.Monthly,
}

var partitionKeys = map[string]sqlinbox.PartitionKey{
	"processed_at": sqlinbox.ProcessedAt,
	"event_time":   sqlinbox.EventIDTime,
}

// connectTimeout bounds connecting: a server that does not answer (a
// firewall dropping packets) must not hang a deployment pipeline.
const connectTimeout = 15 * time.Second

// database holds the flags every subcommand reads to reach the inbox
// table, registered on each subcommand's flag set by addDatabaseFlags.
type database struct {
	dsn, dialect, table, partitioning, partitionKey, shardKeyColumn string
	uuidEventIDs, fingerprints                                      bool
}

func addDatabaseFlags(fs *flag.FlagSet) *database {
	d := &database{}
	fs.StringVar(&d.dsn, "dsn", "", fmt.Sprintf("database connection string (required); a SQLite file or DSN waits %s for the write lock unless it sets busy_timeout", sqlinbox.DefaultSQLiteBusyTimeout))
	fs.StringVar(&d.dialect, "dialect", "postgresql", "postgresql, mysql or sqlite")
	fs.StringVar(&d.table, "table", sqlinbox.DefaultTable, "inbox table, optionally schema.table")
	fs.StringVar(&d.partitioning, "partitioning", "none", "the table's layout on PostgreSQL: none, daily or monthly (as created)")
	fs.StringVar(&d.partitionKey, "partition-key", "processed_at", "the time a partitioned table is split by: processed_at, or event_time, the time inside event ids (sqlinbox.EventIDTime)")
	fs.BoolVar(&d.uuidEventIDs, "uuid-event-ids", false, "the table stores UUID event ids (sqlinbox.Config.UUIDEventIDs)")
	fs.BoolVar(&d.fingerprints, "fingerprints", false, "the table has the fingerprint column (sqlinbox.Config.Fingerprints)")
	fs.StringVar(&d.shardKeyColumn, "shard-key-column", "", "the table's shard key column on MySQL sharded by Vitess (sqlinbox.Config.ShardKeyColumn)")
	return d
}

// config validates the flags and returns the store's configuration and
// the database/sql driver.
func (d *database) config() (sqlinbox.Config, string, error) {
	dl, ok := dialects[d.dialect]
	if !ok {
		return sqlinbox.Config{}, "", usage("-dialect %q: use postgresql, mysql or sqlite", d.dialect)
	}
	part, ok := partitionings[d.partitioning]
	if !ok {
		return sqlinbox.Config{}, "", usage("-partitioning %q: use none, daily or monthly", d.partitioning)
	}
	key, ok := partitionKeys[d.partitionKey]
	if !ok {
		return sqlinbox.Config{}, "", usage("-partition-key %q: use processed_at or event_time", d.partitionKey)
	}
	return sqlinbox.Config{
		Dialect:      dl.dialect,
		Table:        d.table,
		Partitioning: part,
		PartitionKey: key,
		UUIDEventIDs: d.uuidEventIDs,
		Fingerprints: d.fingerprints,
		// Checked by sqlinbox.New.
		ShardKeyColumn: d.shardKeyColumn,
	}, dl.driver, nil
}

// store validates the flags and returns the store, without connecting.
// The DSN may be empty when nothing connects (inbox schema printing DDL).
func (d *database) store() (*sqlinbox.Store, *sql.DB, error) {
	config, driver, err := d.config()
	if err != nil {
		return nil, nil, err
	}
	dsn := d.dsn
	if dsn != "" {
		if config.Dialect == sqlinbox.SQLite {
			dsn = sqliteBusyTimeout(dsn)
		}
		if err := dialects[d.dialect].parseDSN(dsn); err != nil {
			return nil, nil, usage("-dsn is not a %s connection string (is -dialect right?): %v", d.dialect, err)
		}
	}
	db, err := open(driver, dsn)
	if err != nil {
		return nil, nil, usage("-dsn: %v", err)
	}
	if err := d.checkFlags(db); err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	store, err := sqlinbox.New(db, config)
	if err != nil {
		_ = db.Close()
		return nil, nil, usage("%v", err)
	}
	return store, db, nil
}

// open opens the database. On PostgreSQL, unless the DSN chooses pgx's
// default_query_exec_mode itself, it uses exec: each statement in one
// round trip without a named prepared statement, which works both directly
// and behind a transaction-pooling proxy (PgBouncer pool_mode=transaction
// before 1.21), where pgx's default statement cache fails with SQLSTATE
// 26000 or 42P05. The command runs few statements: preparing them gains
// nothing.
func open(driver, dsn string) (*sql.DB, error) {
	if driver != "pgx" || dsn == "" || strings.Contains(dsn, "default_query_exec_mode") {
		return sql.Open(driver, dsn)
	}
	config, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	config.DefaultQueryExecMode = pgx.QueryExecModeExec
	return stdlib.OpenDB(*config), nil
}

// connect returns the store on a database that answers. A SQLite file must
// exist unless create is set: opening a mistyped path would otherwise
// create an empty database there.
func (d *database) connect(ctx context.Context, create bool) (*sqlinbox.Store, *sql.DB, error) {
	if d.dsn == "" {
		return nil, nil, usage("-dsn is required")
	}
	store, db, err := d.store()
	if err != nil {
		return nil, nil, err
	}
	if d.dialect == "sqlite" && !create {
		if err := sqliteExists(d.dsn); err != nil {
			_ = db.Close()
			return nil, nil, &exitError{exitConnect, err}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, nil, &exitError{exitConnect, fmt.Errorf("cannot connect to the %s database: %w; check -dsn, and that the server answers", d.dialect, err)}
	}
	return store, db, nil
}

// connectTable connects, and fails, saying what to do, when the table
// does not exist or is laid out otherwise than the flags say.
func (d *database) connectTable(ctx context.Context) (*sqlinbox.Store, *sql.DB, error) {
	store, db, err := d.connect(ctx, false)
	if err != nil {
		return nil, nil, err
	}
	c, err := store.Maintenance().Check(ctx, 0)
	if err == nil && !c.Exists {
		err = fmt.Errorf("%s does not exist in this database: %s", store.Table(), createIt)
	}
	if err == nil {
		err = d.layoutError(store.Table(), c.Findings)
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return store, db, nil
}

// explain adds to a database error what to do about it.
func explain(err error, table, needs string) error {
	if errors.Is(err, maintenance.ErrReadOnly) {
		return fmt.Errorf("%w\nthe user needs %s on %s, and the database must not be read-only (a replica, SQLite's mode=ro): connect as a user that may write", err, needs, table)
	}
	return err
}
