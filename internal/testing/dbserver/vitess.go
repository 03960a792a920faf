package dbserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Vitess is a vttestserver of a test binary's own: vtcombo (vtgate and one
// vttablet per shard in one process) in front of one MariaDB server whose
// databases are the keyspace's shards. Built from the Vitess release
// internal/testing/vitess/tools pins, on the installed MariaDB: there is no
// MySQL 8 package here, and Vitess's MariaDB support needs three changes to
// its configuration (see writeVTRoot).
type Vitess struct {
	dir      string
	owner    owner
	keyspace string
	shards   []string
	port     int // vtgate's MySQL protocol
	proc     *process
	// Built is how long building (or finding in the build cache) the
	// binaries took; Started, how long the server then took to serve every
	// shard.
	Built, Started time.Duration
}

// VitessConfig configures [StartVitess].
type VitessConfig struct {
	// Keyspace is the sharded keyspace, also the database name of DSN.
	Keyspace string
	// Shards is the number of shards, each a database of the MariaDB
	// server; their key ranges split the keyspace evenly.
	Shards int
	// TransactionMode is vtgate's --transaction-mode: SINGLE, MULTI or
	// TWOPC.
	TransactionMode string
}

// VitessVersion is the Vitess release the tests run.
const VitessVersion = "v0.24.4"

// vitessTools are the binaries vttestserver runs: itself, vtcombo, and
// mysqlctl, which sets up MariaDB.
var vitessTools = []string{"vttestserver", "vtcombo", "mysqlctl"}

// StartVitess builds Vitess's test server (Go's build cache keeps the
// binaries: only the first build on a machine compiles, for minutes) and
// starts it on loopback ports with a sharded keyspace, as a user other than
// root (mysqlctl refuses root): the mysql user when this is root. It
// returns once every shard's primary serves. A test binary's TestMain
// starts it once and calls [Vitess.Stop]; the directory is under
// [ServersDirEnv], its processes listed for test.sh's last-resort cleanup.
func StartVitess(config VitessConfig) (*Vitess, error) {
	o, err := lookupOwner("mysql")
	if err != nil {
		return nil, err
	}
	v := &Vitess{owner: o, keyspace: config.Keyspace, shards: evenShards(config.Shards)}
	t0 := time.Now()
	bins, moduleDir, err := buildVitess()
	if err != nil {
		return nil, err
	}
	v.Built = time.Since(t0)
	if v.dir, err = makeDir("vitess", o); err != nil {
		return nil, err
	}
	if err := v.writeVTRoot(bins, moduleDir); err != nil {
		v.Stop()
		return nil, err
	}
	t0 = time.Now()
	for attempt := 1; ; attempt++ {
		if err = v.start(config); err == nil {
			break
		}
		if attempt == 3 {
			v.Stop()
			return nil, fmt.Errorf("starting vttestserver: %w", err)
		}
		// Another program may have taken a port first.
		v.killAll()
		_ = os.RemoveAll(filepath.Join(v.dir, "data"))
	}
	v.Started = time.Since(t0)
	return v, nil
}

// DSN returns vtgate's go-sql-driver/mysql DSN on the keyspace. vtgate
// takes any user without a password.
func (v *Vitess) DSN() string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", v.port, v.keyspace)
}

// ShardDSN returns a DSN whose statements vtgate sends to one shard only
// (a database name "keyspace:shard"), for counting a shard's rows.
func (v *Vitess) ShardDSN(shard string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s:%s", v.port, v.keyspace, shard)
}

// DirectDSN returns a DSN on MariaDB itself, past vtgate and vttablet,
// on shard's database (vt_KEYSPACE_SHARD), through its socket as vt_dba.
func (v *Vitess) DirectDSN(shard string) string {
	socks, _ := filepath.Glob(filepath.Join(v.dir, "data", "vt_*", "mysql.sock"))
	sock := filepath.Join(v.dir, "data", "vt_0000000001", "mysql.sock")
	if len(socks) > 0 {
		sock = socks[0]
	}
	return fmt.Sprintf("vt_dba@unix(%s)/vt_%s_%s", sock, v.keyspace, shard)
}

// Shards returns the shards' names, in key order ("-80", "80-").
func (v *Vitess) Shards() []string { return v.shards }

// Log returns the end of vttestserver's log.
func (v *Vitess) Log() string { return readLog(filepath.Join(v.dir, "vttestserver.log")) }

// Stop kills the server, vtcombo and MariaDB, and removes the directory.
func (v *Vitess) Stop() {
	v.killAll()
	if v.dir != "" {
		_ = os.RemoveAll(v.dir)
	}
}

// killAll kills vttestserver with vtcombo, and MariaDB, which mysqlctl
// started in the background: its mysqld_safe is a child of init, not of
// vttestserver.
func (v *Vitess) killAll() {
	if v.proc != nil {
		v.proc.kill()
		v.proc = nil
	}
	if pids := v.mysqlPids(); len(pids) > 0 {
		killTrees(pids...)
	}
}

