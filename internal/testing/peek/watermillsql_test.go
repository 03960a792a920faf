package peek_test

import (
	"context"
	stdsql "database/sql"
	"reflect"
	"testing"

	sql3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	sql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/peek"
	"github.com/watermill-inbox/inbox/internal/testdb"
)

// holds reports whether the interface or pointer v, which may be an
// unexported field (reflect then refuses Interface), holds the pointer x.
func holds(v reflect.Value, x any) bool {
	if !v.IsValid() {
		return false
	}
	if v.Kind() == reflect.Interface {
		if v.IsNil() {
			return false
		}
		v = v.Elem()
	}
	return v.Type() == reflect.TypeOf(x) && v.Pointer() == reflect.ValueOf(x).Pointer()
}

// publisher is the struct of a watermill-sql publisher, as the produced
// publisher's check finds it.
func publisher(t *testing.T, pub any) reflect.Value {
	t.Helper()
	v := reflect.ValueOf(pub).Elem()
	require.True(t, peek.IsSQLPublisher(v.Type()), "%s", v.Type())
	return v
}

// keyRecorder records the keys a watermill-sql TxFromContext looks its
// transaction up by: those the subscriber stores it under.
type keyRecorder struct {
	context.Context
	keys []any
}

func (r *keyRecorder) Value(key any) any {
	r.keys = append(r.keys, key)
	return nil
}

// v3: the publisher's db field holds the handle given, its config's
// SchemaAdapter the schema; the subscriber's context key is recognised.
func TestWatermillSQLv3(t *testing.T) {
	t.Parallel()
	db := testdb.MySQL(t)
	pub, err := sql3.NewPublisher(db, sql3.PublisherConfig{SchemaAdapter: sql3.DefaultMySQLSchema{}}, nil)
	require.NoError(t, err)
	v := publisher(t, pub)
	require.True(t, holds(peek.PublisherDB(v), db), "Publisher.db holds the *sql.DB")
	adapter := peek.PublisherSchemaAdapter(v)
	require.True(t, adapter.IsValid(), "Publisher.config.SchemaAdapter")
	require.Equal(t, reflect.TypeFor[sql3.DefaultMySQLSchema](), adapter.Elem().Type())

	tx, err := db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	pub, err = sql3.NewPublisher(tx, sql3.PublisherConfig{SchemaAdapter: sql3.DefaultMySQLSchema{}}, nil)
	require.NoError(t, err)
	require.True(t, holds(peek.PublisherDB(publisher(t, pub)), tx), "Publisher.db holds the *sql.Tx")

	rec := &keyRecorder{Context: context.Background()}
	_, _ = sql3.TxFromContext(rec)
	require.Len(t, rec.keys, 1)
	require.True(t, peek.IsContextKey(reflect.TypeOf(rec.keys[0])), "%T", rec.keys[0])
}

// v4: the publisher's db field holds an adapter, whose first field is the
// handle; the transaction wrappers keep it in an exported Tx field; the
// subscriber's context key is recognised.
func TestWatermillSQLv4(t *testing.T) {
	t.Parallel()
	db := testdb.MySQL(t)
	pub, err := sql4.NewPublisher(sql4.BeginnerFromStdSQL(db), sql4.PublisherConfig{SchemaAdapter: sql4.DefaultMySQLSchema{}}, nil)
	require.NoError(t, err)
	v := publisher(t, pub)
	handle := peek.PublisherDB(v)
	require.True(t, handle.IsValid(), "Publisher.db")
	require.True(t, holds(peek.AdapterHandle(handle.Elem()), db), "StdSQLBeginner's first field holds the *sql.DB")
	adapter := peek.PublisherSchemaAdapter(v)
	require.True(t, adapter.IsValid(), "Publisher.config.SchemaAdapter")
	require.Equal(t, reflect.TypeFor[sql4.DefaultMySQLSchema](), adapter.Elem().Type())

	tx, err := db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	pub, err = sql4.NewPublisher(sql4.TxFromStdSQL(tx), sql4.PublisherConfig{SchemaAdapter: sql4.DefaultMySQLSchema{}}, nil)
	require.NoError(t, err)
	handle = peek.PublisherDB(publisher(t, pub))
	require.Equal(t, reflect.TypeFor[*sql4.StdSQLTx](), handle.Elem().Type())
	require.True(t, holds(peek.AdapterHandle(handle.Elem().Elem()), tx), "StdSQLTx's first field holds the *sql.Tx")
	f, ok := peek.WrapperTx(reflect.TypeFor[sql4.StdSQLTx]())
	require.True(t, ok, "StdSQLTx.Tx")
	require.Equal(t, reflect.TypeFor[*stdsql.Tx](), f.Type)

	pool, err := pgxpool.New(context.Background(), testdb.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.True(t, holds(peek.AdapterHandle(reflect.ValueOf(sql4.BeginnerFromPgx(pool))), pool), "PgxBeginner's first field holds the pool")
	f, ok = peek.WrapperTx(reflect.TypeFor[sql4.PgxTx]())
	require.True(t, ok, "PgxTx.Tx")
	require.Equal(t, reflect.TypeFor[pgx.Tx](), f.Type)

	rec := &keyRecorder{Context: context.Background()}
	_, _ = sql4.TxFromContext(rec)
	require.Len(t, rec.keys, 1)
	require.True(t, peek.IsContextKey(reflect.TypeOf(rec.keys[0])), "%T", rec.keys[0])
}
