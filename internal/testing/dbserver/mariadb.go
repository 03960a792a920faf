package dbserver

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// installNoSync makes mariadb-install-db skip its fsyncs: a data directory
// that is being created has nothing to lose, and on a busy disk the syncs
// take seconds. The server itself then runs with its own settings.
const installNoSync = "--innodb-flush-method=nosync"

// MariaDB is a MariaDB server of the test's own.
type MariaDB struct {
	dir   string
	owner owner
	bin   string
	port  int
	extra []string
	proc  *process
}

// StartMariaDB installs a MariaDB data directory in a temporary directory
// and starts mariadbd on a free loopback port, with root reachable over TCP
// without a password and a database test. extra are more mariadbd
// options, such as --innodb-log-file-size=8M. It is killed and removed when
// the test ends.
func StartMariaDB(t testing.TB, extra ...string) *MariaDB {
	t.Helper()
	bin, err := exec.LookPath("mariadbd")
	if err != nil {
		bin = "/usr/sbin/mariadbd"
	}
	_, err = os.Stat(bin)
	require.NoError(t, err, "no mariadbd: install the Debian package mariadb-server (./test.sh --install does)")
	o := ownerFor(t, "")
	m := &MariaDB{owner: o, bin: bin, extra: extra}
	m.dir = newDir(t, "mariadb", o)
	t.Cleanup(m.stop)
	install := exec.Command("mariadb-install-db", "--no-defaults", "--user="+o.name, "--datadir="+filepath.Join(m.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", installNoSync)
	install.Dir = m.dir
	out, err := install.CombinedOutput()
	require.NoError(t, err, "mariadb-install-db: %s", out)
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		require.NoError(t, err)
		m.port = ports[0]
		if err = m.start(); err == nil {
			break
		}
		// Another program may have taken the port first.
		require.Less(t, attempt, 3, "starting MariaDB: %v", err)
	}
	db, err := sql.Open("mysql", "root@unix("+m.socket()+")/")
	require.NoError(t, err)
	defer db.Close()
	for _, stmt := range []string{
		"CREATE DATABASE IF NOT EXISTS test",
		"CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'",
		"GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
	} {
		_, err := db.Exec(stmt)
		require.NoError(t, err, stmt)
	}
	return m
}

func (m *MariaDB) socket() string { return filepath.Join(m.dir, "sock") }

// DSN returns the server's go-sql-driver/mysql DSN, on its database test.
func (m *MariaDB) DSN() string { return fmt.Sprintf("root@tcp(127.0.0.1:%d)/test", m.port) }

// Start starts the server again after Kill or Stop, on the same port and
// data: a killed server first recovers InnoDB from its redo log. It returns
// when the server accepts connections.
func (m *MariaDB) Start(t testing.TB) {
	t.Helper()
	require.NoError(t, m.start())
}

func (m *MariaDB) start() error {
	// innodb_flush_log_at_trx_commit stays 1 (the default): a commit is on
	// disk before it is acknowledged.
	args := append([]string{"--no-defaults", "--user=" + m.owner.name,
		"--datadir=" + filepath.Join(m.dir, "data"), "--socket=" + m.socket(), fmt.Sprintf("--port=%d", m.port),
		"--bind-address=127.0.0.1", "--skip-name-resolve", "--max-connections=300", "--innodb-buffer-pool-size=32M"}, m.extra...)
	proc, err := start(m.dir, m.owner, "mariadbd", m.bin, args...)
	if err != nil {
		return err
	}
	m.proc = proc
	if err := waitUntil(proc, m.ping); err != nil {
		proc.kill()
		return err
	}
	return nil
}

func (m *MariaDB) ping() error {
	c, err := mysql.NewConnector(&mysql.Config{User: "root", Net: "unix", Addr: m.socket(), AllowNativePasswords: true})
	if err != nil {
		return err
	}
	db := sql.OpenDB(c)
	defer db.Close()
	return db.Ping()
}

// Kill SIGKILLs mariadbd and waits until it is gone. It returns when it
// died.
func (m *MariaDB) Kill(t testing.TB) (killed time.Time) {
	t.Helper()
	require.NotNil(t, m.proc, "the server is not running")
	return m.proc.kill()
}

// Stop shuts the server down as a service manager does: SIGTERM to
// mariadbd, which ends every connection (a statement running gets error
// 1053 or 1927, or loses its connection), flushes InnoDB and exits. It
// returns when the server has exited; Start starts it again.
func (m *MariaDB) Stop(t testing.TB) {
	t.Helper()
	require.NotNil(t, m.proc, "the server is not running")
	require.NoError(t, m.proc.stop(syscall.SIGTERM))
}

// Log returns the end of the server's log.
func (m *MariaDB) Log() string { return readLog(filepath.Join(m.dir, "mariadbd.log")) }

// RecoveredFromCrash reports whether the server's log shows an InnoDB crash
// recovery: the start after a kill applied the redo log.
func (m *MariaDB) RecoveredFromCrash() bool {
	b, _ := os.ReadFile(filepath.Join(m.dir, "mariadbd.log"))
	return strings.Contains(string(b), "Starting crash recovery") || strings.Contains(string(b), "crash recovery")
}

func (m *MariaDB) stop() {
	if m.proc != nil {
		m.proc.kill()
	}
}
