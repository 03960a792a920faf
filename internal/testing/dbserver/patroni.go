package dbserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// ClusterConfig configures [StartCluster].
type ClusterConfig struct {
	// Synchronous is Patroni's synchronous_mode: the primary acknowledges a
	// commit only once a synchronous standby has it, and Patroni promotes
	// only that standby. Defaults to false: asynchronous streaming, where a
	// failover loses what the promoted replica had not received yet.
	Synchronous bool

	// ReplicationDelay is added to each direction of every connection
	// between nodes (replication streams and base backups), through a TCP
	// proxy per node, so that a round trip between servers takes twice as
	// long: on loopback a replica receives a commit within microseconds,
	// which no deployment with servers on separate machines sees. Clients
	// connect directly. Defaults to 0: no proxy.
	ReplicationDelay time.Duration
}

// Patroni settings that make a failover take seconds: the leader key
// expires TTL after the leader's last renewal, and every node loops each
// loopWait. Patroni requires loopWait + 2*retryTimeout <= ttl.
const (
	ttl          = 10
	loopWait     = 1
	retryTimeout = 4
)

// superuserPassword is the postgres user's: Patroni's bootstrap refuses an
// empty one. Authentication is trust on loopback all the same.
const superuserPassword = "inbox-test"

// Cluster is a three-node PostgreSQL cluster under Patroni, with one etcd
// member as its configuration store, every process on loopback ports.
type Cluster struct {
	Nodes   []*Node
	config  ClusterConfig
	dir     string
	owner   owner
	etcd    *process
	toxics  *toxiproxy.ApiServer
	proxies []*toxiproxy.Proxy
}

// Node is one PostgreSQL server of a cluster and the Patroni that manages
// it.
type Node struct {
	Name    string
	Port    int // PostgreSQL's
	APIPort int // Patroni's REST API
	relay   int // the port other nodes reach its PostgreSQL on
	dir     string
	patroni *process
	link    *toxiproxy.Proxy // other nodes' way to its PostgreSQL, with ReplicationDelay
}

// StartCluster starts etcd and three Patroni nodes and returns once the
// cluster has a leader that streams to both replicas (one of them
// synchronous, with ClusterConfig.Synchronous). Everything is killed and
// removed when the test ends.
func StartCluster(t testing.TB, config ClusterConfig) *Cluster {
	t.Helper()
	for _, bin := range []string{"patroni", "etcd"} {
		_, err := exec.LookPath(bin)
		require.NoError(t, err, "the failover tests run Patroni with etcd: install the Debian packages patroni and etcd-server (./test.sh --install does)")
	}
	bin := PostgresBin(t)
	o := ownerFor(t, "postgres")
	for attempt := 1; ; attempt++ {
		c := &Cluster{config: config, owner: o, dir: newDir(t, "patroni", o)}
		err := c.start(bin)
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() {
					for _, n := range c.Nodes {
						t.Logf("Patroni %s's log:\n%s", n.Name, n.Log())
					}
				}
				c.stop()
			})
			return c
		}
		c.stop()
		// Another program may have taken a port first.
		require.Less(t, attempt, 3, "starting the Patroni cluster: %v", err)
	}
}

func (c *Cluster) start(bin string) error {
	ports, err := freePorts(11)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer := ports[0], ports[1]
	if err := mkdirOwned(c.owner, filepath.Join(c.dir, "etcd")); err != nil {
		return err
	}
	c.etcd, err = start(c.dir, c.owner, "etcd", "etcd", "--name", "inbox", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", url(etcdClient), "--advertise-client-urls", url(etcdClient),
		"--listen-peer-urls", url(etcdPeer), "--initial-advertise-peer-urls", url(etcdPeer),
		"--initial-cluster", "inbox="+url(etcdPeer), "--enable-v2=true")
	if err != nil {
		return err
	}
	if err := waitUntil(c.etcd, func() error { return getJSON(url(etcdClient)+"/health", new(map[string]any)) }); err != nil {
		return err
	}
	scope := filepathBase(c.dir)
	for i := range 3 {
		n := &Node{Name: fmt.Sprintf("n%d", i+1), Port: ports[2+i], APIPort: ports[5+i], relay: ports[2+i]}
		if c.config.ReplicationDelay > 0 {
			if n.link, err = c.delay(n.Name, ports[8+i], n.Port); err != nil {
				return err
			}
			n.relay = ports[8+i]
		}
		n.dir = filepath.Join(c.dir, n.Name)
		if err := mkdirOwned(c.owner, n.dir); err != nil {
			return err
		}
		conf := filepath.Join(n.dir, "patroni.yml")
		if err := writeOwned(c.owner, conf, c.patroniYAML(scope, n, bin, etcdClient)); err != nil {
			return err
		}
		if n.patroni, err = start(c.dir, c.owner, n.Name, "patroni", conf); err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
	}
	return waitUntil(nil, c.healthy)
}

