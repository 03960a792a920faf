package purge_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// shortPurger purges rows older than retention, far below the floor.
func shortPurger(t *testing.T, store purge.Store, retention time.Duration) *purge.Purger {
	t.Helper()
	p, err := purge.New(store, purge.Config{Retention: retention, AllowShortRetention: true, BatchPause: time.Millisecond})
	require.NoError(t, err)
	return p
}

// refused asserts that p refuses the table, in a round and a dry run, and
// returns the round's error.
func refused(t *testing.T, p *purge.Purger) error {
	t.Helper()
	n, err := p.PurgeOnce(context.Background())
	require.ErrorIs(t, err, purge.ErrTableMismatch)
	require.Zero(t, n)
	_, dryErr := p.DryRun(context.Background())
	require.ErrorIs(t, dryErr, purge.ErrTableMismatch)
	return err
}

// SQLite compares processed_at as text, which sorts as time only in the
// form the column's default writes. Rows 90 minutes old written by
// SQLite's datetime('now') ("2026-12-01 10:26:00") or as a Go time.Time
// through modernc ("2026-12-01 10:26:00.283983566 +0000 UTC") sorted
// before the 2-hour cutoff, and a purge deleted them. Now the purge
// refuses the table, deleting nothing, with the statement that converts
// what SQLite can read; once every row is converted it purges exactly the
// expired ones. A row written in another form after the check is never
// deleted.
func TestSQLiteForeignTimeFormats(t *testing.T) {
	t.Parallel()
	b := setup(t, sqliteTarget)
	b.seed(t, "billing", "old-", 3, 3*time.Hour)
	b.seed(t, "billing", "new-", 1, 90*time.Minute)
	insert := fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES (?, ?, %%s)`, b.table)
	_, err := b.db.Exec(fmt.Sprintf(insert, `datetime('now', '-90 minutes')`), "billing", "sqlite-text")
	require.NoError(t, err)
	goTime := time.Now().Add(-90 * time.Minute).UTC()
	_, err = b.db.Exec(fmt.Sprintf(insert, "?"), "billing", "go-time", goTime)
	require.NoError(t, err)

	p := shortPurger(t, b.store, 2*time.Hour)
	err = refused(t, p)
	require.ErrorContains(t, err, "2 rows have a processed_at the purge cannot compare")
	require.ErrorContains(t, err, "UPDATE "+`"`+b.table+`"`+" SET processed_at = strftime('%Y-%m-%dT%H:%M:%fZ', processed_at) WHERE NOT")
	require.Equal(t, map[string]int64{"billing": 6}, b.rows(t), "nothing deleted")

	// The statement the error gives converts what SQLite reads; with a Go
	// time.Time among the rows it fails and changes nothing.
	convert := fmt.Sprintf(`UPDATE %s SET processed_at = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', processed_at) WHERE NOT (typeof(processed_at) = 'text' AND processed_at GLOB '%s')`, b.table, glob)
	_, err = b.db.Exec(convert)
	require.ErrorContains(t, err, "NOT NULL")
	refused(t, p)
	// The program rewrites its own rows, then the statement does the rest.
	_, err = b.db.Exec(fmt.Sprintf(`UPDATE %s SET processed_at = ? WHERE event_id = 'go-time'`, b.table), goTime.Format("2006-01-02T15:04:05.000Z"))
	require.NoError(t, err)
	_, err = b.db.Exec(convert)
	require.NoError(t, err)

	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the three rows older than the retention, no other")
	for _, id := range []string{"new-1", "sqlite-text", "go-time"} {
		require.True(t, b.has(t, "billing", id), id)
	}

	// Written in another form after the check: compared wrongly, so left
	// alone, even when it is old.
	_, err = b.db.Exec(fmt.Sprintf(insert, `datetime('now', '-3 hours')`), "billing", "late-text")
	require.NoError(t, err)
	n, err = p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	counts, err := p.DryRun(context.Background())
	require.NoError(t, err)
	require.Empty(t, counts)
	require.True(t, b.has(t, "billing", "late-text"))
}

