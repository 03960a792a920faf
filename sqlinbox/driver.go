package sqlinbox

import (
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// driverDialects are the [database/sql] drivers whose dialect is known from
// the package of their driver type, which db.Driver() returns without a
// round trip. A driver wrapped by another package (a tracing or metrics
// wrapper) is not recognised and passes: [Store.CreateSchema] and the first
// claim still recognise the database by the errors it answers with.
var driverDialects = []struct {
	module  string
	dialect Dialect
}{
	{"github.com/lib/pq", PostgreSQL},
	{"github.com/jackc/pgx", PostgreSQL}, // every major version's stdlib
	{"github.com/go-sql-driver/mysql", MySQL},
	{"modernc.org/sqlite", SQLite},
	{"github.com/mattn/go-sqlite3", SQLite},
	{"github.com/ncruces/go-sqlite3", SQLite},
	{"github.com/glebarez/go-sqlite", SQLite},
}

// checkDriver refuses a [Dialect] that does not match db's driver, naming
// both: PostgreSQL's SQL sent to MySQL fails much later with messages that
// never say "dialect" (FUNCTION pg_advisory_xact_lock does not exist).
func checkDriver(db *sql.DB, d Dialect) error {
	pkg, name := driverType(db)
	for _, known := range driverDialects {
		if pkg != known.module && !strings.HasPrefix(pkg, known.module+"/") {
			continue
		}
		if known.dialect == d {
			return nil
		}
		return fmt.Errorf("Dialect is %s but the *sql.DB's driver is %s (%s), which speaks %s: set Dialect to sqlinbox.%s", d, pkg, name, known.dialect, dialectName(known.dialect))
	}
	return nil
}

// driverType returns the package path and type name of db's driver.
func driverType(db *sql.DB) (pkg, name string) {
	t := reflect.TypeOf(db.Driver())
	if t == nil {
		return "", ""
	}
	name = t.String()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath(), name
}

// dialectName is the exported variable that holds d.
func dialectName(d Dialect) string {
	switch d {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	case SQLite:
		return "SQLite"
	}
	return d.String()
}

// answeredAs returns the dialect of the database whose driver returned
// err, recognised by the error's type (SQLSTATE for PostgreSQL, the
// MySQL error number, SQLite's result code), or nil when err says nothing
// about it.
func answeredAs(err error) Dialect {
	var lite sqliteCoder
	switch {
	case err == nil:
		return nil
	case pgCode(err) != "":
		return PostgreSQL
	case errors.As(err, &lite):
		return SQLite
	}
	if _, ok := mysqlErrorNumber(err); ok {
		return MySQL
	}
	return nil
}
