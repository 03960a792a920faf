package datalayer_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/libtnb/sqlite"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer"
)

// openGORM opens GORM on the service's pool, once.
func openGORM(t testing.TB, r *datalayer.Rig) *gorm.DB {
	t.Helper()
	gdb, err := gorm.Open(gormDialector(r.Backend, r.DB), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	return gdb
}

func gormDialector(b datalayer.Backend, db *sql.DB) gorm.Dialector {
	switch b {
	case datalayer.MariaDB:
		return mysql.New(mysql.Config{Conn: db})
	case datalayer.SQLite:
		return sqlite.New(sqlite.Config{Conn: db})
	default:
		return postgres.New(postgres.Config{Conn: db})
	}
}

// gormHandler writes through GORM in the inbox transaction.
func gormHandler(gdb *gorm.DB) datalayer.Write {
	return func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		g := gdb.WithContext(msg.Context())
		g.Statement.ConnPool = tx // g, and the sessions made from it, write in the inbox transaction
		return g.Create(&Invoice{OrderID: msg.UUID}).Error
	}
}

// gormSession is gormHandler's session, for the nested calls.
func gormSession(gdb *gorm.DB, msg *message.Message) *gorm.DB {
	tx, _ := inbox.TxFromContext(msg.Context())
	g := gdb.WithContext(msg.Context())
	g.Statement.ConnPool = tx
	return g
}

func TestGORM(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		gdb := openGORM(t, r)
		r.RequireExactlyOnce(t, gormHandler(gdb))

		// Transaction on the session bound to the inbox transaction is a
		// savepoint: it commits or rolls back with the inbox transaction,
		// and its own failure undoes its writes alone.
		transaction := func(msg *message.Message, fail error) error {
			g := gormSession(gdb, msg)
			return g.Transaction(func(g *gorm.DB) error {
				if err := g.Create(&Invoice{OrderID: msg.UUID}).Error; err != nil {
					return err
				}
				return fail
			}) // a SAVEPOINT in the inbox transaction
		}
		r.RequireJoined(t, r.FailFirstAttempt(t, false, func(msg *message.Message) error { return transaction(msg, nil) }))
		r.RequireSavepoint(t, gormHandler(gdb), transaction)

		// Begin on that session refuses: *sql.Tx cannot begin.
		invoices, err := r.TryOnce(t, func(msg *message.Message) error {
			return gormSession(gdb, msg).Begin().Error
		})
		require.ErrorIs(t, err, gorm.ErrInvalidTransaction)
		require.Equal(t, 0, invoices)

		// Commit on that session commits the inbox transaction there and
		// then, claim included: the handler fails after it, yet its write
		// stays, and the redelivery is skipped as a duplicate.
		id := datalayer.NewID()
		d := r.Start(t, func(msg *message.Message, _ int) error {
			g := gormSession(gdb, msg)
			if err := g.Create(&Invoice{OrderID: msg.UUID}).Error; err != nil {
				return err
			}
			if err := g.Commit().Error; err != nil {
				return err
			}
			return errors.New("the handler fails after its Commit")
		})
		d.Deliver(id)
		require.Equal(t, 1, d.Calls(id), "the redelivery was a duplicate")
		require.Equal(t, 1, r.Invoices(t)[id], "the failed attempt's write committed")
	})
}

// GORM opened on the pool, used as it is in the handler, writes outside
// the inbox transaction: each Create commits on its own, and so does a
// Transaction on it. The middleware reports the handler only when it never
// took the inbox transaction.
func TestGORMAroundTheInbox(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		gdb := openGORM(t, r)
		pool := func(msg *message.Message) error {
			return gdb.WithContext(msg.Context()).Create(&Invoice{OrderID: msg.UUID}).Error
		}
		res := r.FailFirstAttempt(t, false, pool)
		r.RequireEscaped(t, res)
		require.True(t, res.UnusedTxReported, "the handler never took the inbox transaction")

		res = r.FailFirstAttempt(t, true, func(msg *message.Message) error {
			return gdb.WithContext(msg.Context()).Transaction(func(g *gorm.DB) error {
				return g.Create(&Invoice{OrderID: msg.UUID}).Error
			})
		})
		r.RequireEscaped(t, res)
		require.False(t, res.UnusedTxReported, "the handler took the inbox transaction: the check cannot see the escape")
	})
}
