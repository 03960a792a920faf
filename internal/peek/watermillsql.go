package peek

import (
	"reflect"
	"strings"
)

// IsWatermillSQL reports whether t is declared in watermill-sql's pkg/sql,
// of any major version (github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql,
// .../v4/pkg/sql).
func IsWatermillSQL(t reflect.Type) bool {
	return strings.HasPrefix(t.PkgPath(), "github.com/ThreeDotsLabs/watermill-sql/") && strings.HasSuffix(t.PkgPath(), "/pkg/sql")
}

// IsSQLPublisher reports whether t is watermill-sql's Publisher struct.
// Checked against watermill-sql v3.1.0 and v4.1.2.
func IsSQLPublisher(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && IsWatermillSQL(t) && t.Name() == "Publisher"
}

// PublisherDB returns the handle a watermill-sql Publisher p (a struct,
// [IsSQLPublisher]) writes through: its unexported db field, a
// ContextExecutor interface holding the *sql.DB or *sql.Tx given to
// NewPublisher (v3), or v4's adapter around it ([AdapterHandle]). The zero
// Value when p has no such field. Checked against v3.1.0 and v4.1.2.
func PublisherDB(p reflect.Value) reflect.Value {
	db := p.FieldByName("db")
	if !db.IsValid() || db.Kind() != reflect.Interface {
		return reflect.Value{}
	}
	return db
}

// PublisherSchemaAdapter returns the SchemaAdapter of a watermill-sql
// Publisher p's unexported config field (a PublisherConfig), an interface;
// the zero Value when p has no such field. Checked against v3.1.0 and
// v4.1.2.
func PublisherSchemaAdapter(p reflect.Value) reflect.Value {
	config := p.FieldByName("config")
	if !config.IsValid() || config.Kind() != reflect.Struct {
		return reflect.Value{}
	}
	adapter := config.FieldByName("SchemaAdapter")
	if !adapter.IsValid() || adapter.Kind() != reflect.Interface {
		return reflect.Value{}
	}
	return adapter
}

// AdapterHandle returns the handle a watermill-sql adapter struct v wraps
// in its first field, embedded: StdSQLBeginner's SQLBeginner (a *sql.DB,
// *sql.Conn...), StdSQLTx's *sql.Tx, PgxBeginner's Conn, PgxTx's pgx.Tx.
// The zero Value when v is not a watermill-sql struct with a field.
// Checked against v4.1.2 (v3 has no adapters: its publisher holds the
// handle itself).
func AdapterHandle(v reflect.Value) reflect.Value {
	if v.Kind() != reflect.Struct || !IsWatermillSQL(v.Type()) || v.NumField() == 0 {
		return reflect.Value{}
	}
	return v.Field(0)
}

// IsContextKey reports whether t is the type of watermill-sql's context
// keys, under which its subscriber stores the transaction a message came
// with: the unexported "type contextKey string" of pkg/sql. Checked
// against v3.1.0 and v4.1.2.
func IsContextKey(t reflect.Type) bool {
	return t.Kind() == reflect.String && t.Name() == "contextKey" && IsWatermillSQL(t)
}

// WrapperTx returns the exported field named Tx of a struct type t, the
// transaction a wrapper holds: watermill-sql v4's StdSQLTx embeds a
// *sql.Tx and its PgxTx a pgx.Tx there, and its subscriber stores one of
// them in a message's context. Any package's wrapper of that shape is
// accepted. Checked against v4.1.2.
func WrapperTx(t reflect.Type) (reflect.StructField, bool) {
	if t.Kind() != reflect.Struct {
		return reflect.StructField{}, false
	}
	f, ok := t.FieldByName("Tx")
	return f, ok && f.IsExported()
}