// glob is the form of processed_at SQLite's purge compares.
const glob = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9]Z"

// A MariaDB table made by hand with processed_at TIMESTAMP(6): claims and
// purges ran without complaint, and with the session at time_zone
// '-12:00' a purge with a 1-hour retention deleted a row claimed a moment
// earlier. Now the purge refuses the table, deleting nothing, and says how
// to convert it; converted as it says, the same purger keeps the new claim
// and removes the expired row.
func TestMySQLTimestampColumn(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	cfg.Params = map[string]string{"time_zone": "'-12:00'"}
	db := testdb.Open(t, "mysql", cfg.FormatDSN())
	b := handMade(t, mysqlTarget, db, `CREATE TABLE %s (
	consumer     VARBINARY(255) NOT NULL,
	event_id     VARBINARY(255) NOT NULL,
	processed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (consumer, event_id),
	KEY (processed_at)
) ENGINE=InnoDB`)
	table := b.table
	p := shortPurger(t, b.store, time.Hour)
	err = refused(t, p)
	require.ErrorContains(t, err, "processed_at is timestamp(6), want datetime(6)")
	require.ErrorContains(t, err, "SET time_zone = '+00:00'; ALTER TABLE `"+table+"` MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))")
	require.True(t, b.has(t, "billing", "just-now"))

	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	for _, stmt := range []string{"SET time_zone = '+00:00'", "ALTER TABLE `" + table + "` MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))"} {
		_, err = conn.ExecContext(context.Background(), stmt)
		require.NoError(t, err)
	}
	require.NoError(t, conn.Close())
	b.seed(t, "billing", "expired-", 1, 2*time.Hour)
	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.True(t, b.has(t, "billing", "just-now"))
	require.False(t, b.has(t, "billing", "expired-1"))
}

// A PostgreSQL table whose processed_at is a timestamp without time zone
// is refused with the ALTER that converts it.
func TestPostgreSQLTimestampWithoutTimeZone(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	b := handMade(t, postgres, db, `CREATE TABLE %s (consumer text NOT NULL, event_id text NOT NULL,
	processed_at timestamp NOT NULL DEFAULT now(), PRIMARY KEY (consumer, event_id))`)
	table := b.table
	p := shortPurger(t, b.store, time.Hour)
	err := refused(t, p)
	require.ErrorContains(t, err, "processed_at is timestamp without time zone, want timestamp with time zone")
	alter := `ALTER TABLE "` + table + `" ALTER COLUMN processed_at TYPE timestamptz USING processed_at AT TIME ZONE 'UTC'`
	require.ErrorContains(t, err, alter)
	_, err = db.Exec(alter)
	require.NoError(t, err)
	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, b.has(t, "billing", "just-now"))

	// Once the table passes, a purger does not check it again: the check
	// costs one query per purger, not one per round. A new purger (the next
	// cron run, the next deploy) checks afresh.
	_, err = db.Exec(`ALTER TABLE "` + table + `" ALTER COLUMN processed_at TYPE timestamp`)
	require.NoError(t, err)
	_, err = p.PurgeOnce(context.Background())
	require.NoError(t, err, "the purger that passed the check does not run it again")
	require.ErrorContains(t, refused(t, shortPurger(t, b.store, time.Hour)), "processed_at is timestamp without time zone")
}

// handMade creates a table on db with ddl (the table's name in %s), as a
// hand-written schema would, and a store on it holding one claim made just
// now.
func handMade(t *testing.T, tg target, db *sql.DB, ddl string) *bundle {
	t.Helper()
	table := testdb.Table(t, db, "purge_ts")
	_, err := db.Exec(fmt.Sprintf(ddl, table))
	require.NoError(t, err)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: tg.dialect, Table: table})
	require.NoError(t, err)
	b := &bundle{tg: tg, db: db, store: store, table: table}
	require.True(t, b.claim(t, "billing", "just-now"))
	return b
}

var mysqlTarget, sqliteTarget = targets()[1], targets()[2]