// delay starts a proxy on port to upstream that delays every byte by
// ReplicationDelay in each direction.
func (c *Cluster) delay(name string, port, upstream int) (*toxiproxy.Proxy, error) {
	if c.toxics == nil {
		c.toxics = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	}
	p := toxiproxy.NewProxy(c.toxics, name, fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", upstream))
	if err := p.Start(); err != nil {
		return nil, err
	}
	c.proxies = append(c.proxies, p)
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, c.config.ReplicationDelay.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func url(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }

func filepathBase(dir string) string {
	return strings.NewReplacer("-", "_", ".", "_").Replace(filepath.Base(dir))
}

// patroniYAML is node n's configuration. The parameters keep the servers
// small (shared_buffers) and a failover fast (ttl, loop_wait).
func (c *Cluster) patroniYAML(scope string, n *Node, bin string, etcdPort int) string {
	return fmt.Sprintf(`scope: %[1]s
name: %[2]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd:
  host: 127.0.0.1:%[4]d
bootstrap:
  dcs:
    ttl: %[5]d
    loop_wait: %[6]d
    retry_timeout: %[7]d
    maximum_lag_on_failover: 1048576
    synchronous_mode: %[8]t
    postgresql:
      use_pg_rewind: false
      parameters:
        shared_buffers: 32MB
        max_connections: 200
        wal_level: replica
        hot_standby: "on"
  initdb:
    - encoding: UTF8
    - no-locale
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[9]d
  connect_address: 127.0.0.1:%[13]d
  data_dir: %[10]s/data
  bin_dir: %[11]s
  pgpass: %[10]s/pgpass
  authentication:
    superuser:
      username: postgres
      password: %[12]s
    replication:
      username: postgres
      password: %[12]s
  parameters:
    unix_socket_directories: %[10]s
`, scope, n.Name, n.APIPort, etcdPort, ttl, loopWait, retryTimeout, c.config.Synchronous, n.Port, n.dir, bin, superuserPassword, n.relay)
}

// member is one entry of Patroni's GET /cluster.
type member struct {
	Name  string `json:"name"`
	Role  string `json:"role"` // leader, replica, sync_standby
	State string `json:"state"`
}

// status is the part of Patroni's GET /patroni a health check reads.
type status struct {
	State       string `json:"state"`
	Role        string `json:"role"`
	Replication []struct {
		Name      string `json:"application_name"`
		State     string `json:"state"`
		SyncState string `json:"sync_state"`
	} `json:"replication"`
}

// healthy is nil once the leader's PostgreSQL runs and streams to both
// replicas' PostgreSQL (not merely to the base backups they start from,
// whose WAL streams look alike), one synchronously when the cluster is
// synchronous, and Patroni reports both replicas running.
func (c *Cluster) healthy() error {
	for _, n := range c.Nodes {
		if n.patroni.exited() {
			return fmt.Errorf("patroni %s exited:\n%s", n.Name, readLog(n.patroni.log))
		}
	}
	leader, err := c.leader(nil)
	if err != nil {
		return err
	}
	var st status
	if err := getJSON(url(leader.APIPort)+"/patroni", &st); err != nil {
		return err
	}
	var cl struct{ Members []member }
	if err := getJSON(url(leader.APIPort)+"/cluster", &cl); err != nil {
		return err
	}
	running := map[string]bool{}
	for _, m := range cl.Members {
		running[m.Name] = m.State == "running" && m.Role != "leader"
	}
	streaming, sync := 0, 0
	for _, r := range st.Replication {
		if r.State == "streaming" && running[r.Name] {
			streaming++
			if r.SyncState == "sync" {
				sync++
			}
		}
	}
	if st.State != "running" || streaming != 2 || (c.config.Synchronous && sync != 1) {
		return fmt.Errorf("leader %s is %s and streams to %d running replicas, %d synchronously: %+v", leader.Name, st.State, streaming, sync, st.Replication)
	}
	return nil
}

// leader asks the live nodes but skip who leads: nil error once one of
// them holds the leader key and its PostgreSQL runs.
func (c *Cluster) leader(skip *Node) (*Node, error) {
	var lastErr error = errors.New("no live node")
	for _, n := range c.Nodes {
		if n == skip || n.patroni.exited() {
			continue
		}
		var cl struct{ Members []member }
		if err := getJSON(url(n.APIPort)+"/cluster", &cl); err != nil {
			lastErr = err
			continue
		}
		for _, m := range cl.Members {
			if m.Role != "leader" || m.State != "running" {
				continue
			}
			for _, l := range c.Nodes {
				if l.Name == m.Name && l != skip {
					return l, nil
				}
			}
		}
		lastErr = fmt.Errorf("no running leader in %+v", cl.Members)
	}
	return nil, lastErr
}

// Leader returns the node that holds the leader key now.
func (c *Cluster) Leader(t testing.TB) *Node {
	t.Helper()
	n, err := c.leader(nil)
	require.NoError(t, err)
	return n
}

// WaitNewLeader waits until another node than old leads, its PostgreSQL
// promoted and running, and returns it.
func (c *Cluster) WaitNewLeader(t testing.TB, old *Node) *Node {
	t.Helper()
	var n *Node
	require.NoError(t, waitUntil(nil, func() (err error) {
		n, err = c.leader(old)
		return err
	}))
	return n
}

// DSN returns the libpq connection string that follows the primary: the
// three servers in one host list with target_session_attrs=read-write, so
// that a new connection skips the dead and the read-only ones. lib/pq and
// pgx both read it.
func (c *Cluster) DSN() string {
	hosts, ports := make([]string, len(c.Nodes)), make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		hosts[i], ports[i] = "127.0.0.1", fmt.Sprint(n.Port)
	}
	return fmt.Sprintf("host=%s port=%s user=postgres password=%s dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=5",
		strings.Join(hosts, ","), strings.Join(ports, ","), superuserPassword)
}

// NodeDSN returns the connection string of one node, whatever its role.
func (c *Cluster) NodeDSN(n *Node) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres password=%s dbname=postgres sslmode=disable connect_timeout=5", n.Port, superuserPassword)
}

