package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "github.com/lib/pq"              // registers "postgres"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// PostgresDSN is the PostgreSQL URL tests use: INBOX_TEST_POSTGRES_DSN, or a
// local server with trust authentication and a "test" database.
func PostgresDSN() string {
	if dsn := os.Getenv("INBOX_TEST_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// PgBouncerDSN is the URL of PgBouncer in transaction pooling mode in front
// of the test PostgreSQL: INBOX_TEST_PGBOUNCER_DSN, which the repository's
// test.sh starts and exports, or PgBouncer's usual local port.
func PgBouncerDSN() string {
	if dsn := os.Getenv("INBOX_TEST_PGBOUNCER_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:6432/test?sslmode=disable"
}

// PoolerDSN is PgBouncerDSN with the setting docs/poolers.md gives driver
// ("postgres" for lib/pq, "pgx" for pgx, stdlib or native) behind a
// transaction-pooling proxy: lib/pq binary_parameters=yes, pgx
// default_query_exec_mode=exec.
func PoolerDSN(driver string) string { return PoolerSettings(PgBouncerDSN(), driver) }

// PoolerSettings adds to the PostgreSQL URL dsn the setting driver needs
// behind a transaction-pooling proxy, as PoolerDSN.
func PoolerSettings(dsn, driver string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	if driver == "postgres" {
		return dsn + sep + "binary_parameters=yes"
	}
	return dsn + sep + "default_query_exec_mode=exec"
}

// PgBouncer opens the test PgBouncer through lib/pq ("postgres") or pgx's
// stdlib ("pgx"), with PoolerDSN's settings.
func PgBouncer(t testing.TB, driverName string) *sql.DB {
	return Open(t, driverName, PoolerDSN(driverName))
}

// opened remembers the driver and DSN of every pool Open returned, so that
// a table can still be dropped after its test closed the pool.
var opened sync.Map // *sql.DB -> source

type source struct{ driver, dsn string }

// Open opens driverName on dsn, checks the server answers, and closes the
// pool when the test ends.
func Open(t testing.TB, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	require.NoError(t, err)
	opened.Store(db, source{driverName, dsn})
	t.Cleanup(func() {
		_ = db.Close()
		opened.Delete(db)
	})
	require.NoError(t, db.Ping(), "no database answers at %s (run ./test.sh, which starts one)", dsn)
	return db
}

// Postgres opens the test PostgreSQL through lib/pq ("postgres") or pgx's
// stdlib ("pgx").
func Postgres(t testing.TB, driverName string) *sql.DB {
	return Open(t, driverName, PostgresDSN())
}

// PostgresIfServed is [Postgres] for a package whose other tests need no
// server (the root package's): see [skipUnlessServed].
func PostgresIfServed(t testing.TB, driverName string) *sql.DB {
	t.Helper()
	u, err := url.Parse(PostgresDSN())
	require.NoError(t, err)
	skipUnlessServed(t, "PostgreSQL", u.Host)
	return Postgres(t, driverName)
}

// MySQLIfServed is [MySQL] for a package whose other tests need no server:
// see [skipUnlessServed].
func MySQLIfServed(t testing.TB) *sql.DB {
	t.Helper()
	c, err := mysql.ParseDSN(MySQLDSN())
	require.NoError(t, err)
	skipUnlessServed(t, "MySQL", c.Addr)
	return MySQL(t)
}

// skipUnlessServed skips t where nothing answers at addr, except under CI
// (CI set), where test.sh starts every server and a skip would hide a
// failure.
func skipUnlessServed(t testing.TB, what, addr string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		return
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Skipf("no %s answers at %s (./test.sh starts one): %v", what, addr, err)
	}
	_ = c.Close()
}

// Name returns a fresh lowercase identifier starting with prefix, unique
// across tests and runs.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// Table returns a unique table name and drops that table and its lease
// table (if they were created) when the test ends.
func Table(t testing.TB, db *sql.DB, prefix string) string {
	t.Helper()
	name := Name(prefix)
	t.Cleanup(func() {
		if drop(db, name) == nil {
			return
		}
		// The test closed db (a closed-database case): drop the table
		// through a pool of its own.
		if src, ok := opened.Load(db); ok {
			if again, err := sql.Open(src.(source).driver, src.(source).dsn); err == nil {
				_ = drop(again, name)
				_ = again.Close()
			}
		}
	})
	return name
}

// drop drops an inbox table and the lease table sqlinbox keeps beside it.
func drop(db *sql.DB, table string) error {
	_, err := db.Exec("DROP TABLE IF EXISTS " + table)
	if err == nil {
		_, err = db.Exec("DROP TABLE IF EXISTS " + table + "_leases")
	}
	return err
}

// MySQLDSN is the MySQL/MariaDB DSN tests use: INBOX_TEST_MYSQL_DSN, or a
// local server with root and an empty password and a "test" database.
func MySQLDSN() string {
	if dsn := os.Getenv("INBOX_TEST_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// MySQL opens the test MySQL/MariaDB through go-sql-driver/mysql.
func MySQL(t testing.TB) *sql.DB {
	return Open(t, "mysql", MySQLDSN())
}

var (
	sqliteMu    sync.Mutex
	sqliteFiles = map[testing.TB]string{}
)

// SQLiteFile returns the SQLite database file of test t, in t.TempDir(): the
// same file for every call within one test, so several pools can share it
// like several processes would.
func SQLiteFile(t testing.TB) string {
	t.Helper()
	sqliteMu.Lock()
	defer sqliteMu.Unlock()
	if path, ok := sqliteFiles[t]; ok {
		return path
	}
	path := filepath.Join(t.TempDir(), "inbox.db")
	sqliteFiles[t] = path
	t.Cleanup(func() {
		sqliteMu.Lock()
		delete(sqliteFiles, t)
		sqliteMu.Unlock()
	})
	return path
}

// SQLite opens test t's SQLite file through modernc.org/sqlite with the
// settings sqlinbox recommends (sqlinbox.SQLiteDSN).
func SQLite(t testing.TB) *sql.DB {
	t.Helper()
	return Open(t, "sqlite", sqlinbox.SQLiteDSN(SQLiteFile(t)))
}

// TimePartitions lists the time partitions of a partitioned PostgreSQL
// inbox table by name, which sorts them by time; the default partition is
// left out.
func TimePartitions(t testing.TB, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT' ORDER BY 1`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	names := []string{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// DropTimePartitions drops the time partitions of a partitioned PostgreSQL
// inbox table, keeping its default partition: the table as an earlier
// release's CreateSchema left it, before the purge's first round.
func DropTimePartitions(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	names := TimePartitions(t, db, table)
	if len(names) == 0 {
		t.Fatalf("%s has no time partitions to drop", table)
	}
	for _, name := range names {
		if _, err := db.Exec(`DROP TABLE ` + name); err != nil {
			t.Fatal(err)
		}
	}
}

// BusyPooler keeps the test PgBouncer's pool busy until the test ends:
// clients goroutines, each on a connection of its own, run short
// transactions back to back, so that consecutive statements of any other
// client reach different server connections, as in production, where a
// lock or a prepared statement left on one server connection is met by
// another client, or missed by its own.
func BusyPooler(t testing.TB, clients int) {
	t.Helper()
	db := PgBouncer(t, "pgx")
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	// Stopped by a flag, not by cancelling a context: a statement
	// cancelled mid-flight makes the driver send PostgreSQL a cancel
	// request, and PgBouncer 1.18 can crash on one (its issues 801, 822
	// and 904, fixed by 1.20.1).
	t.Cleanup(func() {
		stop.Store(true)
		wg.Wait()
	})
	for range clients {
		wg.Go(func() {
			for !stop.Load() {
				_, _ = db.Exec(`SELECT pg_sleep(0.002)`)
			}
		})
	}
}

// RequireServerSwitches fails unless consecutive statements of one client
// connection of db reach at least two server connections: the condition
// in which session state left by one statement is lost to the next.
func RequireServerSwitches(t testing.TB, db *sql.DB) {
	t.Helper()
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer conn.Close()
	// A pool just started holds one server connection until the busy
	// clients (BusyPooler) make PgBouncer open more: give it time rather
	// than a fixed number of statements.
	pids := map[int]bool{}
	n := 0
	for deadline := time.Now().Add(30 * time.Second); len(pids) < 2 && time.Now().Before(deadline); n++ {
		var pid int
		require.NoError(t, conn.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
		pids[pid] = true
		if n%50 == 49 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	require.Len(t, pids, 2, "%d statements of one client over 30 s all reached one server connection: is PgBouncer in transaction pooling mode?", n)
}

// BlockLastTimePartition makes a period blocked, as one event dated ahead
// of the clock does on a table partitioned by event time: it drops the
// latest time partition of a partitioned PostgreSQL inbox table (it must
// hold no rows) and returns its name and a time inside its period. An
// event dated then lands in the default partition, and from then on the
// partition cannot be created.
func BlockLastTimePartition(t testing.TB, db *sql.DB, table string) (partition string, within time.Time) {
	t.Helper()
	names := TimePartitions(t, db, table)
	if len(names) == 0 {
		t.Fatalf("%s has no time partitions", table)
	}
	partition = names[len(names)-1]
	_, suffix, _ := strings.Cut(partition[len(table):], "_p")
	layout := map[int]string{8: "20060102", 6: "200601"}[len(suffix)]
	from, err := time.Parse(layout, suffix)
	if err != nil {
		t.Fatalf("partition %s: %v", partition, err)
	}
	if _, err := db.Exec(`DROP TABLE ` + partition); err != nil {
		t.Fatal(err)
	}
	return partition, from.Add(time.Hour)
}
