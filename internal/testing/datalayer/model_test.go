package datalayer_test

// Invoice is a row of the invoices table, for GORM, bun and sqlx: each
// reads its own tag, and derives the table name from the type's.
type Invoice struct {
	ID      int64  `bun:",pk,autoincrement"`
	OrderID string `db:"order_id"`
}
