package datalayer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every Go snippet of docs/data-layer.md is code of this package's tests
// and examples, line for line (white space and blank lines aside): the
// page's code compiles, and the tests run it.
func TestDataLayerPageSnippets(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "data-layer.md"))
	require.NoError(t, err)
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	var code []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		code = append(code, codeLines(string(b))...)
	}
	all := "\n" + strings.Join(code, "\n") + "\n"

	snippets := goSnippets(string(page))
	require.NotEmpty(t, snippets)
	for _, s := range snippets {
		if !strings.Contains(all, "\n"+strings.Join(codeLines(s), "\n")+"\n") {
			t.Errorf("this snippet of docs/data-layer.md is not in the code of this package's tests:\n%s", s)
		}
	}
}

// goSnippets returns the contents of the page's ```go blocks.
func goSnippets(page string) []string {
	var out []string
	for _, part := range strings.Split(page, "```go\n")[1:] {
		end := strings.Index(part, "```")
		if end < 0 {
			end = len(part)
		}
		out = append(out, part[:end])
	}
	return out
}

// codeLines returns the lines of src that are not blank, each with its
// runs of white space (indentation, gofmt's alignment) made one space.
func codeLines(src string) []string {
	var out []string
	for _, l := range strings.Split(src, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}
