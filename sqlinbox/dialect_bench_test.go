package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// BenchmarkClaim measures one claim and its commit per dialect, for a new
// event and for a duplicate, on one connection after another (no
// contention): what the inbox adds to each message.
//
//	go test -run '^$' -bench BenchmarkClaim ./sqlinbox/
func BenchmarkClaim(b *testing.B) {
	for _, d := range []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(testing.TB) *sql.DB
	}{
		{"PostgreSQL", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }},
		{"MySQL", sqlinbox.MySQL, testdb.MySQL},
		{"SQLite", sqlinbox.SQLite, testdb.SQLite},
	} {
		b.Run(d.name, func(b *testing.B) {
			ctx := context.Background()
			db := d.open(b)
			store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: d.dialect, Table: testdb.Table(b, db, "inbox")})
			require.NoError(b, err)
			require.NoError(b, store.CreateSchema(ctx))
			b.Run("new", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					tx, claimed, err := claim(ctx, store, nil, "c", fmt.Sprintf("ev-%d", i))
					require.NoError(b, err)
					require.True(b, claimed)
					require.NoError(b, tx.Commit())
				}
			})
			b.Run("duplicate", func(b *testing.B) {
				for b.Loop() {
					_, claimed, err := claim(ctx, store, nil, "c", "ev-0")
					require.NoError(b, err)
					require.False(b, claimed)
				}
			})
		})
	}
}