// Kill SIGKILLs node n's Patroni and its PostgreSQL (the postmaster and
// every backend) at one instant, as when the node's machine dies, and with
// ReplicationDelay cuts its links to the other nodes at that instant too:
// what was still on its way to them is lost, as what a dead machine had not
// sent yet. Nothing is left to release the leader key, which expires after
// the TTL, and a replica is promoted. It returns when the node died, once
// its processes are all gone.
func (c *Cluster) Kill(t testing.TB, n *Node) (killed time.Time) {
	t.Helper()
	pid, err := postmaster(filepath.Join(n.dir, "data"))
	require.NoError(t, err, "node %s", n.Name)
	roots := []int{n.patroni.cmd.Process.Pid, pid}
	killed = freeze(roots)
	if n.link != nil {
		n.link.Stop()
	}
	killTrees(roots...)
	n.patroni.kill()
	return killed
}

// Log returns the end of node n's Patroni log (PostgreSQL's is in its data
// directory).
func (n *Node) Log() string { return readLog(n.patroni.log) }

// stop kills every Patroni first (so that none restarts its PostgreSQL),
// then every PostgreSQL, then etcd.
func (c *Cluster) stop() {
	for _, n := range c.Nodes {
		n.patroni.kill()
	}
	for _, n := range c.Nodes {
		if pid, err := postmaster(filepath.Join(n.dir, "data")); err == nil {
			killTrees(pid)
		}
	}
	if c.etcd != nil {
		c.etcd.kill()
	}
	for _, p := range c.proxies {
		p.Stop()
	}
}

// getJSON GETs url into v.
func getJSON(url string, v any) error {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body.String())
	}
	return json.Unmarshal(body.Bytes(), v)
}

// Configure changes the cluster's dynamic configuration (Patroni's PATCH
// /config, which every node applies on its next loop), for example
// {"synchronous_mode": false} or {"postgresql": {"parameters":
// {"synchronous_commit": "remote_write"}}}, and waits until the primary
// reports ready: synchronous or not as asked, with its synchronous_commit.
func (c *Cluster) Configure(t testing.TB, synchronous bool, synchronousCommit string) {
	t.Helper()
	leader := c.Leader(t)
	patch := fmt.Sprintf(`{"synchronous_mode": %t, "postgresql": {"parameters": {"synchronous_commit": %q}}}`, synchronous, synchronousCommit)
	req, err := http.NewRequest(http.MethodPatch, url(leader.APIPort)+"/config", strings.NewReader(patch))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Less(t, resp.StatusCode, 300, "PATCH /config: %s", resp.Status)
	c.config.Synchronous = synchronous
	require.NoError(t, waitUntil(nil, func() error {
		if err := c.healthy(); err != nil {
			return err
		}
		var st status
		if err := getJSON(url(leader.APIPort)+"/patroni", &st); err != nil {
			return err
		}
		for _, r := range st.Replication {
			if !synchronous && r.SyncState != "async" {
				return fmt.Errorf("replica %s is still %s", r.Name, r.SyncState)
			}
		}
		return nil
	}))
}
