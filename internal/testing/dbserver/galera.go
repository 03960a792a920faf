package dbserver

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// galeraProvider is the Galera library of Debian's package galera-4.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// Galera is a three-node MariaDB Galera cluster of the test's own: every
// node accepts writes, and a write set is certified against the others' at
// COMMIT.
type Galera struct {
	Nodes []*GaleraNode
	// How long the start took: the data directory's installation, the
	// first node's bootstrap, the two others' joins (at once, each with a
	// full state transfer).
	Installed, Bootstrapped, Joined time.Duration

	dir   string
	owner owner
	bin   string
}

// GaleraNode is one mariadbd of a [Galera] cluster.
type GaleraNode struct {
	Name string
	Port int // clients'
	dir  string
	proc *process
}

// StartGalera bootstraps a cluster on a free set of loopback ports and
// returns once its three nodes are synced. As root every node runs as the
// mysql user: the joiners' state transfer (rsync) writes their data
// directory as the server's user. Everything is killed and removed when
// the test ends.
func StartGalera(t testing.TB) *Galera {
	t.Helper()
	bin, err := exec.LookPath("mariadbd")
	if err != nil {
		bin = "/usr/sbin/mariadbd"
	}
	for _, need := range []string{bin, galeraProvider} {
		_, err := os.Stat(need)
		require.NoError(t, err, "the Galera tests need mariadbd and the Debian package galera-4 (./test.sh --install installs it)")
	}
	_, err = exec.LookPath("rsync")
	require.NoError(t, err, "Galera's state transfer needs rsync: install the Debian package rsync (./test.sh --install does)")
	o := ownerFor(t, "mysql")
	for attempt := 1; ; attempt++ {
		g := &Galera{owner: o, bin: bin, dir: newDir(t, "galera", o)}
		err := g.start()
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() {
					for _, n := range g.Nodes {
						t.Logf("Galera node %s's log:\n%s", n.Name, n.Log())
					}
				}
				g.stop()
			})
			return g
		}
		g.stop()
		// Another program may have taken a port first.
		require.Less(t, attempt, 3, "starting the Galera cluster: %v", err)
	}
}

