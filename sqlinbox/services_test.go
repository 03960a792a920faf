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
// as two services deployed apart would, on PostgreSQL through both stores,
// MariaDB and SQLite. They share one claim per event, which is suspicious
// but never refused: mailer, started at once after billing exited (its
// lease still live), processes its messages (as duplicates of billing's)
// and warns from its first message on, once in its log, naming billing, as
// a warning rather than an error.
// Once billing has been gone for longer than its lease (aged here, as two
// minutes would), mailer under the same name is the renamed service of a
// deploy: it processes without a word.
func TestServicesSharingATable(t *testing.T) {
	t.Parallel()
	bin := buildServices(t)
	const pkg = "github.com/watermill-inbox/inbox/sqlinbox/testdata/services/"
	for _, tc := range []struct {
		name, driver, dsn string
		open              func(t testing.TB) *sql.DB
		age               string // makes every lease two minutes old
	}{
		{"PostgreSQL/sqlinbox", "pgx", testdb.PostgresDSN(), func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }, `UPDATE %s SET seen_at = now() - interval '2 minutes'`},
		{"PostgreSQL/pgxinbox", "pgxpool", testdb.PostgresDSN(), func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }, `UPDATE %s SET seen_at = now() - interval '2 minutes'`},
		{"MariaDB", "mysql", testdb.MySQLDSN(), testdb.MySQL, `UPDATE %s SET seen_at = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE`},
		{"SQLite", "sqlite", "", testdb.SQLite, `UPDATE %s SET seen_at = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now', '-2 minutes')`},
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

			billing, log := run("billing")
			require.Equal(t, map[string]int{"processed": 3}, billing.Outcomes)
			require.Empty(t, billing.Warnings, log)

			mailer, log := run("mailer")
			require.Equal(t, map[string]int{"duplicate": 3}, mailer.Outcomes, "processed, as duplicates of billing's claims")
			require.Equal(t, map[string]int{"shared_consumer": 3}, mailer.Warnings, "every message, the first included")
			want := fmt.Sprintf(`shares consumer %q with %s`, servicetest.HandlerName, pkg+"billing")
			require.Equal(t, 1, bytes.Count([]byte(log), []byte(want)), "one line per consumer:\n%s", log)
			require.NotContains(t, log, "level=ERROR", "a suspicion is not an error")
			require.NotContains(t, log, "miswired")
			require.Contains(t, log, "[watermill] ", "through Config.Logger")
			t.Logf("mailer's log:\n%s", log)

			_, err = db.Exec(fmt.Sprintf(tc.age, table+"_leases"))
			require.NoError(t, err)
			renamed, log := run("mailer")
			require.Equal(t, map[string]int{"duplicate": 3}, renamed.Outcomes)
			require.Empty(t, renamed.Warnings, log)
			require.NotContains(t, log, "shares consumer")

			own, log := run("mailer", "-consumer", "mailer."+servicetest.HandlerName)
			require.Equal(t, map[string]int{"processed": 3}, own.Outcomes, log)
			require.Empty(t, own.Warnings, log)

			var n int
			require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+effects).Scan(&n))
			require.Equal(t, 6, n, "3 orders in each consumer")
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