// mysqlPids returns mysqld_safe's and mariadbd's pids when they run on the
// server's directory.
func (v *Vitess) mysqlPids() []int {
	files, _ := filepath.Glob(filepath.Join(v.dir, "data", "vt_*", "mysql.pid"))
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || !v.owns(pid) {
			continue
		}
		if st, ok := procStat(pid); ok && v.owns(st.ppid) {
			pids = append(pids, st.ppid) // mysqld_safe, which restarts a dead mariadbd
		}
		pids = append(pids, pid)
	}
	return pids
}

// owns reports whether pid runs with the server's directory on its
// command line.
func (v *Vitess) owns(pid int) bool {
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return err == nil && running(pid) && strings.Contains(string(cmdline), v.dir)
}

// buildVitess builds the binaries with go tool from the pinning module,
// which leaves them in Go's build cache, and returns their paths and the
// directory of the Vitess module's source (its configuration files).
func buildVitess() (bins map[string]string, moduleDir string, err error) {
	_, file, _, _ := runtime.Caller(0)
	tools := filepath.Join(filepath.Dir(file), "..", "vitess", "tools")
	bins = map[string]string{}
	for _, name := range vitessTools {
		cmd := exec.Command("go", "tool", "-n", name)
		cmd.Dir = tools
		out, err := cmd.Output()
		if err != nil {
			return nil, "", fmt.Errorf("building %s (Vitess %s) in %s: %w\n%s", name, VitessVersion, tools, err, stderrOf(err))
		}
		bins[name] = strings.TrimSpace(string(out))
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "vitess.io/vitess")
	cmd.Dir = tools
	out, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("finding the Vitess module's source: %w\n%s", err, stderrOf(err))
	}
	return bins, strings.TrimSpace(string(out)), nil
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

