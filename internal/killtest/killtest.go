// Package killtest crashes consumers for tests: it runs the test binary
// again as a child process, alone and with a spec, and requires that the
// child died of SIGKILL, as a consumer dies in production without running a
// single deferred function or closing a connection.
package killtest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Spec reports whether this process is a child Run started with env, and
// decodes its spec into v.
func Spec(t testing.TB, env string, v any) bool {
	raw := os.Getenv(env)
	if raw == "" {
		return false
	}
	require.NoError(t, json.Unmarshal([]byte(raw), v))
	return true
}

// Run runs the top-level test named test in a child process, with spec in
// the environment variable env, and requires that it died of SIGKILL within
// timeout. It returns the child's output.
func Run(t testing.TB, test, env string, spec any, timeout time.Duration) []byte {
	t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+string(raw))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child output:\n%s", out)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && status.Signaled() && status.Signal() == syscall.SIGKILL, "the child did not die of SIGKILL: %v\n%s", err, out)
	return out
}

// Kill kills this process with SIGKILL. Its signature fits
// inbox.AfterCommit.
func Kill(context.Context) error {
	return syscall.Kill(os.Getpid(), syscall.SIGKILL)
}
