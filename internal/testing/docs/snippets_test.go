package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// skipMarker, as the last line above a fence, leaves a Go snippet
// unchecked; the reason follows it: <!-- snippet: not code: REASON -->.
const skipMarker = "<!-- snippet: not code:"

// Every ```go block of README.md and docs/ is compiled code: its
// paragraphs (runs of lines between blank lines) appear, in order and line
// for line (runs of white space made one), in one Go file of the
// repository that the test command compiles, most often a test or an
// example that it also runs; its imports, if it starts with them, are among
// that file's, in any order (gofmt sorts them). A fragment is thus checked
// in the code around it, in this package's tests or beside the code it
// shows.
func TestSnippets(t *testing.T) {
	t.Parallel()
	code := compiledGoFiles(t)
	checked := 0
	for _, page := range userPages(t) {
		fs, _ := fences(readPage(t, page))
		for _, f := range fs {
			if f.lang != "go" {
				continue
			}
			if strings.HasPrefix(f.before, skipMarker) {
				if strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(f.before, skipMarker), "-->")) == "" {
					t.Errorf("%s:%d: the marker above this snippet gives no reason", page, f.line)
				}
				continue
			}
			checked++
			imports, rest := splitImports(f.body)
			paras := paragraphs(rest)
			found := false
			for _, lines := range code {
				if containsAll(lines, imports) && containsInOrder(lines, paras) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: this snippet is in no compiled Go file of the repository (each paragraph, in order, in one file):\n%s",
					page, f.line, strings.Join(f.body, "\n"))
			}
		}
	}
	require.NotZero(t, checked)
}

// compiledGoFiles returns the normalized lines of every Go file the test
// command compiles: all but those under testdata, .git and directories that
// start with "_" or "." (except _examples, which it builds and runs), and
// those a build constraint ignores.
func compiledGoFiles(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || (strings.HasPrefix(name, "_") && name != "_examples") || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "//go:build ignore") {
			return nil
		}
		out[path] = normalized(strings.Split(string(b), "\n"))
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

// normalized drops blank lines and makes each run of white space one space.
func normalized(lines []string) []string {
	var out []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

// splitImports returns the import specs a snippet starts with (an import
// line or block), normalized, and the lines after them.
func splitImports(body []string) (imports []string, rest []string) {
	i := 0
	for i < len(body) && strings.TrimSpace(body[i]) == "" {
		i++
	}
	if i == len(body) || !strings.HasPrefix(body[i], "import") {
		return nil, body
	}
	if l := strings.TrimSpace(body[i]); l != "import (" {
		return []string{strings.Join(strings.Fields(strings.TrimPrefix(l, "import")), " ")}, body[i+1:]
	}
	for i++; i < len(body); i++ {
		l := strings.TrimSpace(body[i])
		if l == ")" {
			return imports, body[i+1:]
		}
		if l != "" {
			imports = append(imports, strings.Join(strings.Fields(l), " "))
		}
	}
	return imports, nil
}

// containsAll reports whether the code has an import spec (alone on its
// line, or after "import") for each of imports.
func containsAll(code, imports []string) bool {
	have := map[string]bool{}
	for _, l := range code {
		have[strings.TrimPrefix(l, "import ")] = true
	}
	for _, imp := range imports {
		if !have[imp] {
			return false
		}
	}
	return true
}

// paragraphs splits a snippet at its blank lines, each run normalized.
func paragraphs(body []string) [][]string {
	var out [][]string
	var cur []string
	for _, l := range append(body, "") {
		if strings.TrimSpace(l) == "" {
			if len(cur) > 0 {
				out = append(out, normalized(cur))
			}
			cur = nil
			continue
		}
		cur = append(cur, l)
	}
	return out
}

// containsInOrder reports whether each paragraph is a run of lines of code,
// each after the one before.
func containsInOrder(code []string, paras [][]string) bool {
	at := 0
	for _, p := range paras {
		i := index(code[at:], p)
		if i < 0 {
			return false
		}
		at += i + len(p)
	}
	return true
}

func index(code, p []string) int {
next:
	for i := 0; i+len(p) <= len(code); i++ {
		for j := range p {
			if code[i+j] != p[j] {
				continue next
			}
		}
		return i
	}
	return -1
}
