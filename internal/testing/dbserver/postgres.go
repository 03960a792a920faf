package dbserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Postgres is a PostgreSQL server of the test's own.
type Postgres struct {
	dir   string
	data  string
	owner owner
	bin   string
	port  int
	proc  *process
	extra []string // settings of StartPostgres
}

// PostgresBin returns the directory of the newest installed PostgreSQL's
// binaries (Debian puts them outside PATH).
func PostgresBin(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(dirs) == 0 {
		if initdb, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(initdb)
		}
		require.FailNow(t, "no PostgreSQL binaries: install the Debian package postgresql (./test.sh --install does)")
	}
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) < pgVersion(dirs[j]) })
	return dirs[len(dirs)-1]
}

func pgVersion(binDir string) int {
	var v int
	fmt.Sscanf(filepath.Base(filepath.Dir(binDir)), "%d", &v)
	return v
}

// StartPostgres initialises a database cluster in a temporary directory and
// starts its server on a free loopback port with trust authentication and
// settings ("name=value") on top of the suite's. It is killed and removed
// when the test ends.
func StartPostgres(t testing.TB, settings ...string) *Postgres {
	t.Helper()
	o := ownerFor(t, "postgres")
	p := &Postgres{owner: o, bin: PostgresBin(t)}
	for _, s := range settings {
		p.extra = append(p.extra, "-c", s)
	}
	p.dir = newDir(t, "postgres", o)
	p.data = filepath.Join(p.dir, "data")
	t.Cleanup(p.stop)
	initdb := exec.Command(filepath.Join(p.bin, "initdb"), "-D", p.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "-N")
	initdb.Dir = p.dir
	if o.switched {
		initdb = exec.Command("runuser", append([]string{"-u", o.name, "--"}, initdb.Args...)...)
	}
	out, err := initdb.CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		require.NoError(t, err)
		p.port = ports[0]
		if err = p.start(); err == nil {
			return p
		}
		// Another program may have taken the port first.
		require.Less(t, attempt, 3, "starting PostgreSQL: %v", err)
	}
}

// DSN returns the server's URL, on its database postgres.
func (p *Postgres) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Start starts the server again after Kill or Stop, on the same port and
// data: a killed server first replays its WAL (crash recovery). It returns
// when the server accepts connections.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	require.NoError(t, p.start())
}

func (p *Postgres) start() error {
	args := append([]string{"-D", p.data,
		"-c", "listen_addresses=127.0.0.1", "-p", fmt.Sprint(p.port), "-k", p.dir,
		"-c", "shared_buffers=32MB", "-c", "max_connections=200"}, p.extra...)
	proc, err := start(p.dir, p.owner, "postgres", filepath.Join(p.bin, "postgres"), args...)
	if err != nil {
		return err
	}
	p.proc = proc
	if err := waitUntil(proc, func() error { return pingPostgres(p.DSN()) }); err != nil {
		proc.kill()
		return err
	}
	return nil
}

// Kill SIGKILLs the postmaster and every backend it forked at once, as when
// the server's machine or container dies, and waits until they are gone.
// It returns when they died.
func (p *Postgres) Kill(t testing.TB) (killed time.Time) {
	t.Helper()
	require.NotNil(t, p.proc, "the server is not running")
	return p.proc.kill()
}

// Stop shuts the server down as pg_ctl stop and pg_ctl restart do by
// default (fast mode): SIGINT to the postmaster, which ends every session
// (FATAL, SQLSTATE 57P01), rolling back its transaction, refuses new ones
// (57P03), writes a checkpoint and exits. It returns when the server has
// exited; Start starts it again.
func (p *Postgres) Stop(t testing.TB) {
	t.Helper()
	require.NotNil(t, p.proc, "the server is not running")
	require.NoError(t, p.proc.stop(syscall.SIGINT))
}

// Log returns the end of the server's log.
func (p *Postgres) Log() string { return readLog(filepath.Join(p.dir, "postgres.log")) }

// RecoveredFromCrash reports whether the server's log shows a crash
// recovery: the start after a kill replayed the WAL.
func (p *Postgres) RecoveredFromCrash() bool {
	b, _ := os.ReadFile(filepath.Join(p.dir, "postgres.log"))
	return strings.Contains(string(b), "database system was interrupted") || strings.Contains(string(b), "automatic recovery in progress")
}

func (p *Postgres) stop() {
	if p.proc != nil {
		p.proc.kill()
	}
}

// pingPostgres connects to dsn once.
func pingPostgres(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}
