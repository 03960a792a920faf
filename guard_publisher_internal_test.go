package inbox

import (
	"database/sql"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// handleIn names a database handle that is not the claim's transaction,
// through interfaces and pointers; watermill-sql's own adapters are
// unwrapped too, which the test rig's watermillsql package checks on real
// v3 and v4 publishers.
func TestHandleIn(t *testing.T) {
	t.Parallel()
	ours, theirs, db := &sql.Tx{}, &sql.Tx{}, &sql.DB{}
	for _, tc := range []struct {
		name   string
		handle any
		other  string
	}{
		{"the transaction", ours, ""},
		{"another transaction", theirs, "another transaction (*sql.Tx)"},
		{"the pool", db, "a *sql.DB"},
		{"something else", &struct{ db *sql.DB }{db}, ""},
		{"nothing", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var field any = tc.handle // as the publisher's interface field holds it
			require.Equal(t, tc.other, handleIn(reflect.ValueOf(&field).Elem(), reflect.ValueOf(ours), 4))
		})
	}
}

// A publisher of another package than watermill-sql's is never looked
// inside: only watermill-sql's db field is proof of where it writes.
func TestForeignHandleOnlyLooksAtWatermillSQL(t *testing.T) {
	t.Parallel()
	type Publisher struct{ db any }
	require.Empty(t, foreignHandle(&Publisher{db: &sql.DB{}}, &sql.Tx{}))
}