// writeVTRoot lays out the VTROOT vttestserver reads: bin/ with the
// binaries (the build cache may be unreadable for the server's user),
// and config/ with Vitess's files changed for MariaDB 10.11:
//   - mysqlctl's my.cnf template without the semi-sync plugin-load line
//     (MariaDB has semi-sync built in, and no such plugin file), through a
//     wrapper that passes it with --mysqlctl-mycnf-template;
//   - test-suite.cnf's super-read-only made loose- (MariaDB has none);
//   - init_db.sql without its super_read_only statements.
func (v *Vitess) writeVTRoot(bins map[string]string, moduleDir string) error {
	root := filepath.Join(v.dir, "root")
	cnfDir := filepath.Join(root, "config", "mycnf")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(cnfDir, 0o755); err != nil {
		return err
	}
	read := func(rel string) (string, error) {
		b, err := os.ReadFile(filepath.Join(moduleDir, "config", rel))
		return string(b), err
	}
	var files [4]string
	for i, rel := range []string{"mycnf/default.cnf", "mycnf/mariadb10.cnf", "mycnf/test-suite.cnf", "init_db.sql"} {
		var err error
		if files[i], err = read(rel); err != nil {
			return fmt.Errorf("reading Vitess's configuration: %w", err)
		}
	}
	suite := strings.ReplaceAll(files[2], "\nsuper-read-only", "\nloose-super-read-only")
	template := "[mysqld]\n" + files[0] + dropLines(files[1], "plugin-load") + suite
	initDB := dropLines(files[3], "SET @original_super_read_only", "SET GLOBAL super_read_only")
	writes := map[string]string{
		filepath.Join(cnfDir, "mariadb.cnf.tmpl"): template,
		// vttestserver passes it to mysqlctl; the template already holds it.
		filepath.Join(cnfDir, "test-suite.cnf"):                    suite,
		filepath.Join(root, "config", "init_db.sql"):               initDB,
		filepath.Join(v.dir, "schema", v.keyspace, "vschema.json"): `{"sharded": true}`,
		filepath.Join(root, "bin", "mysqlctl"): fmt.Sprintf("#!/bin/sh\nexec %s --mysqlctl-mycnf-template=%s \"$@\"\n",
			filepath.Join(root, "bin", "mysqlctl.bin"), filepath.Join(cnfDir, "mariadb.cnf.tmpl")),
	}
	for path, content := range writes {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			return err
		}
	}
	if err := chownTree(v.dir, v.owner); err != nil {
		return err
	}
	// Last, so that the chown above leaves the build cache's files alone.
	for name, bin := range bins {
		dest := name
		if name == "mysqlctl" {
			dest = "mysqlctl.bin"
		}
		// A hard link where the build cache is on the same file system:
		// the cache's directories may be closed to the server's user, its
		// files (0755) are not.
		if err := os.Link(bin, filepath.Join(root, "bin", dest)); err == nil {
			continue
		}
		if err := copyFile(bin, filepath.Join(root, "bin", dest), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// dropLines removes the lines of s that start with one of prefixes.
func dropLines(s string, prefixes ...string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	for _, l := range lines {
		drop := false
		for _, p := range prefixes {
			drop = drop || strings.HasPrefix(strings.TrimSpace(l), p)
		}
		if !drop {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (v *Vitess) start(config VitessConfig) error {
	base, err := consecutiveFreePorts(4)
	if err != nil {
		return err
	}
	// vttestserver's ports: base for vtcombo's HTTP, +1 its gRPC, +2
	// MariaDB, +3 vtgate's MySQL protocol.
	v.port = base + 3
	data := filepath.Join(v.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	if err := chownTree(data, v.owner); err != nil {
		return err
	}
	root := filepath.Join(v.dir, "root")
	// env sets the variables vttest reads (start passes this process's
	// environment on).
	proc, err := start(v.dir, v.owner, "vttestserver", "/usr/bin/env",
		"VTROOT="+root, "VTDATAROOT="+data, "VT_MYSQL_ROOT=/usr", "HOME="+v.dir,
		filepath.Join(root, "bin", "vttestserver"),
		"--port", strconv.Itoa(base),
		"--keyspaces", v.keyspace, "--num-shards", strconv.Itoa(len(v.shards)),
		// A sharded vschema: without one the keyspace counts as unsharded,
		// and DDL fails with "Keyspace does not have exactly one shard".
		"--schema-dir", filepath.Join(v.dir, "schema"),
		"--replica-count", "0", "--rdonly-count", "0",
		"--mysql-bind-host", "127.0.0.1", "--vtcombo-bind-host", "127.0.0.1", "--tablet-hostname", "127.0.0.1",
		"--data-dir", data,
		"--transaction-mode", config.TransactionMode,
		// ALTER VSCHEMA through vtgate, which the tests use to shard their
		// tables.
		"--vschema-ddl-authorized-users", "%",
		"--enable-online-ddl=false")
	if err != nil {
		return err
	}
	v.proc = proc
	err = waitUntil(proc, v.serving)
	// vtcombo, and MariaDB outside vttestserver's tree, for test.sh.
	pids := v.mysqlPids()
	if tree := descendants([]int{proc.cmd.Process.Pid}); len(tree) > 1 {
		pids = append(pids, tree[1:]...)
	}
	for _, pid := range pids {
		recordPid(v.dir, pid)
	}
	return err
}

// serving reports whether vtgate answers and every shard's primary serves.
func (v *Vitess) serving() error {
	c, err := mysql.NewConnector(&mysql.Config{User: "root", Net: "tcp", Addr: fmt.Sprintf("127.0.0.1:%d", v.port), DBName: v.keyspace, AllowNativePasswords: true, Timeout: time.Second})
	if err != nil {
		return err
	}
	db := sql.OpenDB(c)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SHOW VITESS_TABLETS")
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	serving := map[string]bool{}
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		if row["Keyspace"] == v.keyspace && row["TabletType"] == "PRIMARY" && row["State"] == "SERVING" {
			serving[row["Shard"]] = true
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, s := range v.shards {
		if !serving[s] {
			return fmt.Errorf("shard %s has no serving primary yet", s)
		}
	}
	return nil
}

// evenShards names n shards splitting the keyspace id range evenly, as
// vttestserver does: "-80", "80-" for two.
func evenShards(n int) []string {
	if n <= 1 {
		return []string{"0"}
	}
	bound := func(i int) string {
		if i == 0 || i == n {
			return ""
		}
		return fmt.Sprintf("%02x", i*256/n)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = bound(i) + "-" + bound(i+1)
	}
	return out
}

// lookupOwner is ownerFor outside a test: system (when root) or this
// process's user.
func lookupOwner(system string) (owner, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return owner{}, err
		}
		return owner{name: u.Username, uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := user.Lookup(system)
	if err != nil {
		return owner{}, fmt.Errorf("the %s user is missing (the Debian package mariadb-server creates it; ./test.sh --install installs it): %w", system, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return owner{name: system, uid: uid, gid: gid, switched: true}, nil
}

// makeDir is newDir outside a test: the caller removes it.
func makeDir(kind string, o owner) (string, error) {
	base := os.Getenv(ServersDirEnv)
	if base == "" {
		base = os.TempDir()
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(base, "inbox-"+kind+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	return dir, os.Lchown(dir, o.uid, o.gid)
}

func chownTree(dir string, o owner) error {
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, o.uid, o.gid)
	})
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// consecutiveFreePorts returns the first of n consecutive free loopback
// ports in 10000-20000, as freePorts hands them out.
func consecutiveFreePorts(n int) (int, error) {
	for range 50 {
		ports, err := freePorts(n)
		if err != nil {
			return 0, err
		}
		ok := true
		for i := 1; i < n; i++ {
			ok = ok && ports[i] == ports[0]+i
		}
		if ok {
			return ports[0], nil
		}
	}
	return 0, errors.New("no run of free ports in 10000-20000")
}
