package vitess_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// inboxCommand builds the inbox command once per test binary, as the test
// binary was built, and returns its path.
func inboxCommand(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inbox-command")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "inbox")
		out, err := exec.Command("go", append(append([]string{"build"}, testdb.BuildFlags...), "-o", built, "github.com/watermill-inbox/inbox/cmd/inbox")...).CombinedOutput()
		if err != nil {
			buildErr = errors.New("building the inbox command: " + err.Error() + "\n" + string(out))
		}
	})
	require.NoError(t, buildErr)
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(built)) })
	return built
}

// runInbox runs the inbox command on store's table through vtgate and returns its
// exit status and output.
func runInbox(t *testing.T, store *sqlinbox.Store, args ...string) (int, string, string) {
	t.Helper()
	args = append(args[:1:1], append([]string{"-dialect", "mysql", "-dsn", vt.DSN(), "-table", store.Table(), "-shard-key-column", store.ShardKeyColumn()}, args[1:]...)...)
	cmd := exec.Command(inboxCommand(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	require.NoError(t, err)
	return 0, stdout.String(), stderr.String()
}

// inbox stats and inbox check through vtgate: the counts of both shards,
// every check passing on the sharded table, and inbox purge removing the
// expired rows.
func TestCommand(t *testing.T) {
	t.Parallel()
	db := open(t)
	store := newStore(t, db, sqlinbox.Config{ShardKeyColumn: "shard_key"}, "shard_key", "hash")
	seed(t, db, store, "billing", 120, 30*day)
	seed(t, db, store, "billing", 30, 30*time.Minute)
	seed(t, db, store, "mailer", 20, 2*day)

	code, out, errOut := runInbox(t, store, "stats", "-json")
	require.Equal(t, 0, code, errOut)
	var st struct {
		Consumers []struct {
			Consumer string
			Rows     int64
			LastHour int64 `json:"last_hour"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.Consumers, 2, out)
	require.Equal(t, "billing", st.Consumers[0].Consumer)
	require.EqualValues(t, 150, st.Consumers[0].Rows)
	require.EqualValues(t, 30, st.Consumers[0].LastHour)
	require.EqualValues(t, 20, st.Consumers[1].Rows)

	code, out, errOut = runInbox(t, store, "check", "-retention", "14d", "-broker-retention", "7d")
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "columns: consumer varbinary(255), event_id varbinary(255), processed_at datetime(6), shard_key varbinary(255)")
	require.Contains(t, out, "every check passed")

	code, out, errOut = runInbox(t, store, "purge", "-retention", "14d")
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "removed 120")
	t.Logf("inbox purge: %s", bytes.TrimSpace([]byte(out)))
}
