package datalayer_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/sqlc/mysql"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/sqlc/pgsql"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/sqlc/pgxv5"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/sqlc/sqlite"
	"github.com/watermill-inbox/inbox/pgxinbox"
)

// sqlcQueries is what sqlc generates for database/sql, in a package per
// database.
type sqlcQueries[Q any] interface {
	WithTx(tx *sql.Tx) Q
	CreateInvoice(ctx context.Context, orderID string) error
}

// sqlcHandler writes through sqlc's code in the inbox transaction.
func sqlcHandler[Q sqlcQueries[Q]](queries Q) datalayer.Write {
	return func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		return queries.WithTx(tx).CreateInvoice(msg.Context(), msg.UUID)
	}
}

func TestSqlc(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, datalayer.SQL, func(t *testing.T, r *datalayer.Rig) {
		switch r.Backend {
		case datalayer.Postgres:
			testSqlc(t, r, pgsql.New(r.DB))
		case datalayer.MariaDB:
			testSqlc(t, r, mysql.New(r.DB))
		case datalayer.SQLite:
			testSqlc(t, r, sqlite.New(r.DB))
		}
	})
}

// queries is on the pool, as sqlc's New makes it.
func testSqlc[Q sqlcQueries[Q]](t *testing.T, r *datalayer.Rig, queries Q) {
	r.RequireExactlyOnce(t, sqlcHandler(queries))

	// The generated code on the pool writes outside the inbox transaction;
	// the middleware reports the handler, which never took it.
	res := r.FailFirstAttempt(t, false, func(msg *message.Message) error {
		return queries.CreateInvoice(msg.Context(), msg.UUID)
	})
	r.RequireEscaped(t, res)
	require.True(t, res.UnusedTxReported)

	// sqlc begins nothing itself: a transaction the handler begins on the
	// *sql.DB is a separate one, and the check cannot see it.
	res = r.FailFirstAttempt(t, true, func(msg *message.Message) error {
		tx, err := r.DB.BeginTx(msg.Context(), nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := queries.WithTx(tx).CreateInvoice(msg.Context(), msg.UUID); err != nil {
			return err
		}
		return tx.Commit()
	})
	r.RequireEscaped(t, res)
	require.False(t, res.UnusedTxReported)
}

// sqlcPgxHandler writes through sqlc's pgx/v5 code in the inbox
// transaction of a pgxinbox store.
func sqlcPgxHandler(queries *pgxv5.Queries) datalayer.Write {
	return func(msg *message.Message) error {
		tx, ok := pgxinbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		return queries.WithTx(tx).CreateInvoice(msg.Context(), msg.UUID)
	}
}

// sqlcPgxNested writes in a nested pgx transaction: pgx.Tx's Begin is a
// savepoint. It rolls the savepoint back when fail is not nil, and returns
// fail.
func sqlcPgxNested(queries *pgxv5.Queries) func(msg *message.Message, fail error) error {
	return func(msg *message.Message, fail error) error {
		ctx := msg.Context()
		tx, _ := pgxinbox.TxFromContext(ctx)
		sp, err := tx.Begin(ctx) // a SAVEPOINT in the inbox transaction
		if err != nil {
			return err
		}
		defer func() { _ = sp.Rollback(ctx) }() // ROLLBACK TO SAVEPOINT, unless committed
		if err := queries.WithTx(sp).CreateInvoice(ctx, msg.UUID); err != nil {
			return err
		}
		if fail != nil {
			return fail
		}
		return sp.Commit(ctx) // RELEASE SAVEPOINT: the inbox still commits or rolls back
	}
}

func TestSqlcPgx(t *testing.T) {
	t.Parallel()
	datalayer.Each(t, []datalayer.Backend{datalayer.Pgx}, func(t *testing.T, r *datalayer.Rig) {
		queries := pgxv5.New(r.Pool)
		r.RequireExactlyOnce(t, sqlcPgxHandler(queries))

		nested := sqlcPgxNested(queries)
		r.RequireJoined(t, r.FailFirstAttempt(t, false, func(msg *message.Message) error { return nested(msg, nil) }))
		r.RequireSavepoint(t, sqlcPgxHandler(queries), nested)

		// On the pool, the generated code and pool.Begin write outside
		// the inbox transaction.
		res := r.FailFirstAttempt(t, false, func(msg *message.Message) error {
			return queries.CreateInvoice(msg.Context(), msg.UUID)
		})
		r.RequireEscaped(t, res)
		require.True(t, res.UnusedTxReported)
		res = r.FailFirstAttempt(t, true, func(msg *message.Message) error {
			return pgx.BeginFunc(msg.Context(), r.Pool, func(tx pgx.Tx) error {
				return queries.WithTx(tx).CreateInvoice(msg.Context(), msg.UUID)
			})
		})
		r.RequireEscaped(t, res)
		require.False(t, res.UnusedTxReported)
	})
}
