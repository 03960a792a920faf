package sqlinbox_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/depstest"
)

// sqlinbox links no driver of its own: a program gets the drivers it
// imports, and database/sql lists no other. MySQL errors are recognised
// without importing go-sql-driver/mysql (see error_mysql.go).
func TestLinksNoDriver(t *testing.T) {
	t.Parallel()
	depstest.Forbid(t, "github.com/watermill-inbox/inbox/sqlinbox", depstest.Drivers...)
	out, err := exec.Command("go", "run", "./testdata/drivers").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Empty(t, strings.Fields(string(out)), "sql.Drivers() of a program importing only sqlinbox")
}
