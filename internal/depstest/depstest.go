package depstest

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Drivers are the database drivers the library's tests use, by module.
var Drivers = []string{
	"github.com/go-sql-driver/mysql",
	"github.com/jackc/pgx",
	"github.com/lib/pq",
	"modernc.org/sqlite",
}

// TestHelpers are the module's packages that only tests import. They link
// testify and read the test servers' settings, which a program using the
// library must not carry: no shipped package may link one.
var TestHelpers = []string{
	"github.com/watermill-inbox/inbox/internal/conformance",
	"github.com/watermill-inbox/inbox/internal/depstest",
	"github.com/watermill-inbox/inbox/internal/servicetest",
	"github.com/watermill-inbox/inbox/internal/testdb",
}

// Deps returns the import paths pkg depends on, itself included, as
// `go list -deps` prints them: the package as a program links it, without
// its tests.
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if exit, ok := err.(*exec.ExitError); ok {
		require.NoError(t, err, "go list -deps %s: %s", pkg, exit.Stderr)
	}
	require.NoError(t, err, "go list -deps %s", pkg)
	return strings.Fields(string(out))
}

// Forbid fails t when pkg depends on one of paths or on a package below
// one of them ("github.com/jackc/pgx" covers github.com/jackc/pgx/v5/pgconn).
func Forbid(t testing.TB, pkg string, paths ...string) {
	t.Helper()
	var found []string
	for _, dep := range Deps(t, pkg) {
		for _, p := range paths {
			if dep == p || strings.HasPrefix(dep, p+"/") {
				found = append(found, dep)
			}
		}
	}
	require.Empty(t, found, "%s links packages it must not", pkg)
}
