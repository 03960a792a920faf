package sqlinbox_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/servicetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Two programs with different main packages, billing and mailer, each with
// a handler "handle_orders", consume the same orders into one inbox table,
// one process after the other, as two services deployed apart would, on
// PostgreSQL through both stores and on SQLite (the conformance suite
// checks the registry in one process on every database). The
// first owns the consumer; the second's messages are refused and its log
// says why, once, naming both services; billing restarted (a replica)
// finds its claims; mailer with a consumer name of its own processes every
// order.
func TestServicesSharingATable(t *testing.T) {
	t.Parallel()
	bin := buildServices(t)
	const pkg = "github.com/watermill-inbox/inbox/sqlinbox/testdata/services/"
	for _, tc := range []struct {
		name, driver, dsn string
		open              func(t testing.TB) *sql.DB
	}{
		{"PostgreSQL/sqlinbox", "pgx", testdb.PostgresDSN(), func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }},
		{"PostgreSQL/pgxinbox", "pgxpool", testdb.PostgresDSN(), func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }},
		{"MariaDB", "mysql", testdb.MySQLDSN(), testdb.MySQL},
		{"SQLite", "sqlite", "", testdb.SQLite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := tc.open(t)
			dsn := tc.dsn
			if tc.driver == "sqlite" {
				dsn = sqlinbox.SQLiteDSN(testdb.SQLiteFile(t))
			}
			table, effects := testdb.Table(t, db, "inbox"), testdb.Table(t, db, "effects")
			_, err := db.Exec(`CREATE TABLE ` + effects + ` (consumer VARCHAR(255) NOT NULL, event_id VARCHAR(255) NOT NULL)`)
			require.NoError(t, err)
			run := func(service string, args ...string) (servicetest.Report, string) {
				t.Helper()
				cmd := exec.Command(filepath.Join(bin, service), append([]string{"-driver", tc.driver, "-dsn", dsn, "-table", table, "-effects", effects}, args...)...)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				require.NoError(t, cmd.Run(), "%s: %s", service, stderr.String())
				var rep servicetest.Report
				require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "%s printed %q", service, stdout.String())
				require.Equal(t, pkg+service, rep.Service)
				return rep, stderr.String()
			}

			billing, _ := run("billing")
			require.Equal(t, map[string]int{"processed": 3}, billing.Outcomes)

			mailer, log := run("mailer")
			require.Equal(t, map[string]int{"miswired": 3}, mailer.Outcomes, "refused, not acked as duplicates")
			require.Empty(t, mailer.Processed)
			want := fmt.Sprintf(`consumer %q of this inbox table belongs to service %q, and this is service %q`, servicetest.HandlerName, pkg+"billing", pkg+"mailer")
			require.Contains(t, mailer.FirstErr, want)
			require.Equal(t, 1, bytes.Count([]byte(log), []byte(want)), "one error line per consumer:\n%s", log)
			require.Contains(t, log, "[watermill] ", "through Config.Logger")
			t.Logf("mailer's log:\n%s", log)

			replica, _ := run("billing")
			require.Equal(t, map[string]int{"duplicate": 3}, replica.Outcomes)

			renamed, log := run("mailer", "-consumer", "mailer."+servicetest.HandlerName)
			require.Equal(t, map[string]int{"processed": 3}, renamed.Outcomes, log)

			var n int
			require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+effects).Scan(&n))
			require.Equal(t, 6, n, "3 orders in each service")
		})
	}
}

// buildServices builds the service programs, with the race detector when
// this test binary has it, so that the build reuses the packages the tests
// compiled.
func buildServices(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	out, err := exec.Command("go", append(args, "./testdata/services/billing", "./testdata/services/mailer")...).CombinedOutput()
	require.NoError(t, err, "building the services: %s", out)
	return dir
}
