package sqlinbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// MySQLError has the shape of the driver's type, in another package: it
// must not pass for it.
type MySQLError struct{ Number uint16 }

func (e *MySQLError) Error() string { return fmt.Sprint("error ", e.Number) }

// The driver's errors are recognised without importing the driver: by the
// type's name, package and Number field, wherever errors.As would find them.
// Errors from a real MariaDB keep that honest: a rename in the driver fails
// here.
func TestMySQLErrorsRecognisedWithoutTheDriver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQL(t)
	_, err := db.ExecContext(ctx, "SELECT * FROM "+testdb.Name("missing"))
	var driverErr *mysql.MySQLError
	require.ErrorAs(t, err, &driverErr)
	for name, wrapped := range map[string]error{
		"as returned": err,
		"wrapped":     fmt.Errorf("query: %w", err),
		"joined":      errors.Join(errors.New("other"), fmt.Errorf("query: %w", err)),
	} {
		n, ok := sqlinbox.MySQLErrorNumber(wrapped)
		require.True(t, ok, name)
		require.EqualValues(t, 1146, n, name) // ER_NO_SUCH_TABLE
	}

	for name, other := range map[string]error{
		"nil":                 nil,
		"plain":               errors.New("Error 1146: no such table"),
		"lookalike":           &MySQLError{Number: 1146},
		"nil pointer":         (*mysql.MySQLError)(nil),
		"driver's other type": mysql.ErrInvalidConn,
	} {
		_, ok := sqlinbox.MySQLErrorNumber(other)
		require.False(t, ok, name)
	}

	// Through the store: a missing table is named as such (the conformance
	// suite's ClaimTimeout case covers a lock wait, an event in flight).
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Name("missing")})
	require.NoError(t, err)
	_, _, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "c", EventID: "e"})
	require.ErrorContains(t, err, "inbox table does not exist")
	require.ErrorAs(t, err, &driverErr)
}
