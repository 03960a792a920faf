// Package killtest crashes consumers for real: a test runs itself again as a
// child process, the child consumes and kills itself with SIGKILL at the
// worst moment (its transaction committed, its ack not sent), and the parent
// checks how it died and what it left in the database.
//
// A test that kills a consumer of an effects.Service starts with
//
//	if killtest.ConsumeUntilKilled(t, func(c killtest.Consumer) message.Subscriber { ... }) {
//		return // this process was the child
//	}
//
// and later calls killtest.KillConsumer(t, service, server, topic, n), which
// re-executes the test binary with only this test selected; the child
// consumes with the subscriber built from its spec and dies right after its
// n-th commit. Child, Run and AfterCommit are the parts, for other children.
package killtest

import (
	"bytes"
	"context"
	stdsql "database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// specEnv carries the child's spec, as JSON.
const specEnv = "INBOX_KILLTEST_SPEC"

// Timeout bounds a child's life and the parent's waits.
const Timeout = 30 * time.Second

// Child reports whether this process is a child started by Run, and decodes
// its spec into spec.
func Child(spec any) bool {
	raw := os.Getenv(specEnv)
	if raw == "" {
		return false
	}
	if err := json.Unmarshal([]byte(raw), spec); err != nil {
		panic("killtest: decoding the child's spec: " + err.Error())
	}
	return true
}

// Run runs t again in a child process with spec, waits until it is dead,
// checks that it died of SIGKILL, and returns its output.
func Run(t *testing.T, spec any) []byte {
	t.Helper()
	return Start(t, spec, Timeout).Wait(t)
}

// Process is a child started by Start.
type Process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// Start runs t again in a child process with spec and returns at once; the
// child is killed after timeout, or when the test ends.
func Start(t *testing.T, spec any, timeout time.Duration) *Process {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	// A subtest "A/B" is selected by "^A$/^B$".
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+strings.ReplaceAll(t.Name(), "/", "$/^")+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), specEnv+"="+string(raw))
	p := &Process{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() {
		defer cancel()
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill SIGKILLs the child now and returns its output once it is dead.
func (p *Process) Kill(t *testing.T) []byte {
	t.Helper()
	require.False(t, p.Exited(), "the child exited before its kill:\n%s", p.out.String())
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	return p.Wait(t)
}

// Wait waits until the child is dead, checks that it died of SIGKILL, and
// returns its output.
func (p *Process) Wait(t *testing.T) []byte {
	t.Helper()
	<-p.done
	out := []byte(p.out.String())
	var exit *exec.ExitError
	require.ErrorAs(t, p.err, &exit, "child output:\n%s", out)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL, "child did not die of SIGKILL: %v\n%s", p.err, out)
	return out
}

// syncBuffer is a bytes.Buffer the child's output can be written to while
// the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// AfterCommit returns a handler step (effects.RunConfig.AfterEffect) that
// makes the process SIGKILL itself right after the n-th message's
// transaction committed: its effect is in the database, its ack never left.
func AfterCommit(n int64) func(msg *message.Message) error {
	var handled atomic.Int64
	return func(msg *message.Message) error {
		if handled.Add(1) != n {
			return nil
		}
		return inbox.AfterCommit(msg.Context(), Kill)
	}
}

// Linger keeps a child alive until its kill; a child still alive after
// Timeout fails.
func Linger(t *testing.T) { LingerFor(t, Timeout) }

// LingerFor keeps a child alive until its kill; a child still alive after
// d fails.
func LingerFor(t *testing.T, d time.Duration) {
	time.Sleep(d)
	t.Fatal("the child was not killed")
}

// WithAppName tags a PostgreSQL DSN so the parent can find the child's
// connections.
func WithAppName(dsn, name string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " application_name=" + name
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&application_name=" + name
	}
	return dsn + "?application_name=" + name
}

// WaitDisconnected waits until PostgreSQL has no connection tagged appName:
// it has then finished (committed or rolled back) every transaction the dead
// child had open, and the effects it committed are final.
func WaitDisconnected(t testing.TB, db *stdsql.DB, appName string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n))
		return n == 0
	}, Timeout, 20*time.Millisecond)
}

// Consumer is the spec of a consumer child: the service whose tables it
// writes, and where it consumes.
type Consumer struct {
	Server   string // the broker's address, as the test's subscriber takes it
	Topic    string
	DSN      string // PostgreSQL, tagged with the child's application name
	Service  string
	Inbox    string
	Effects  string
	DieAfter int64
	// The inbox table's layout, as the service's store has it.
	Partitioning sqlinbox.Partitioning
	PartitionKey sqlinbox.PartitionKey
}

// ConsumeUntilKilled reports whether this process is a consumer child
// started by KillConsumer. If it is, it consumes with the subscriber built
// from its spec and SIGKILLs itself right after its DieAfter-th commit.
func ConsumeUntilKilled(t *testing.T, subscriber func(c Consumer) message.Subscriber) bool {
	var c Consumer
	if !Child(&c) {
		return false
	}
	db := testdb.Open(t, "pgx", c.DSN)
	s := effects.OpenService(t, db, c.Service, c.Inbox, c.Effects, sqlinbox.Config{Partitioning: c.Partitioning, PartitionKey: c.PartitionKey})
	s.Run(t, subscriber(c), c.Topic, effects.RunConfig{AfterEffect: AfterCommit(c.DieAfter)})
	Linger(t)
	return true
}

// KillConsumer runs t again as a consumer child of s (see
// ConsumeUntilKilled), waits until it died and PostgreSQL has ended its
// transactions, and returns the number of effects it committed: dieAfter,
// or more when it handled several messages at once.
func KillConsumer(t *testing.T, s *effects.Service, server, topic string, dieAfter int64) int {
	t.Helper()
	appName := testdb.Name("killed")
	Run(t, Consumer{
		Server: server, Topic: topic, DSN: WithAppName(testdb.PostgresDSN(), appName),
		Service: s.Name, Inbox: s.Inbox, Effects: s.Effects, DieAfter: dieAfter,
		Partitioning: s.Config.Partitioning, PartitionKey: s.Config.PartitionKey,
	})
	WaitDisconnected(t, s.DB, appName)
	committed := s.EffectRows(t)
	require.GreaterOrEqual(t, int64(committed), dieAfter, "effects committed by the killed consumer")
	return committed
}

// Kill kills this process with SIGKILL, as a consumer dies in production:
// no deferred function runs, no connection is closed. Its signature fits
// inbox.AfterCommit.
func Kill(context.Context) error {
	return syscall.Kill(os.Getpid(), syscall.SIGKILL)
}
