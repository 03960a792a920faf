package sqlinbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A dialect that does not match the database is refused with an error
// that says "Dialect" and names what was found: by New from the driver's
// type, and, for a driver New cannot recognise (wrapped), by CreateSchema
// from the database's answer.
func TestDialectMismatch(t *testing.T) {
	t.Parallel()
	dbs := map[string]func(t testing.TB) (*sql.DB, string){
		"postgresql/lib-pq": func(t testing.TB) (*sql.DB, string) { return testdb.Postgres(t, "postgres"), testdb.PostgresDSN() },
		"postgresql/pgx":    func(t testing.TB) (*sql.DB, string) { return testdb.Postgres(t, "pgx"), testdb.PostgresDSN() },
		"mysql":             func(t testing.TB) (*sql.DB, string) { return testdb.MySQL(t), testdb.MySQLDSN() },
		"sqlite": func(t testing.TB) (*sql.DB, string) {
			return testdb.SQLite(t), sqlinbox.SQLiteDSN(testdb.SQLiteFile(t))
		},
	}
	speaks := map[string]sqlinbox.Dialect{"postgresql/lib-pq": sqlinbox.PostgreSQL, "postgresql/pgx": sqlinbox.PostgreSQL, "mysql": sqlinbox.MySQL, "sqlite": sqlinbox.SQLite}
	driverOf := map[string]string{"postgresql/lib-pq": "github.com/lib/pq", "postgresql/pgx": "github.com/jackc/pgx/v5/stdlib", "mysql": "github.com/go-sql-driver/mysql", "sqlite": "modernc.org/sqlite"}
	for name, open := range dbs {
		for _, dialect := range []sqlinbox.Dialect{sqlinbox.PostgreSQL, sqlinbox.MySQL, sqlinbox.SQLite} {
			t.Run(name+"/as-"+dialect.String(), func(t *testing.T) {
				t.Parallel()
				db, dsn := open(t)
				cfg := sqlinbox.Config{Dialect: dialect, Table: testdb.Table(t, db, "inbox")}
				store, err := sqlinbox.New(db, cfg)
				if dialect == speaks[name] {
					require.NoError(t, err)
					require.NoError(t, store.CreateSchema(context.Background()))
					return
				}
				require.ErrorContains(t, err, "sqlinbox: invalid config: Dialect is "+dialect.String()+" but the *sql.DB's driver is "+driverOf[name])
				require.ErrorContains(t, err, "which speaks "+speaks[name].String())
				t.Log(err)

				// The same driver behind a wrapper New cannot recognise.
				store, err = sqlinbox.New(wrap(t, db, dsn), cfg)
				require.NoError(t, err)
				err = store.CreateSchema(context.Background())
				require.ErrorContains(t, err, "Dialect is "+dialect.String()+" but the database answered as "+speaks[name].String())
				t.Log(err)

				// A table made by the right dialect (an earlier deploy, a
				// migration): the first claim names the mismatch instead.
				right, err := sqlinbox.New(db, sqlinbox.Config{Dialect: speaks[name], Table: cfg.Table})
				require.NoError(t, err)
				require.NoError(t, right.CreateSchema(context.Background()))
				tx, _, err := store.Claim(context.Background(), inboxdriver.Claim{Consumer: "c", EventID: "e1"})
				if tx != nil {
					_ = tx.Rollback(context.Background())
				}
				require.ErrorContains(t, err, "Dialect is "+dialect.String()+" but the database answered as "+speaks[name].String())
				t.Log(err)
			})
		}
	}
}

// MariaDB reads a PostgreSQL placeholder as a column name, error 1054
// (Unknown column '$1'), as docs/databases.md says.
func TestMariaDBReadsDollarPlaceholderAsColumn(t *testing.T) {
	t.Parallel()
	db := testdb.MySQL(t)
	table := testdb.Table(t, db, "effects")
	_, err := db.Exec(`CREATE TABLE ` + table + ` (order_id VARCHAR(64))`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO `+table+` (order_id) VALUES ($1)`, "o-1")
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	require.EqualValues(t, 1054, me.Number, "%v", err)
	require.Contains(t, me.Message, "Unknown column '$1'")
}

// wrap opens dsn with db's driver behind a driver of another package, as
// a tracing wrapper would.
func wrap(t testing.TB, db *sql.DB, dsn string) *sql.DB {
	wrapped := sql.OpenDB(wrappedConnector{db.Driver(), dsn})
	t.Cleanup(func() { _ = wrapped.Close() })
	return wrapped
}

type wrappedConnector struct {
	inner driver.Driver
	dsn   string
}

func (c wrappedConnector) Connect(context.Context) (driver.Conn, error) { return c.inner.Open(c.dsn) }
func (c wrappedConnector) Driver() driver.Driver                        { return wrappedDriver{c.inner} }

type wrappedDriver struct{ driver.Driver }
