package brokers_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
)

// natsNode is one nats-server process of a test cluster.
type natsNode struct {
	name string
	url  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// kill SIGKILLs the node and waits for it to be gone.
func (n *natsNode) kill(t *testing.T) {
	t.Helper()
	select {
	case <-n.done:
		return // exited already
	default:
	}
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGKILL))
	<-n.done
}

// freePorts returns n TCP ports of 127.0.0.1 that nothing listens on.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// startNATSCluster starts a JetStream cluster of size nodes from the
// nats-server binary, on loopback ports, each with its store in a temporary
// directory; the nodes are killed at the end of the test.
func startNATSCluster(t *testing.T, size int) []*natsNode {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	require.NoError(t, err, "the NATS cluster test runs the nats-server binary: install the nats-server package (./test.sh does)")
	for attempt := 1; ; attempt++ {
		nodes, err := tryNATSCluster(t, bin, size)
		if err == nil {
			return nodes
		}
		// Another program took a port between freePorts and the bind.
		for _, n := range nodes {
			n.kill(t)
		}
		require.Less(t, attempt, 5, "starting a NATS cluster: %v", err)
	}
}

func tryNATSCluster(t *testing.T, bin string, size int) ([]*natsNode, error) {
	ports := freePorts(t, 2*size)
	var routes []string
	for i := range size {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[size+i]))
	}
	dir := t.TempDir()
	nodes := make([]*natsNode, size)
	for i := range size {
		n := &natsNode{name: fmt.Sprintf("n%d", i+1), url: fmt.Sprintf("nats://127.0.0.1:%d", ports[i]), done: make(chan struct{})}
		log, err := os.Create(filepath.Join(dir, n.name+".log"))
		require.NoError(t, err)
		n.cmd = exec.Command(bin, "-n", n.name, "-a", "127.0.0.1", "-p", fmt.Sprint(ports[i]),
			"-js", "-sd", filepath.Join(dir, n.name),
			"--cluster_name", "inbox", "--cluster", routes[i], "--routes", strings.Join(routes, ","))
		n.cmd.Stdout, n.cmd.Stderr = log, log
		require.NoError(t, n.cmd.Start())
		go func() {
			_ = n.cmd.Wait()
			_ = log.Close()
			close(n.done)
		}()
		t.Cleanup(func() {
			_ = n.cmd.Process.Kill()
			<-n.done
		})
		nodes[i] = n
	}
	for _, n := range nodes {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if c, err := net.Dial("tcp", strings.TrimPrefix(n.url, "nats://")); err == nil {
				_ = c.Close()
				break
			}
			select {
			case <-n.done:
				out, _ := os.ReadFile(filepath.Join(dir, n.name+".log"))
				return nodes, fmt.Errorf("node %s exited: %s", n.name, out)
			default:
			}
			if time.Now().After(deadline) {
				return nodes, errors.New("node " + n.name + " does not answer")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nodes, nil
}

// A three-node JetStream cluster holds the stream with three replicas. Mid
// stream, the node that leads the stream is SIGKILLed. The other two elect a
// new leader; the clients (connected to every node's URL) reconnect; the
// publisher retries what timed out during the election, which may already be
// stored (a second copy); acks sent to the dead node are lost and their
// messages redelivered after AckWait. The consumers carry on, and every
// event has one effect.
func TestNATSClusterLosesStreamLeader(t *testing.T) {
	t.Parallel()
	start := time.Now()
	nodes := startNATSCluster(t, 3)
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.url)
	}
	all := natsURLs(urls)
	db := testdb.Postgres(t, "pgx")
	stream := natsStream(t, all, 3)

	const ackWait = time.Second
	billing := effects.NewService(t, db, "billing")
	causes := newDeliveries(map[string]func(*message.Message) bool{"redelivered by JetStream": natsRedelivered})
	seen := map[string]int{}
	var seenMu sync.Mutex
	countCopies := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			seenMu.Lock()
			seen[msg.UUID]++
			seenMu.Unlock()
			return h(msg)
		}
	}
	// Two consumers of the durable, as two instances of a service, each
	// message taking a few milliseconds so that many are in flight.
	var stops []func()
	for range 2 {
		stops = append(stops, billing.Run(t, natsSubscriber(t, all, ackWait, 1), stream, effects.RunConfig{
			Outer:       causes.middleware(countCopies),
			AfterEffect: func(*message.Message) error { time.Sleep(10 * time.Millisecond); return nil },
		}))
	}
	t.Logf("cluster and stream ready after %s", time.Since(start).Round(time.Millisecond))

	// The producer publishes until JetStream acknowledges.
	pub := natsPublisher(t, all)
	var retried atomic.Int64
	publish := func(n int) []string {
		ids := make([]string, n)
		for i := range ids {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			ids[i] = msg.UUID
			deadline := time.Now().Add(effects.WaitFor)
			for err := pub.Publish(stream, msg); err != nil; err = pub.Publish(stream, msg) {
				require.True(t, time.Now().Before(deadline), "publishing: %v", err)
				retried.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
		}
		return ids
	}

	ids := publish(100)
	billing.WaitEffects(t, 30)
	leader := streamLeader(t, all, stream)
	// The durable's own leader lives on the same node, so its death loses
	// the deliveries in flight, not only the stream's.
	followLeader(t, all, stream, leader)
	var killed *natsNode
	for _, n := range nodes {
		if n.name == leader {
			killed = n
		}
	}
	require.NotNil(t, killed, "stream leader %q is not one of the nodes", leader)
	killed.kill(t)
	t.Logf("killed the stream leader %s after %d effects", leader, billing.EffectRows(t))
	var alive []string
	for _, n := range nodes {
		if n != killed {
			alive = append(alive, n.url)
		}
	}
	// The producer goes on through the election.
	ids = append(ids, publish(50)...)
	t.Logf("published all after %s", time.Since(start).Round(time.Millisecond))
	require.Eventually(t, func() bool { return billing.EffectRows(t) == len(ids) }, effects.WaitFor, 20*time.Millisecond)
	t.Logf("all effects after %s", time.Since(start).Round(time.Millisecond))
	natsDrained(t, natsURLs(alive), stream)
	t.Logf("drained after %s", time.Since(start).Round(time.Millisecond))
	newLeader := streamLeader(t, natsURLs(alive), stream)
	require.NotEqual(t, leader, newLeader)

	billing.RequireExactlyOnce(t, ids)
	// A late copy (an ack lost with the dead node, redelivered by the new
	// leader) may still be arriving: stop both consumers before counting,
	// so that every delivery is in both counts.
	for _, stop := range stops {
		stop()
	}
	seenMu.Lock()
	copies := 0
	for _, n := range seen {
		copies += n - 1
	}
	seenMu.Unlock()
	info := streamInfo(t, natsURLs(alive), stream)
	t.Logf("stream leader %s killed, %s took over; the stream holds %d messages for %d events; publisher retries %d",
		leader, newLeader, info.State.Msgs, len(ids), retried.Load())
	require.EqualValues(t, int64(copies), billing.Delivered.Load()-int64(len(ids)), "every delivery beyond the first of an event was skipped")
	require.Positive(t, copies, "the leader's death redelivered messages in flight")
	report(t, start, ids, counted{
		"redelivered by JetStream":          causes.count("redelivered by JetStream"),
		"stored twice by a retried publish": int(info.State.Msgs) - len(ids),
	}, billing)
}

// followLeader moves the durable's leadership until it is on node leader:
// each step-down elects one of the other replicas.
func followLeader(t *testing.T, urls, stream, leader string) {
	t.Helper()
	nc := natsConnect(t, urls)
	js, err := nc.JetStream()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := js.ConsumerInfo(stream, durable)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		if info.Cluster.Leader == leader {
			return true
		}
		_, _ = nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN."+stream+"."+durable, nil, time.Second)
		return false
	}, effects.WaitFor, 100*time.Millisecond, "the durable's leadership did not move to %s", leader)
}

func streamInfo(t *testing.T, urls, stream string) *nats.StreamInfo {
	t.Helper()
	js, err := natsConnect(t, urls).JetStream()
	require.NoError(t, err)
	var info *nats.StreamInfo
	require.Eventually(t, func() bool {
		info, err = js.StreamInfo(stream)
		return err == nil && info.Cluster != nil && info.Cluster.Leader != ""
	}, effects.WaitFor, 50*time.Millisecond, "stream %s has no leader", stream)
	return info
}

// streamLeader is the name of the node that leads stream.
func streamLeader(t *testing.T, urls, stream string) string {
	t.Helper()
	return streamInfo(t, urls, stream).Cluster.Leader
}
