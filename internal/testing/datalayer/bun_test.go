package datalayer_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer"
)

func openBun(r *datalayer.Rig) *bun.DB {
	var d schema.Dialect
	switch r.Backend {
	case datalayer.MariaDB:
		d = mysqldialect.New()
	case datalayer.SQLite:
		d = sqlitedialect.New()
	default:
		d = pgdialect.New()
	}
	return bun.NewDB(r.DB, d)
}

// bunHandler writes through bun in the inbox transaction.
func bunHandler(bdb *bun.DB) datalayer.Write {
	return func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := bdb.NewInsert().Conn(tx).Model(&Invoice{OrderID: msg.UUID}).Exec(msg.Context())
		return err
	}
}

func TestBun(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		bdb := openBun(r)
		r.RequireExactlyOnce(t, bunHandler(bdb))

		// A query without Conn(tx) goes to the pool: outside the inbox
		// transaction. The middleware reports the handler when it never
		// took the transaction.
		res := r.FailFirstAttempt(t, false, func(msg *message.Message) error {
			_, err := bdb.NewInsert().Model(&Invoice{OrderID: msg.UUID}).Exec(msg.Context())
			return err
		})
		r.RequireEscaped(t, res)
		require.True(t, res.UnusedTxReported)

		// bun's RunInTx (and BeginTx) begin on the pool: a separate
		// transaction.
		res = r.FailFirstAttempt(t, true, func(msg *message.Message) error {
			return bdb.RunInTx(msg.Context(), nil, func(ctx context.Context, tx bun.Tx) error {
				_, err := tx.NewInsert().Model(&Invoice{OrderID: msg.UUID}).Exec(ctx)
				return err
			})
		})
		r.RequireEscaped(t, res)
		require.False(t, res.UnusedTxReported)
	})
}
