// Package schema is the ent schema of the invoices the handlers write.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/dialect/entsql"
	"entgo.io/ent/schema"
	"entgo.io/ent/schema/field"
)

// Invoice is one invoice per order, in the table the other data layers
// write too.
type Invoice struct {
	ent.Schema
}

// Annotations names the table.
func (Invoice) Annotations() []schema.Annotation {
	return []schema.Annotation{entsql.Annotation{Table: "invoices"}}
}

// Fields of the Invoice.
func (Invoice) Fields() []ent.Field {
	return []ent.Field{field.String("order_id")}
}
