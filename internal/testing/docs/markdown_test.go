package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// root is the repository's root, seen from this package's directory.
var root = filepath.Join("..", "..", "..")

// userPages are the pages whose snippets are checked and whose words are
// counted: README.md and docs/*.md, relative to root.
func userPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	out := []string{"README.md"}
	for _, p := range pages {
		rel, err := filepath.Rel(root, p)
		require.NoError(t, err)
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

func readPage(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
	require.NoError(t, err)
	return string(b)
}

// fence is one fenced code block of a page.
type fence struct {
	lang   string
	line   int      // of the opening fence, from 1
	before string   // the last non-blank line above the fence
	body   []string // its lines, the fence's indentation removed
}

var fenceOpen = regexp.MustCompile("^(\\s*)(```+|~~~+)\\s*([^\\s`]*)")

// fences returns the page's fenced code blocks, and the page with their
// lines made blank (so that links and headings inside code are not read).
func fences(page string) ([]fence, []string) {
	lines := strings.Split(page, "\n")
	prose := make([]string, len(lines))
	var out []fence
	prev := ""
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(lines[i])
		if m == nil {
			prose[i] = lines[i]
			if strings.TrimSpace(lines[i]) != "" {
				prev = strings.TrimSpace(lines[i])
			}
			continue
		}
		f := fence{lang: m[3], line: i + 1, before: prev}
		indent, marker := m[1], m[2]
		for i++; i < len(lines); i++ {
			if strings.HasPrefix(strings.TrimSpace(lines[i]), marker) {
				break
			}
			f.body = append(f.body, strings.TrimPrefix(lines[i], indent))
		}
		out = append(out, f)
		prev = ""
	}
	return out, prose
}

var (
	inlineCode = regexp.MustCompile("`+[^`]*`+")
	htmlTag    = regexp.MustCompile(`<[^>]*>`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	heading    = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlID     = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// anchors returns the #fragments a page offers, as GitHub makes them from
// its headings: the text lowercased, punctuation dropped (letters, digits,
// "-" and "_" kept), spaces made "-", and "-1", "-2"... added to repeats.
func anchors(page string) map[string]bool {
	_, prose := fences(page)
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range prose {
		for _, m := range htmlID.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		text := mdLink.ReplaceAllString(m[2], "$1")
		text = strings.ReplaceAll(text, "`", "")
		text = htmlTag.ReplaceAllString(text, "")
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}
