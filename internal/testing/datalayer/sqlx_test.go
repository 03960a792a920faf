package datalayer_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer"
)

var sqlxDrivers = map[datalayer.Backend]string{datalayer.Postgres: "pgx", datalayer.MariaDB: "mysql", datalayer.SQLite: "sqlite"}

const insertInvoice = `INSERT INTO invoices (order_id) VALUES (:order_id)`

// sqlxHandler writes through sqlx in the inbox transaction.
func sqlxHandler(xdb *sqlx.DB) datalayer.Write {
	return func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		xtx := &sqlx.Tx{Tx: tx, Mapper: xdb.Mapper} // no driver name: bind and rebind on xdb
		query, args, err := xdb.BindNamed(`INSERT INTO invoices (order_id) VALUES (:order_id)`, Invoice{OrderID: msg.UUID})
		if err != nil {
			return err
		}
		if _, err := xtx.ExecContext(msg.Context(), query, args...); err != nil {
			return err
		}
		var invoice Invoice // the row just written, read back in the same transaction
		return xtx.GetContext(msg.Context(), &invoice, xdb.Rebind(`SELECT id, order_id FROM invoices WHERE order_id = ?`), msg.UUID)
	}
}

func TestSqlx(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		xdb := sqlx.NewDb(r.DB, sqlxDrivers[r.Backend])
		r.RequireExactlyOnce(t, sqlxHandler(xdb))

		// A sqlx.Tx made by hand has no driver name, so its named queries
		// bind with "?": PostgreSQL refuses them (42601, a syntax error);
		// MariaDB and SQLite take them.
		invoices, err := r.TryOnce(t, func(msg *message.Message) error {
			tx, _ := inbox.TxFromContext(msg.Context())
			xtx := &sqlx.Tx{Tx: tx, Mapper: xdb.Mapper}
			_, err := xtx.NamedExecContext(msg.Context(), insertInvoice, Invoice{OrderID: msg.UUID})
			return err
		})
		require.Equal(t, 0, invoices)
		if r.Backend == datalayer.Postgres {
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%v", err)
			require.Equal(t, "42601", pgErr.Code)
		} else {
			require.NoError(t, err)
		}

		// The *sqlx.DB writes, and begins, on the pool.
		res := r.FailFirstAttempt(t, false, func(msg *message.Message) error {
			_, err := xdb.NamedExecContext(msg.Context(), insertInvoice, Invoice{OrderID: msg.UUID})
			return err
		})
		r.RequireEscaped(t, res)
		require.True(t, res.UnusedTxReported)
		res = r.FailFirstAttempt(t, true, func(msg *message.Message) error {
			tx, err := xdb.BeginTxx(msg.Context(), nil)
			if err != nil {
				return err
			}
			if _, err := tx.NamedExecContext(msg.Context(), insertInvoice, Invoice{OrderID: msg.UUID}); err != nil {
				return errors.Join(err, tx.Rollback())
			}
			return tx.Commit()
		})
		r.RequireEscaped(t, res)
		require.False(t, res.UnusedTxReported)
	})
}
