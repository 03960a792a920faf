package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// target is a database the command runs on, as the tests reach it.
type target struct {
	name, dialect string // -dialect
	open          func(t testing.TB) *sql.DB
	dsn           func(t testing.TB) string
	// seed inserts one row per id for consumer, claimed age ago by the
	// database clock.
	seed func(t testing.TB, db *sql.DB, table, consumer string, age time.Duration, ids []string)
	// readOnly returns the DSN of a user that may read table and nothing
	// more, made for this test and dropped after it.
	readOnly func(t testing.TB, db *sql.DB, table string) string
	// waiting reports whether a statement on table waits for a lock.
	waiting func(db *sql.DB, table string) (bool, error)
}

var (
	postgres = target{
		name: "PostgreSQL", dialect: "postgresql",
		open: func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") },
		dsn:  func(testing.TB) string { return testdb.PostgresDSN() },
		seed: func(t testing.TB, db *sql.DB, table, consumer string, age time.Duration, ids []string) {
			_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at)
SELECT $1, unnest($2::text[]), now() - $3::float8 * interval '1 microsecond'`, table), consumer, ids, age.Microseconds())
			require.NoError(t, err)
		},
		readOnly: readOnlyPostgres,
		waiting: func(db *sql.DB, table string) (bool, error) {
			var n int
			err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, table).Scan(&n)
			return n > 0, err
		},
	}
	mariadb = target{
		name: "MariaDB", dialect: "mysql",
		open: testdb.MySQL,
		dsn:  func(testing.TB) string { return testdb.MySQLDSN() },
		seed: func(t testing.TB, db *sql.DB, table, consumer string, age time.Duration, ids []string) {
			seedValues(t, db, table, "(?, ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)", consumer, age.Microseconds(), ids)
		},
		readOnly: readOnlyMariaDB,
		waiting: func(db *sql.DB, table string) (bool, error) {
			var n int
			// A locking read of one key waits while MariaDB optimises it
			// (state "Statistics"), before InnoDB lists it as LOCK WAIT.
			err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.processlist WHERE LOCATE(?, info) > 0 AND info LIKE '%FOR UPDATE'`, table).Scan(&n)
			return n > 0, err
		},
	}
	sqlite = target{
		name: "SQLite", dialect: "sqlite",
		open: testdb.SQLite,
		dsn:  func(t testing.TB) string { return testdb.SQLiteFile(t) },
		seed: func(t testing.TB, db *sql.DB, table, consumer string, age time.Duration, ids []string) {
			seedValues(t, db, table, "(?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?))", consumer, fmt.Sprintf("-%f seconds", age.Seconds()), ids)
		},
		// mode=ro: as root, file permissions would not stop the writes.
		readOnly: func(t testing.TB, _ *sql.DB, _ string) string {
			return "file:" + testdb.SQLiteFile(t) + "?mode=ro"
		},
	}
	targets = []target{postgres, mariadb, sqlite}
)

