// Package bench is the workload shared by cmd/inbox-bench and the go test
// benchmarks: the same business write (Write) with and without the inbox,
// on every driver, with round trips counted on the wire, optionally behind
// a simulated network round trip (Latency).
package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Consumer is the consumer name every benchmark claims under.
const Consumer = "bench"

// Driver opens one way of reaching a database.
type Driver struct {
	// Name is "dialect/driver", as printed.
	Name string
	// Open connects with at most maxConns connections, counting round trips
	// on rt.
	Open func(ctx context.Context, dsn string, maxConns int, rt *RoundTrips) (Conn, error)
	// Pipelined drivers send BEGIN with the claim: the inbox adds no round
	// trip to a new message.
	Pipelined bool
	// Embedded databases have no network, hence no round trips.
	Embedded bool

	db *database
}

// Dialect returns the driver's database: postgresql, mysql or sqlite.
func (d Driver) Dialect() string { return d.db.dialect.String() }

// Conn is an open pool of one driver.
type Conn interface {
	// Bare handles a message without the inbox: its business write w in a
	// transaction of its own, as a handler would.
	Bare(w Write) message.HandlerFunc
	// Inbox returns the handler behind the inbox middleware on the inbox
	// table of c (its Table, UUIDEventIDs and Partitioning; the dialect is
	// the driver's): the same business write, in the inbox transaction.
	Inbox(c sqlinbox.Config, w Write) (message.HandlerFunc, error)
	Close() error
}

// Drivers lists every driver the benchmark knows, by name.
var Drivers = []Driver{
	{Name: "postgresql/lib-pq", Open: openLibPQ, db: postgresDB},
	{Name: "postgresql/pgx-stdlib", Open: openPgxStdlib, db: postgresDB},
	{Name: "postgresql/pgx", Open: openPgx, Pipelined: true, db: postgresDB},
	{Name: "mysql/go-sql-driver", Open: openMySQL, db: mysqlDB},
	{Name: "sqlite/modernc", Open: openSQLite, Embedded: true, db: sqliteDB},
}

// FindDrivers returns the drivers named in the comma-separated list ("all"
// for every one).
func FindDrivers(list string) ([]Driver, error) {
	if list == "all" {
		return Drivers, nil
	}
	var out []Driver
	for _, name := range strings.Split(list, ",") {
		found := false
		for _, d := range Drivers {
			if d.Name == name || d.Name[strings.IndexByte(d.Name, '/')+1:] == name || d.Dialect() == name {
				out = append(out, d)
				found = true
			}
		}
		if !found {
			names := make([]string, len(Drivers))
			for i, d := range Drivers {
				names[i] = d.Name
			}
			sort.Strings(names)
			return nil, fmt.Errorf("unknown driver %q (known: %s)", name, strings.Join(names, ", "))
		}
	}
	return out, nil
}

func openLibPQ(_ context.Context, dsn string, maxConns int, rt *RoundTrips) (Conn, error) {
	c, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	c.Dialer(rt)
	return newSQLConn(sql.OpenDB(c), postgresDB, maxConns), nil
}

func openPgxStdlib(_ context.Context, dsn string, maxConns int, rt *RoundTrips) (Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = rt.DialContext
	return newSQLConn(stdlib.OpenDB(*cfg), postgresDB, maxConns), nil
}

func openMySQL(_ context.Context, dsn string, maxConns int, rt *RoundTrips) (Conn, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = rt.DialContext
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return newSQLConn(sql.OpenDB(c), mysqlDB, maxConns), nil
}

func openSQLite(_ context.Context, dsn string, maxConns int, _ *RoundTrips) (Conn, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	return newSQLConn(db, sqliteDB, maxConns), nil
}

// sqlConn is a database/sql pool.
type sqlConn struct {
	db *sql.DB
	d  *database
}

func newSQLConn(db *sql.DB, d *database, maxConns int) *sqlConn {
	// database/sql keeps 2 idle connections by default: every worker beyond
	// that would reconnect per message.
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return &sqlConn{db: db, d: d}
}

// sqlExec runs statements in a database/sql transaction.
func sqlExec(tx *sql.Tx) func(ctx context.Context, query string, args ...any) error {
	return func(ctx context.Context, query string, args ...any) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
}

func (c *sqlConn) Bare(w Write) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		if err := w.exec(ctx, msg.UUID, sqlExec(tx)); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		return nil, tx.Commit()
	}
}

func (c *sqlConn) Inbox(sc sqlinbox.Config, w Write) (message.HandlerFunc, error) {
	sc.Dialect = c.d.dialect
	store, err := sqlinbox.New(c.db, sc)
	if err != nil {
		return nil, err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: Consumer})
	if err != nil {
		return nil, err
	}
	return mw(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, _ := inbox.TxFromContext(ctx)
		return nil, w.exec(ctx, msg.UUID, sqlExec(tx))
	}), nil
}

func (c *sqlConn) Close() error { return c.db.Close() }

// Name returns a fresh table name starting with prefix.
func Name(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

func openPgx(ctx context.Context, dsn string, maxConns int, rt *RoundTrips) (Conn, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.DialFunc = rt.DialContext
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &pgxConn{pool: pool}, nil
}

// pgxConn is a native pgx pool.
type pgxConn struct{ pool *pgxpool.Pool }

// pgxExec runs statements in a pgx transaction, one round trip each, as
// through database/sql.
func pgxExec(tx pgx.Tx) func(ctx context.Context, query string, args ...any) error {
	return func(ctx context.Context, query string, args ...any) error {
		_, err := tx.Exec(ctx, query, args...)
		return err
	}
}

func (c *pgxConn) Bare(w Write) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := w.exec(ctx, msg.UUID, pgxExec(tx)); err != nil {
			_ = tx.Rollback(ctx)
			return nil, err
		}
		return nil, tx.Commit(ctx)
	}
}

func (c *pgxConn) Inbox(sc sqlinbox.Config, w Write) (message.HandlerFunc, error) {
	store, err := pgxinbox.NewStore(c.pool, sc)
	if err != nil {
		return nil, err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: Consumer})
	if err != nil {
		return nil, err
	}
	return mw(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, _ := pgxinbox.TxFromContext(ctx)
		return nil, w.exec(ctx, msg.UUID, pgxExec(tx))
	}), nil
}

func (c *pgxConn) Close() error {
	c.pool.Close()
	return nil
}
