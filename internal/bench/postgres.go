package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx" for the admin pool

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Postgres sets up and inspects the benchmark's tables on an uncounted
// connection, so that setup never shows up in the round trips measured.
type Postgres struct{ db *sql.DB }

// OpenPostgres connects the admin pool.
func OpenPostgres(ctx context.Context, dsn string) (*Postgres, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("no PostgreSQL answers at %s: %w", dsn, err)
	}
	return &Postgres{db: db}, nil
}

// Close closes the admin pool.
func (p *Postgres) Close() error { return p.db.Close() }

// CreateEffects creates the business table: the smallest write a handler
// can make, one row in a table without indexes.
func (p *Postgres) CreateEffects(ctx context.Context, table string) error {
	_, err := p.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (event_id text NOT NULL)`)
	return err
}

// CreateInbox creates an inbox table through the library, as users do.
func (p *Postgres) CreateInbox(ctx context.Context, table string) error {
	s, err := sqlinbox.New(p.db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	if err != nil {
		return err
	}
	return s.CreateSchema(ctx)
}

// Truncate empties tables.
func (p *Postgres) Truncate(ctx context.Context, tables ...string) error {
	_, err := p.db.ExecContext(ctx, `TRUNCATE `+strings.Join(tables, ", "))
	return err
}

// Drop drops tables if they exist.
func (p *Postgres) Drop(ctx context.Context, tables ...string) error {
	_, err := p.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+strings.Join(tables, ", "))
	return err
}

// Prefill makes sure inbox table holds the claims of events 1..n for
// Consumer (ids from PrefilledID), inserting what is missing in chunks of a
// million rows, then vacuums the table as a long-lived one would be. An
// existing table is reused, so the expensive fill happens once.
func (p *Postgres) Prefill(ctx context.Context, table string, n int64, progress func(done int64)) error {
	if err := p.CreateInbox(ctx, table); err != nil {
		return err
	}
	const chunk = 1_000_000
	filled := false
	for lo := int64(1); lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		var done bool
		err := p.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE consumer = $1 AND event_id = $2)`,
			Consumer, PrefilledID(hi)).Scan(&done)
		if err != nil {
			return err
		}
		if !done {
			_, err = p.db.ExecContext(ctx, `INSERT INTO `+table+` (consumer, event_id)
SELECT $1, md5(i::text)::uuid::text FROM generate_series($2::bigint, $3::bigint) i ON CONFLICT DO NOTHING`, Consumer, lo, hi)
			if err != nil {
				return err
			}
			filled = true
		}
		if progress != nil {
			progress(hi)
		}
	}
	if filled {
		if _, err := p.db.ExecContext(ctx, `VACUUM ANALYZE `+table); err != nil {
			return err
		}
	}
	return nil
}

// WALPosition returns the server's current WAL insert position in bytes.
// The difference between two positions is the WAL written in between, by
// every session on the server.
func (p *Postgres) WALPosition(ctx context.Context) (int64, error) {
	var lsn int64
	err := p.db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&lsn)
	return lsn, err
}
