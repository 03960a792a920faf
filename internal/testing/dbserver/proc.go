package dbserver

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ServersDirEnv names the directory under which servers are started, when
// set (test.sh sets it); else os.TempDir. Each server's directory holds a
// file "pids" listing the processes started for it, so that test.sh can kill
// what a test binary that died (a timeout's panic runs no cleanup) left
// behind.
const ServersDirEnv = "INBOX_TEST_SERVERS_DIR"

// StartTimeout bounds how long a server may take to start.
const StartTimeout = 90 * time.Second

// StopTimeout bounds how long a server may take to shut down cleanly.
const StopTimeout = 60 * time.Second

// owner is the account a server runs as: as root, a system user such as
// postgres; otherwise this process's own user.
type owner struct {
	name     string
	uid, gid int
	switched bool // the processes run as another user than this one
}

func ownerFor(t testing.TB, system string) owner {
	t.Helper()
	if os.Geteuid() != 0 || system == "" {
		u, err := user.Current()
		require.NoError(t, err)
		return owner{name: u.Username, uid: os.Geteuid(), gid: os.Getegid()}
	}
	u, err := user.Lookup(system)
	require.NoError(t, err, "the %s user is missing (the Debian package creates it; ./test.sh --install installs it)", system)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return owner{name: system, uid: uid, gid: gid, switched: true}
}

// newDir makes the server's directory, owned by o, and removes it when the
// test ends, after every process of the server is dead (cleanups run last
// registered first, and the processes' cleanups are registered later).
func newDir(t testing.TB, kind string, o owner) string {
	t.Helper()
	base := os.Getenv(ServersDirEnv)
	if base == "" {
		base = os.TempDir()
	}
	require.NoError(t, os.MkdirAll(base, 0o755))
	dir, err := os.MkdirTemp(base, "inbox-"+kind+"-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Lchown(dir, o.uid, o.gid))
	return dir
}

// mkdirOwned makes a directory of the server owned by o, mode 0700 (what
// PostgreSQL and etcd want for their data).
func mkdirOwned(o owner, path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	return os.Lchown(path, o.uid, o.gid)
}

// writeOwned writes a file of the server, readable by o only.
func writeOwned(o owner, path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Lchown(path, o.uid, o.gid)
}

// process is one server process.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	log  string
}

// start starts bin as o, logging to dir/name.log, and records its pid in
// dir/pids.
func start(dir string, o owner, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	// A process group of its own: a signal to the test's group (a ^C)
	// does not reach it, and its cleanup kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if o.switched {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(o.uid), Gid: uint32(o.gid)}
		cmd.Env = append(os.Environ(), "HOME="+dir, "USER="+o.name, "LOGNAME="+o.name)
	}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	recordPid(dir, cmd.Process.Pid)
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(p.done)
	}()
	return p, nil
}

// recordPid appends pid to dir/pids, for test.sh's last-resort cleanup.
func recordPid(dir string, pid int) {
	f, err := os.OpenFile(filepath.Join(dir, "pids"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintln(f, pid)
	_ = f.Close()
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process and every process it started (see killTrees)
// and waits until they are gone. It returns when they died.
func (p *process) kill() (killed time.Time) {
	killed = time.Now()
	if !p.exited() {
		killed = killTrees(p.cmd.Process.Pid)
	}
	<-p.done
	return killed
}

// stop sends sig to the process alone, as an operator's shutdown does,
// and waits until it has exited, at most StopTimeout; then it kills it and
// every process it started, and says so.
func (p *process) stop(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(StopTimeout):
		p.kill()
		return fmt.Errorf("%s had not exited %s after %s: killed\n%s", p.name, StopTimeout, sig, readLog(p.log))
	}
}

// killTrees kills the processes roots and all their descendants at one
// instant, as when their machine dies: it stops every one of them with
// SIGSTOP first (a stopped process runs no more code, and a stopped parent
// forks no more children), then SIGKILLs them all, and waits until none
// runs. Killing a process group would not do: every PostgreSQL backend
// calls setsid, and outlives a killed postmaster until it notices, long
// enough to commit a transaction and acknowledge it.
func killTrees(roots ...int) (stopped time.Time) {
	var all []int
	seen := map[int]bool{}
	// Until a pass finds no new process: a child forked before its parent
	// stopped appears in the next one.
	for {
		found := false
		for _, pid := range descendants(roots) {
			if !seen[pid] {
				seen[pid], found = true, true
				all = append(all, pid)
				_ = syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if !found {
			break
		}
	}
	stopped = time.Now()
	for _, pid := range all {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range all {
		for running(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return stopped
}

// freeze stops the processes roots and their descendants with SIGSTOP, in
// one quick pass (killTrees catches what it missed), and returns when.
func freeze(roots []int) time.Time {
	for _, pid := range descendants(roots) {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	return time.Now()
}

// descendants returns roots and every live process descending from them.
func descendants(roots []int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(pid); ok && st.state != "Z" {
			children[st.ppid] = append(children[st.ppid], pid)
		}
	}
	var out []int
	var walk func(pid int)
	walk = func(pid int) {
		out = append(out, pid)
		for _, c := range children[pid] {
			walk(c)
		}
	}
	for _, r := range roots {
		if running(r) {
			walk(r)
		}
	}
	return out
}

type stat struct {
	state string
	ppid  int
}

// procStat reads a process's state and parent from /proc.
func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return stat{}, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 2 {
		return stat{}, false
	}
	ppid, _ := strconv.Atoi(fields[1])
	return stat{state: fields[0], ppid: ppid}, true
}

// running reports whether pid is a process that has not exited (a zombie
// waiting for its parent to reap it has).
func running(pid int) bool {
	st, ok := procStat(pid)
	return ok && st.state != "Z"
}

// postmaster returns the pid of the postmaster running on dataDir, from
// its postmaster.pid, once the process with that pid is checked to be it
// (a stale file's pid may belong to another process by now).
func postmaster(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s/postmaster.pid: no pid on its first line", dataDir)
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !strings.Contains(string(cmdline), dataDir) || !running(pid) {
		return 0, fmt.Errorf("no postmaster runs on %s", dataDir)
	}
	return pid, nil
}

// readLog returns a server's log, for failure messages.
func readLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	const tail = 8000
	if len(b) > tail {
		b = b[len(b)-tail:]
	}
	return string(b)
}

var (
	portsMu sync.Mutex
	handed  = map[int]bool{}
)

// freePorts returns n loopback TCP ports nothing listens on, never the same
// twice in this process. They lie in 10000-20000: below the ephemeral range
// (32768-60999), where a client connection's local port could keep a server
// from binding, and away from test.sh's throwaway servers (23000 and up),
// from a random start so that tests of several checkouts rarely meet.
func freePorts(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	var ports []int
	p := 10000 + rand.IntN(9000)
	for ; p < 20000 && len(ports) < n; p++ {
		if handed[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		_ = l.Close()
		handed[p] = true
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, errors.New("no free ports left in 10000-20000")
	}
	return ports, nil
}

// waitUntil polls ready until it returns nil, p exits, or StartTimeout
// passes.
func waitUntil(p *process, ready func() error) error {
	deadline := time.Now().Add(StartTimeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.name, err, readLog(p.log))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %v", p.nameOr("server"), StartTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *process) nameOr(def string) string {
	if p == nil {
		return def
	}
	return p.name
}
