package datalayer_test

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/ent"
)

func entDialect(b datalayer.Backend) string {
	switch b {
	case datalayer.MariaDB:
		return dialect.MySQL
	case datalayer.SQLite:
		return dialect.SQLite
	default:
		return dialect.Postgres
	}
}

// entHandler writes through ent in the inbox transaction.
func entHandler(dialectName string) datalayer.Write {
	return func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		drv := entsql.NewDriver(dialectName, entsql.Conn{ExecQuerier: tx}) // dialect.Postgres, dialect.MySQL or dialect.SQLite
		client := ent.NewClient(ent.Driver(drv))                           // one per message: it holds no connection
		return client.Invoice.Create().SetOrderID(msg.UUID).Exec(msg.Context())
	}
}

func TestEnt(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		name := entDialect(r.Backend)
		r.RequireExactlyOnce(t, entHandler(name))

		// Tx on the client of the inbox transaction panics: ent's driver
		// begins on the *sql.DB it expects to hold. Recovered here, so
		// that the panic is the attempt's error; unrecovered, it rolls
		// the attempt back like any panic, on every redelivery.
		invoices, err := r.TryOnce(t, func(msg *message.Message) (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("ent's Tx panicked: %w", p.(error))
				}
			}()
			tx, _ := inbox.TxFromContext(msg.Context())
			client := ent.NewClient(ent.Driver(entsql.NewDriver(name, entsql.Conn{ExecQuerier: tx})))
			_, err = client.Tx(msg.Context())
			return err
		})
		var assertion *runtime.TypeAssertionError
		require.True(t, errors.As(err, &assertion), "%v", err)
		require.Equal(t, 0, invoices)
	})
}

// An ent client on the pool writes outside the inbox transaction, and so
// does a transaction it begins.
func TestEntAroundTheInbox(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		client := ent.NewClient(ent.Driver(entsql.OpenDB(entDialect(r.Backend), r.DB)))
		res := r.FailFirstAttempt(t, false, func(msg *message.Message) error {
			return client.Invoice.Create().SetOrderID(msg.UUID).Exec(msg.Context())
		})
		r.RequireEscaped(t, res)
		require.True(t, res.UnusedTxReported)

		res = r.FailFirstAttempt(t, true, func(msg *message.Message) error {
			tx, err := client.Tx(msg.Context())
			if err != nil {
				return err
			}
			if err := tx.Invoice.Create().SetOrderID(msg.UUID).Exec(msg.Context()); err != nil {
				return errors.Join(err, tx.Rollback())
			}
			return tx.Commit()
		})
		r.RequireEscaped(t, res)
		require.False(t, res.UnusedTxReported)
	})
}
