package depstest_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/depstest"
)

// Every package of the library's module that is not a test helper is
// shipped code: none of them links a test helper, directly or through
// another package. Test programs under testdata are not listed by go list.
func TestShippedCodeLinksNoTestHelper(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "github.com/watermill-inbox/inbox/...").Output()
	if exit, ok := err.(*exec.ExitError); ok {
		require.NoError(t, err, "go list: %s", exit.Stderr)
	}
	require.NoError(t, err)
	shipped := 0
	for line := range strings.Lines(string(out)) {
		deps := strings.Fields(line)
		if slices.Contains(depstest.TestHelpers, deps[0]) {
			continue
		}
		shipped++
		for _, dep := range deps[1:] {
			require.False(t, slices.Contains(depstest.TestHelpers, dep), "shipped package %s links the test helper %s", deps[0], dep)
		}
	}
	require.Greater(t, shipped, 5, "packages listed: %s", out)
}

// A test helper says so in its name, so that internal/ tells shipped code
// from test helpers at a glance: an internal package is in
// [depstest.TestHelpers] exactly when its name ends in "test" or is testdb.
func TestTestHelpersAreNamedSo(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "github.com/watermill-inbox/inbox/internal/...").Output()
	require.NoError(t, err)
	internal := strings.Fields(string(out))
	require.NotEmpty(t, internal)
	for _, pkg := range internal {
		name := pkg[strings.LastIndex(pkg, "/")+1:]
		named := strings.HasSuffix(name, "test") || name == "testdb"
		require.Equal(t, named, slices.Contains(depstest.TestHelpers, pkg), "%s: a test helper's name ends in test and it is listed in depstest.TestHelpers; shipped code's name does not", pkg)
	}
}
