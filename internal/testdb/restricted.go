package testdb

import (
	"database/sql"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// RestrictedPostgres creates a database of its own and a login role that
// owns it, revokes SELECT on each of the catalog views revoked from PUBLIC
// there (a hardened server's setting, confined to that database so that
// other tests keep theirs), and returns the URL the role connects with.
// The database and the role are dropped when the test ends.
func RestrictedPostgres(t testing.TB, revoked ...string) string {
	t.Helper()
	admin := Postgres(t, "postgres")
	role, name := Name("app"), Name("hardened")
	for _, stmt := range []string{"CREATE ROLE " + role + " LOGIN", "CREATE DATABASE " + name + " OWNER " + role} {
		_, err := admin.Exec(stmt)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + role)
	})
	u, err := url.Parse(PostgresDSN())
	require.NoError(t, err)
	u.Path = "/" + name
	super, err := sql.Open("postgres", u.String())
	require.NoError(t, err)
	defer super.Close()
	for _, view := range revoked {
		_, err := super.Exec("REVOKE SELECT ON pg_catalog." + view + " FROM PUBLIC")
		require.NoError(t, err)
	}
	u.User = url.User(role)
	return u.String()
}