func (g *Galera) start() error {
	ports, err := freePorts(12)
	if err != nil {
		return err
	}
	// Per node: clients, group communication, incremental state
	// transfer, full state transfer (rsync's daemon).
	var peers []string
	for i := range 3 {
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", ports[4*i+1]))
	}
	for i := range 3 {
		n := &GaleraNode{Name: fmt.Sprintf("g%d", i+1), Port: ports[4*i], dir: filepath.Join(g.dir, fmt.Sprintf("g%d", i+1))}
		if err := mkdirOwned(g.owner, filepath.Join(n.dir, "data")); err != nil {
			return err
		}
		if err := os.Chmod(n.dir, 0o755); err != nil {
			return err
		}
		if err := os.Lchown(n.dir, g.owner.uid, g.owner.gid); err != nil {
			return err
		}
		if err := writeOwned(g.owner, n.config(), g.myCnf(n, peers, ports[4*i+1:4*i+4])); err != nil {
			return err
		}
		g.Nodes = append(g.Nodes, n)
	}
	first := g.Nodes[0]
	t0 := time.Now()
	install := exec.Command("mariadb-install-db", "--no-defaults", "--user="+g.owner.name, "--datadir="+filepath.Join(first.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--innodb-log-file-size="+GaleraRedoLog, installNoSync)
	install.Dir = first.dir
	if out, err := install.CombinedOutput(); err != nil {
		return fmt.Errorf("mariadb-install-db: %v: %s", err, out)
	}
	g.Installed = time.Since(t0)
	t0 = time.Now()
	if err := g.run(first, "--wsrep-new-cluster"); err != nil {
		return err
	}
	db, err := sql.Open("mysql", "root@unix("+first.socket()+")/")
	if err != nil {
		return err
	}
	defer db.Close()
	// Replicated to the joiners by their state transfer.
	for _, stmt := range []string{
		"CREATE DATABASE IF NOT EXISTS test",
		"CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'",
		"GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
	} {
		if _, err := db.Exec(stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	g.Bootstrapped = time.Since(t0)
	t0 = time.Now()
	// The joiners at once: each takes a full state transfer from the
	// first node.
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, n := range g.Nodes[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.run(n)
		}()
	}
	wg.Wait()
	g.Joined = time.Since(t0)
	return errors.Join(errs...)
}

// GaleraRedoLog is the size of a node's InnoDB redo log: small, so that a
// full state transfer, which copies it, takes a second rather than several
// (the default is 96 MB).
const GaleraRedoLog = "8M"

// GaleraServerOptions are the mariadbd options a single server needs to be
// compared with a [Galera] node: the same redo log and log flushing.
var GaleraServerOptions = []string{"--innodb-log-file-size=" + GaleraRedoLog, "--innodb-flush-log-at-trx-commit=2"}

// myCnf is node n's configuration: the settings Galera requires
// (binlog_format=ROW, innodb_autoinc_lock_mode=2), its loopback
// addresses, and group-communication timeouts short enough that a killed
// node leaves the cluster's view within seconds (the defaults take 15 s).
// innodb_flush_log_at_trx_commit=2, Galera's usual setting: a commit is
// durable once the cluster has it, and the log reaches the disk once a
// second ([GaleraServerOptions] give a single server the same). pc.recovery=false: a restarted node joins under a
// new identity instead of waiting for the cluster to forget its old one.
func (g *Galera) myCnf(n *GaleraNode, peers []string, ports []int) string {
	gmcast, ist, sst := ports[0], ports[1], ports[2]
	options := strings.Join([]string{
		fmt.Sprintf("gmcast.listen_addr=tcp://127.0.0.1:%d", gmcast),
		fmt.Sprintf("ist.recv_addr=127.0.0.1:%d", ist),
		"gcache.size=16M", "pc.recovery=false",
		"evs.keepalive_period=PT0.5S", "evs.inactive_check_period=PT0.5S", "evs.join_retrans_period=PT0.5S",
		"evs.suspect_timeout=PT3S", "evs.inactive_timeout=PT5S",
	}, ";")
	return fmt.Sprintf(`[mariadbd]
user=%[1]s
datadir=%[2]s/data
socket=%[2]s/sock
port=%[3]d
bind-address=127.0.0.1
skip-name-resolve
max-connections=300
innodb-buffer-pool-size=32M
innodb-log-file-size=%[10]s
innodb-flush-log-at-trx-commit=2
innodb-temp-data-file-path=ibtmp1:1M:autoextend
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=%[4]s
wsrep_cluster_name=inbox
wsrep_cluster_address=gcomm://%[5]s
wsrep_node_name=%[6]s
wsrep_node_address=127.0.0.1:%[7]d
wsrep_provider_options="%[8]s"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:%[9]d
`, g.owner.name, n.dir, n.Port, galeraProvider, strings.Join(peers, ","), n.Name, gmcast, options, sst, GaleraRedoLog)
}

func (n *GaleraNode) config() string { return filepath.Join(n.dir, "my.cnf") }
func (n *GaleraNode) socket() string { return filepath.Join(n.dir, "sock") }

// run starts node n's mariadbd with extra arguments and waits until the
// node is synced with the cluster.
func (g *Galera) run(n *GaleraNode, extra ...string) error {
	// In the cluster's directory, where test.sh looks for the pids file.
	p, err := start(g.dir, g.owner, n.Name, g.bin, append([]string{"--defaults-file=" + n.config()}, extra...)...)
	if err != nil {
		return err
	}
	n.proc = p
	if err := waitUntil(p, n.synced); err != nil {
		p.kill()
		return err
	}
	return nil
}

// synced is nil once the node is ready for clients and synced with a
// primary component.
func (n *GaleraNode) synced() error {
	st, err := n.status()
	if err != nil {
		return err
	}
	if st["wsrep_ready"] != "ON" || st["wsrep_local_state_comment"] != "Synced" || st["wsrep_cluster_status"] != "Primary" {
		return fmt.Errorf("node %s: %v", n.Name, st)
	}
	return nil
}

// status reads the node's wsrep status variables that say whether it
// serves clients, over its socket.
func (n *GaleraNode) status() (map[string]string, error) {
	c, err := mysql.NewConnector(&mysql.Config{User: "root", Net: "unix", Addr: n.socket(), AllowNativePasswords: true, Timeout: 2 * time.Second})
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	defer db.Close()
	rows, err := db.Query(`SHOW STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state_comment', 'wsrep_cluster_size', 'wsrep_cluster_status')`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	st := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		st[k] = v
	}
	return st, rows.Err()
}

// DSN returns node n's go-sql-driver/mysql DSN, on its database test.
func (n *GaleraNode) DSN() string { return fmt.Sprintf("root@tcp(127.0.0.1:%d)/test", n.Port) }

// Kill SIGKILLs node n's mariadbd, as when its machine dies, and waits
// until it is gone. The other two keep a majority and go on once they have
// evicted it (evs.suspect_timeout). It returns when the node died.
func (g *Galera) Kill(t testing.TB, n *GaleraNode) (killed time.Time) {
	t.Helper()
	require.NotNil(t, n.proc, "node %s is not running", n.Name)
	return n.proc.kill()
}

// WaitEvicted waits until the other nodes have evicted node n, killed:
// they form a primary component of two, where commits go on. It returns
// how long after killed that was.
func (g *Galera) WaitEvicted(t testing.TB, n *GaleraNode, killed time.Time) time.Duration {
	t.Helper()
	require.NoError(t, waitUntil(nil, func() error {
		for _, o := range g.Nodes {
			if o == n {
				continue
			}
			st, err := o.status()
			if err != nil {
				return err
			}
			if st["wsrep_cluster_size"] != fmt.Sprint(len(g.Nodes)-1) || st["wsrep_cluster_status"] != "Primary" {
				return fmt.Errorf("node %s: %v", o.Name, st)
			}
		}
		return nil
	}))
	return time.Since(killed)
}

// recovered is the line of mariadbd --wsrep-recover that gives the
// position InnoDB recovered.
var recovered = regexp.MustCompile(`WSREP: Recovered position: ([0-9a-f-]{36}:-?[0-9]+)`)

// Restart starts a killed node again, once the others evicted it (as a
// machine that reboots comes back after that), the way its service manager
// would:
// mariadbd --wsrep-recover reads the last committed position from InnoDB
// (a killed node's grastate.dat says -1), and the node starts from there,
// so the cluster sends it only the write sets it missed (an incremental
// state transfer from a donor's gcache). It returns once the node is
// synced.
func (g *Galera) Restart(t testing.TB, n *GaleraNode) {
	t.Helper()
	g.WaitEvicted(t, n, time.Now())
	logPath := filepath.Join(n.dir, "recover.log")
	_ = os.Remove(logPath)
	recover := exec.Command(g.bin, "--defaults-file="+n.config(), "--wsrep-recover", "--log-error="+logPath)
	recover.Dir = n.dir
	recover.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if g.owner.switched {
		recover.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(g.owner.uid), Gid: uint32(g.owner.gid)}
	}
	out, err := recover.CombinedOutput()
	require.NoError(t, err, "mariadbd --wsrep-recover: %s\n%s", out, readLog(logPath))
	m := recovered.FindStringSubmatch(readLog(logPath))
	require.NotNil(t, m, "mariadbd --wsrep-recover found no position:\n%s", readLog(logPath))
	require.NoError(t, g.run(n, "--wsrep-start-position="+m[1]), "restarting Galera node %s", n.Name)
}

// IncrementalTransfer reports whether node n's last join received the
// write sets it missed incrementally (IST) rather than a full copy (SST).
func (n *GaleraNode) IncrementalTransfer() bool {
	b, _ := os.ReadFile(n.proc.log)
	last := string(b)
	if i := strings.LastIndex(last, "Starting MariaDB"); i >= 0 {
		last = last[i:]
	}
	return strings.Contains(last, "rsync IST completed on joiner")
}

// Log returns the end of node n's log.
func (n *GaleraNode) Log() string {
	if n.proc == nil {
		return "(never started)"
	}
	return readLog(n.proc.log)
}

func (g *Galera) stop() {
	for _, n := range g.Nodes {
		if n.proc != nil {
			n.proc.kill()
		}
	}
}
