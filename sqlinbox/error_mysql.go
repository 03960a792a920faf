package sqlinbox

import "reflect"

// The driver's error type, recognised by name rather than by importing it:
// importing github.com/go-sql-driver/mysql registers the "mysql" driver with
// [database/sql] in every program that uses sqlinbox, and links it, whether or
// not the program speaks to MySQL. The driver offers no method or interface
// that carries the error number (PostgreSQL's drivers share SQLState(),
// modernc's Code()), so its struct is read by reflection. Tests against the
// real driver and a real MariaDB fail if it renames the type, its package or
// the field.
const (
	mysqlErrorPackage = "github.com/go-sql-driver/mysql"
	mysqlErrorType    = "MySQLError"
	mysqlErrorField   = "Number"
)

// mysqlErrorNumber returns the error number of the first [*mysql.MySQLError]
// in err's tree (as [errors.As] walks it), and false when there is none.
//
// [*mysql.MySQLError]: https://pkg.go.dev/github.com/go-sql-driver/mysql#MySQLError
func mysqlErrorNumber(err error) (uint64, bool) {
	if err == nil {
		return 0, false
	}
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		if s := v.Elem(); s.Kind() == reflect.Struct && s.Type().Name() == mysqlErrorType && s.Type().PkgPath() == mysqlErrorPackage {
			if f := s.FieldByName(mysqlErrorField); f.IsValid() && f.CanUint() {
				return f.Uint(), true
			}
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return mysqlErrorNumber(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if n, ok := mysqlErrorNumber(e); ok {
				return n, true
			}
		}
	}
	return 0, false
}
