package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	migrate "github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	migratepostgres "github.com/golang-migrate/migrate/v4/database/postgres"
	migratesqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// layout is one kind of inbox table, as inbox schema's flags describe it.
type layout struct {
	name, dialect string
	flags         []string
	config        sqlinbox.Config
}

var layouts = []layout{
	{"postgresql", "postgresql", nil, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL}},
	{"postgresql daily by processed_at", "postgresql", []string{"-partitioning", "daily"},
		sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily}},
	{"postgresql monthly by processed_at", "postgresql", []string{"-partitioning", "monthly", "-uuid-event-ids"},
		sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Monthly, UUIDEventIDs: true}},
	{"postgresql daily by event time", "postgresql", []string{"-partitioning", "daily", "-partition-key", "event_time"},
		sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime}},
	{"postgresql monthly by event time", "postgresql", []string{"-partitioning", "monthly", "-partition-key", "event_time"},
		sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Monthly, PartitionKey: sqlinbox.EventIDTime}},
	{"mariadb", "mysql", nil, sqlinbox.Config{Dialect: sqlinbox.MySQL}},
	{"sqlite", "sqlite", nil, sqlinbox.Config{Dialect: sqlinbox.SQLite}},
}

// target is one table of a layout in a test database.
type target struct {
	layout
	dsn   string
	db    *sql.DB
	table string
}

func newTarget(t *testing.T, l layout) *target {
	tg := &target{layout: l}
	switch l.dialect {
	case "postgresql":
		tg.dsn = testdb.PostgresDSN()
		tg.db = testdb.Postgres(t, "pgx")
	case "mysql":
		tg.dsn = testdb.MySQLDSN()
		tg.db = testdb.MySQL(t)
	case "sqlite":
		tg.dsn = testdb.SQLiteFile(t)
		tg.db = testdb.Open(t, "sqlite", sqlinbox.SQLiteDSN(tg.dsn))
	}
	tg.table = testdb.Table(t, tg.db, "migrated")
	return tg
}

// inbox runs the inbox command on the target's table and returns its
// standard output and exit status.
func (tg *target) inbox(t *testing.T, subcommand string, args ...string) (string, int) {
	t.Helper()
	args = append([]string{subcommand, "-dialect", tg.dialect, "-table", tg.table}, append(tg.flags, args...)...)
	cmd := exec.Command(inboxCommand(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("inbox %v: %v", args, err)
	}
	return stdout.String() + stderr.String(), cmd.ProcessState.ExitCode()
}

// print returns what inbox schema prints with args, which must succeed.
func (tg *target) print(t *testing.T, args ...string) string {
	t.Helper()
	out, code := tg.inbox(t, "schema", args...)
	require.Zero(t, code, out)
	return out
}

// requireWorks checks the migrated table as inbox check does (-fingerprints
// when the fingerprint migration ran), then claims an event in it twice.
func (tg *target) requireWorks(t *testing.T, fingerprints bool) {
	t.Helper()
	args := []string{"-dsn", tg.dsn}
	if fingerprints {
		args = append(args, "-fingerprints")
	}
	out, code := tg.inbox(t, "check", args...)
	require.Zero(t, code, out)

	config := tg.config
	config.Table, config.Fingerprints = tg.table, fingerprints
	store, err := sqlinbox.New(tg.db, config)
	require.NoError(t, err)
	ctx := context.Background()
	id := testdb.UUIDv7(time.Now(), t.Name()) // carries a time for the tables partitioned by it
	var fp []byte
	if fingerprints {
		fp = []byte("fingerprint")
	}
	tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id, Fingerprint: fp})
	require.NoError(t, err)
	require.NotNil(t, tx, "the first copy is claimed")
	require.NoError(t, tx.Commit(ctx))
	tx, _, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id, Fingerprint: fp})
	require.NoError(t, err)
	require.Nil(t, tx, "the second copy is a duplicate")
}

// requireGone checks that the down migrations removed the table.
func (tg *target) requireGone(t *testing.T) {
	t.Helper()
	out, code := tg.inbox(t, "check", "-dsn", tg.dsn)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, tg.table+" does not exist")
}

// migrations is a tool with the inbox's two migrations written for it:
// the table, then the fingerprint column.
type migrations interface {
	up(t *testing.T)   // every migration not applied yet
	down(t *testing.T) // the last one applied
}