func seedValues(t testing.TB, db *sql.DB, table, row, consumer string, age any, ids []string) {
	t.Helper()
	var values []string
	var args []any
	for _, id := range ids {
		values = append(values, row)
		args = append(args, consumer, id, age)
	}
	_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES %s`, table, strings.Join(values, ", ")), args...)
	require.NoError(t, err)
}

// forEach runs fn as a parallel subtest per target.
func forEach(t *testing.T, fn func(t *testing.T, tg target), only ...target) {
	t.Parallel()
	if len(only) == 0 {
		only = targets
	}
	for _, tg := range only {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

// fixture is an inbox table of one target, with the flags that reach it.
type fixture struct {
	tg    target
	db    *sql.DB
	table string
	store *sqlinbox.Store
}

// setup creates an inbox table unique to the test (SQLite: the default
// table in the test's file), configured by the given flags as the command
// would read them.
func setup(t *testing.T, tg target, flags ...string) *fixture {
	t.Helper()
	db := tg.open(t)
	table := sqlinbox.DefaultTable
	if tg.dialect != "sqlite" {
		table = testdb.Table(t, db, "cmd_inbox")
	}
	f := &fixture{tg: tg, db: db, table: table}
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	d := addDatabaseFlags(fs)
	require.NoError(t, fs.Parse(append(f.flags(t), flags...)))
	config, _, err := d.config()
	require.NoError(t, err)
	f.store, err = sqlinbox.New(db, config)
	require.NoError(t, err)
	require.NoError(t, f.store.CreateSchema(context.Background()))
	return f
}

// flags reach the fixture's table.
func (f *fixture) flags(t testing.TB) []string {
	return []string{"-dialect", f.tg.dialect, "-dsn", f.tg.dsn(t), "-table", f.table}
}

// run runs a subcommand on the fixture's table.
func (f *fixture) run(t testing.TB, subcommand string, args ...string) (code int, stdout, stderr string) {
	return runCmd(append(append([]string{subcommand}, f.flags(t)...), args...)...)
}

func (f *fixture) seed(t testing.TB, consumer string, age time.Duration, ids ...string) {
	t.Helper()
	f.tg.seed(t, f.db, f.table, consumer, age, ids)
}

// rows returns the table's row count per consumer.
func (f *fixture) rows(t testing.TB) map[string]int {
	t.Helper()
	rows, err := f.db.Query(fmt.Sprintf(`SELECT consumer, COUNT(*) FROM %s GROUP BY consumer`, f.table))
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var c string
		var n int
		require.NoError(t, rows.Scan(&c, &n))
		out[c] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// claim claims (consumer, id) and commits: true when it was new, that is
// when the event would be processed.
func (f *fixture) claim(t testing.TB, consumer, id string) bool {
	t.Helper()
	tx, _, err := f.store.Claim(context.Background(), inboxdriver.Claim{Consumer: consumer, EventID: id})
	require.NoError(t, err)
	if tx == nil {
		return false
	}
	require.NoError(t, tx.Commit(context.Background()))
	return true
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return out
}

// unreachable is a DSN where no server answers: a port nothing listens on.
func unreachable(tg target) string {
	switch tg.dialect {
	case "postgresql":
		return "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"
	case "mysql":
		return "root@tcp(127.0.0.1:1)/test?timeout=5s"
	}
	return "/nonexistent/inbox.db"
}

// readOnlyPostgres creates a login role that may only read table.
func readOnlyPostgres(t testing.TB, db *sql.DB, table string) string {
	t.Helper()
	role := testdb.Name("inbox_ro")
	_, err := db.Exec(fmt.Sprintf(`CREATE ROLE %s LOGIN`, role))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Exec(fmt.Sprintf(`DROP OWNED BY %s`, role))
		_, err := db.Exec(fmt.Sprintf(`DROP ROLE %s`, role))
		require.NoError(t, err)
	})
	_, err = db.Exec(fmt.Sprintf(`GRANT SELECT ON %s TO %s`, table, role))
	require.NoError(t, err)
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}

// readOnlyMariaDB creates a user that may only read table.
func readOnlyMariaDB(t testing.TB, db *sql.DB, table string) string {
	t.Helper()
	user := testdb.Name("inbox_ro")
	_, err := db.Exec(fmt.Sprintf(`CREATE USER '%s'@'%%' IDENTIFIED BY 'ro'`, user))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec(fmt.Sprintf(`DROP USER '%s'@'%%'`, user))
		require.NoError(t, err)
	})
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	_, err = db.Exec(fmt.Sprintf("GRANT SELECT ON `%s`.`%s` TO '%s'@'%%'", cfg.DBName, table, user))
	require.NoError(t, err)
	cfg.User, cfg.Passwd = user, "ro"
	return cfg.FormatDSN()
}

func TestUsage(t *testing.T) {
	t.Parallel()
	code, _, errOut := runCmd()
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "usage: inbox SUBCOMMAND")
	for _, c := range subcommands {
		require.Contains(t, errOut, "  "+c.name+" ")
	}
	code, _, errOut = runCmd("inbox-purge")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `unknown subcommand "inbox-purge"`)
	code, _, _ = runCmd("-h")
	require.Equal(t, exitOK, code)
	for _, c := range subcommands {
		code, _, errOut := runCmd(c.name, "-h")
		require.Equal(t, exitOK, code, c.name)
		require.Contains(t, errOut, "usage: inbox "+c.name, c.name)
		require.Contains(t, errOut, "-dsn", c.name)
		code, _, errOut = runCmd(c.name, "-no-such-flag")
		require.Equal(t, exitUsage, code, c.name)
		require.Contains(t, errOut, "flag provided but not defined", c.name)
		code, _, errOut = runCmd(c.name, "-dsn", "x", "stray")
		require.Equal(t, exitUsage, code, c.name)
		require.Contains(t, errOut, "unexpected arguments", c.name)
	}
}

// A DSN of another database than -dialect says is refused before anything
// runs, by every subcommand, with a hint at -dialect.
func TestWrongDialect(t *testing.T) {
	t.Parallel()
	for _, sub := range [][]string{{"schema", "-apply"}, {"stats"}, {"forget", "-consumer", "c", "-id", "e"}, {"check"}, {"purge", "-retention", "2d"}} {
		for _, tc := range []struct {
			dialect, dsn string
			code         int
			err          string
		}{
			{"mysql", testdb.PostgresDSN(), exitUsage, "-dsn is not a mysql connection string (is -dialect right?)"},
			{"postgresql", testdb.MySQLDSN(), exitUsage, "-dsn is not a postgresql connection string (is -dialect right?)"},
			{"sqlite", testdb.PostgresDSN(), exitConnect, "cannot open the SQLite database"},
			{"oracle", testdb.PostgresDSN(), exitUsage, `-dialect "oracle": use postgresql, mysql or sqlite`},
		} {
			if sub[0] == "schema" && tc.dialect == "sqlite" {
				continue // -apply creates a SQLite file wherever -dsn says
			}
			code, out, errOut := runCmd(append(sub, "-dialect", tc.dialect, "-dsn", tc.dsn)...)
			require.Equal(t, tc.code, code, "%v %s: %s%s", sub, tc.dialect, out, errOut)
			require.Contains(t, errOut, tc.err, "%v %s", sub, tc.dialect)
		}
	}
}

// The built command exits with the documented statuses, which a script
// sees; go run ./cmd/inbox would report each failure as its own exit
// status 1, which is why the README builds or installs the command.
func TestBinaryExitStatus(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "inbox")
	out, err := exec.Command("go", append(append([]string{"build"}, testdb.BuildFlags...), "-o", bin, ".")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"schema"}, exitOK},
		{[]string{"schema", "-format", "xml"}, exitUsage},
		{[]string{"stats", "-dsn", unreachable(postgres)}, exitConnect},
		{[]string{"check", "-dsn", testdb.PostgresDSN(), "-table", testdb.Name("missing")}, exitFailed},
	} {
		err := exec.Command(bin, tc.args...).Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else {
			require.NoError(t, err)
		}
		require.Equal(t, tc.code, code, "%v", tc.args)
	}
}
