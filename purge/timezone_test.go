package purge_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// pgAt is the test PostgreSQL's URL with every session's TimeZone zone,
// a run-time parameter lib/pq and pgx both pass on.
func pgAt(zone string) string {
	u, err := url.Parse(testdb.PostgresDSN())
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("timezone", zone)
	u.RawQuery = q.Encode()
	return u.String()
}

// zoneTarget is a database reached through one driver, whose sessions can
// be put in a time zone.
type zoneTarget struct {
	target
	via string // the driver
	// defaultDDL gives processed_at a default whose meaning depends on the
	// writer's session (%s is the table); a hand-made table when create.
	defaultDDL string
	create     bool
	// store opens a store of table on a pool whose sessions are at zone.
	store func(t *testing.T, table, zone string) interface {
		inboxdriver.Store
		purge.Store
	}
	writers []string // the writers' zones
	purger  string   // the purge's zone
	// margin is how long past the retention the purge keeps the rows of
	// a table whose default writes local times (MySQL's only).
	margin time.Duration
}

func sqlStoreAt(driver string) func(t *testing.T, table, zone string) interface {
	inboxdriver.Store
	purge.Store
} {
	return func(t *testing.T, table, zone string) interface {
		inboxdriver.Store
		purge.Store
	} {
		var db *sql.DB
		dialect := sqlinbox.PostgreSQL
		switch driver {
		case "mysql":
			db, dialect = mysqlAt(t, zone), sqlinbox.MySQL
		case "sqlite":
			db, dialect = testdb.SQLite(t), sqlinbox.SQLite
		default:
			db = testdb.Open(t, driver, pgAt(zone))
		}
		store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: dialect, Table: table})
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		return store
	}
}

func pgxStoreAt(t *testing.T, table, zone string) interface {
	inboxdriver.Store
	purge.Store
} {
	pool, err := pgxpool.New(context.Background(), pgAt(zone))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// Claims made by writers whose sessions are in three time zones, one by
// one and in batches, purged
// with a 6-hour retention from a session in a fourth: only the rows
// older than the retention go. The table's processed_at default depends on
// the writer's session (MariaDB DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6),
// a PostgreSQL timestamptz defaulting to now() AT TIME ZONE 'UTC', SQLite
// CURRENT_TIMESTAMP text), and the claims used to write it: on MariaDB the
// purge deleted the claims of the writers east of UTC seconds after they
// were made, and the next copy of each event ran its handler again. Such a
// default now keeps every row 14 hours past the retention, for the claims
// of earlier releases (TestUpgradeNeverPurgesLiveClaims).
func TestClaimTimesIgnoreWriterSessions(t *testing.T) {
	t.Parallel()
	pgZones, pgPurge := []string{"Asia/Tokyo", "America/Los_Angeles", "Pacific/Kiritimati"}, "America/St_Johns"
	const pgDefault = `ALTER TABLE %s ALTER COLUMN processed_at SET DEFAULT (now() AT TIME ZONE 'UTC')`
	pg := targets()[0]
	for _, zt := range []zoneTarget{
		{target: pg, via: "lib-pq", defaultDDL: pgDefault, margin: 14 * time.Hour, store: sqlStoreAt("postgres"), writers: pgZones, purger: pgPurge},
		{target: pg, via: "pgx-stdlib", defaultDDL: pgDefault, margin: 14 * time.Hour, store: sqlStoreAt("pgx"), writers: pgZones, purger: pgPurge},
		{target: pg, via: "pgx", defaultDDL: pgDefault, margin: 14 * time.Hour, store: pgxStoreAt, writers: pgZones, purger: pgPurge},
		{
			target: mysqlTarget, via: "go-sql-driver",
			defaultDDL: "ALTER TABLE %s MODIFY processed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
			store:      sqlStoreAt("mysql"), writers: []string{"+09:00", "-08:00", "+13:00"}, purger: "+00:00",
			margin: 14 * time.Hour,
		},
		{
			target: sqliteTarget, via: "modernc", create: true, store: sqlStoreAt("sqlite"),
			defaultDDL: `CREATE TABLE %s (consumer TEXT NOT NULL, event_id TEXT NOT NULL,
	processed_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP, PRIMARY KEY (consumer, event_id)) WITHOUT ROWID`,
			// SQLite has no session time zone: 'now' is UTC.
			writers: []string{"", "", ""},
		},
	} {
		t.Run(zt.name+"/"+zt.via, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			admin := zt.open(t)
			table := testdb.Table(t, admin, "purge_zones")
			if zt.create {
				_, err := admin.Exec(fmt.Sprintf(zt.defaultDDL, table))
				require.NoError(t, err)
			} else {
				store, err := sqlinbox.New(admin, sqlinbox.Config{Dialect: zt.dialect, Table: table})
				require.NoError(t, err)
				require.NoError(t, store.CreateSchema(ctx))
				_, err = admin.Exec(fmt.Sprintf(zt.defaultDDL, table))
				require.NoError(t, err)
			}
			var live []string
			for i, zone := range zt.writers {
				store := zt.store(t, table, zone)
				for j := range 2 {
					id := fmt.Sprintf("writer-%d-%d", i, j)
					tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id})
					require.NoError(t, err)
					require.NotNil(t, tx, id)
					require.NoError(t, tx.Commit(ctx))
					live = append(live, id)
				}
				// A batch consumer's claims, written by the multi-row claim.
				batch, ok := store.(inboxdriver.BatchClaimer)
				require.True(t, ok, "every store serves batch consumers")
				ids := []string{fmt.Sprintf("batch-%d-0", i), fmt.Sprintf("batch-%d-1", i)}
				tx, claimed, err := batch.ClaimBatch(ctx, inboxdriver.BatchClaim{Consumer: "billing", EventIDs: ids})
				require.NoError(t, err)
				require.Equal(t, []bool{true, true}, claimed)
				require.NoError(t, tx.Commit(ctx))
				live = append(live, ids...)
			}
			zt.seed(t, admin, table, "billing", "expired-", 3, 7*time.Hour+zt.margin)

			store := zt.store(t, table, zt.purger)
			p, err := purge.New(store, purge.Config{Retention: 6 * time.Hour, AllowShortRetention: true, BatchPause: time.Millisecond})
			require.NoError(t, err)
			n, err := p.PurgeOnce(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 3, n, "the three rows older than the retention, no claim of the writers")
			for _, id := range live {
				tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id})
				require.NoError(t, err)
				require.Nil(t, tx, "%s is still claimed: its next copy is a duplicate", id)
			}
		})
	}
}