// tools write the inbox's migrations for each tool into dir, from what
// inbox schema prints, and return them ready to apply to the target's
// database, their versions in the table versions.
var tools = []struct {
	name  string
	write func(t *testing.T, tg *target, dir, versions string) migrations
}{
	// goose splits each file at the semicolons that end a line, except
	// between StatementBegin and StatementEnd.
	{"goose", func(t *testing.T, tg *target, dir, versions string) migrations {
		writeFile(t, dir, "00001_inbox.sql", tg.print(t, "-format", "goose"))
		writeFile(t, dir, "00002_inbox_fingerprint.sql", tg.print(t, "-format", "goose", "-add-fingerprint-column"))
		dialect := map[string]goose.Dialect{"postgresql": goose.DialectPostgres, "mysql": goose.DialectMySQL, "sqlite": goose.DialectSQLite3}[tg.dialect]
		p, err := goose.NewProvider(dialect, tg.db, os.DirFS(dir), goose.WithTableName(versions), goose.WithDisableGlobalRegistry(true))
		require.NoError(t, err)
		return gooseMigrations{p}
	}},
	// golang-migrate sends each file as it is: the plain script is the up
	// file, inbox schema -down the down file.
	{"golang-migrate", func(t *testing.T, tg *target, dir, versions string) migrations {
		writeFile(t, dir, "1_inbox.up.sql", tg.print(t))
		writeFile(t, dir, "1_inbox.down.sql", tg.print(t, "-down"))
		writeFile(t, dir, "2_inbox_fingerprint.up.sql", tg.print(t, "-add-fingerprint-column"))
		writeFile(t, dir, "2_inbox_fingerprint.down.sql", tg.print(t, "-add-fingerprint-column", "-down"))
		return migrateMigrations{newMigrate(t, tg, dir, versions)}
	}},
}

// Every layout's migrations, as inbox schema prints them for each tool,
// go up, down one by one, and up again, applied by the tool itself.
func TestMigrationTools(t *testing.T) {
	t.Parallel()
	for _, tool := range tools {
		for _, l := range layouts {
			t.Run(tool.name+"/"+l.name, func(t *testing.T) {
				t.Parallel()
				tg := newTarget(t, l)
				versions := testdb.Name("versions")
				t.Cleanup(func() { _, _ = tg.db.Exec("DROP TABLE IF EXISTS " + versions) })
				m := tool.write(t, tg, t.TempDir(), versions)
				m.up(t)
				tg.requireWorks(t, true)
				m.down(t)
				tg.requireWorks(t, false)
				m.down(t)
				tg.requireGone(t)
				m.up(t)
				tg.requireWorks(t, true)
			})
		}
	}
}

type gooseMigrations struct{ p *goose.Provider }

func (g gooseMigrations) up(t *testing.T) {
	_, err := g.p.Up(context.Background())
	require.NoError(t, err)
}

func (g gooseMigrations) down(t *testing.T) {
	_, err := g.p.Down(context.Background())
	require.NoError(t, err)
}

type migrateMigrations struct{ m *migrate.Migrate }

func (g migrateMigrations) up(t *testing.T)   { require.NoError(t, g.m.Up()) }
func (g migrateMigrations) down(t *testing.T) { require.NoError(t, g.m.Steps(-1)) }

// newMigrate returns golang-migrate on dir and a pool of its own (closing
// it closes the pool), recording versions in the table versions.
func newMigrate(t *testing.T, tg *target, dir, versions string) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(os.DirFS(dir), ".")
	require.NoError(t, err)
	dsn := tg.dsn
	switch tg.dialect {
	case "sqlite":
		dsn = sqlinbox.SQLiteDSN(dsn)
	case "mysql":
		// golang-migrate sends a file as one Exec: the schema's two
		// tables need the driver's multiStatements, as docs/operations.md says.
		dsn += map[bool]string{true: "&", false: "?"}[strings.Contains(dsn, "?")] + "multiStatements=true"
	}
	db, err := sql.Open(map[string]string{"postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite"}[tg.dialect], dsn)
	require.NoError(t, err)
	var drv database.Driver
	switch tg.dialect {
	case "postgresql":
		drv, err = migratepostgres.WithInstance(db, &migratepostgres.Config{MigrationsTable: versions})
	case "mysql":
		drv, err = migratemysql.WithInstance(db, &migratemysql.Config{MigrationsTable: versions})
	case "sqlite":
		drv, err = migratesqlite.WithInstance(db, &migratesqlite.Config{MigrationsTable: versions})
	}
	require.NoError(t, err)
	m, err := migrate.NewWithInstance("iofs", src, tg.dialect, drv)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
}

var (
	buildOnce sync.Once
	buildDir  string
	built     string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// inboxCommand builds the inbox command once per test binary, as the test
// binary was built (its packages are then already compiled), and returns
// its path.
func inboxCommand(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "inbox-command")
		if buildErr != nil {
			return
		}
		built = filepath.Join(buildDir, "inbox")
		out, err := exec.Command("go", append(append([]string{"build"}, testdb.BuildFlags...), "-o", built, "github.com/watermill-inbox/inbox/cmd/inbox")...).CombinedOutput()
		if err != nil {
			buildErr = errors.New("building the inbox command: " + err.Error() + "\n" + string(out))
		}
	})
	require.NoError(t, buildErr)
	return built
}
