package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// A link's target: [text](target "title") or a definition [ref]: target.
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)`)
	lineAnchor = regexp.MustCompile(`^L\d+(-L\d+)?$`)
)

// linkedPages are the pages whose relative links are checked.
func linkedPages(t *testing.T) []string {
	t.Helper()
	pages := append(userPages(t), "CHANGELOG.md")
	err := filepath.WalkDir(filepath.Join(root, "internal", "testing"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "README.md" {
			return err
		}
		rel, err := filepath.Rel(root, path)
		pages = append(pages, filepath.ToSlash(rel))
		return err
	})
	require.NoError(t, err)
	return pages
}

// Every relative link of the pages leads to a file or directory of the
// repository, and its #anchor, into a Markdown page, to one of that page's
// headings (GitHub's anchors); into another file, only a line (#L12).
func TestLinks(t *testing.T) {
	t.Parallel()
	anchorsOf := map[string]map[string]bool{}
	for _, page := range linkedPages(t) {
		_, prose := fences(readPage(t, page))
		for n, l := range prose {
			l = inlineCode.ReplaceAllString(l, "")
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(l); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := page
				if path != "" {
					file = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
				}
				where := page + ":" + strconv.Itoa(n+1)
				info, err := os.Stat(filepath.Join(root, filepath.FromSlash(file)))
				if err != nil {
					t.Errorf("%s: the link %s leads to no file of the repository (%s)", where, target, file)
					continue
				}
				if anchor == "" {
					continue
				}
				if info.IsDir() || !strings.HasSuffix(file, ".md") {
					if !lineAnchor.MatchString(anchor) {
						t.Errorf("%s: the link %s has an anchor into a file that is not a Markdown page", where, target)
					}
					continue
				}
				if anchorsOf[file] == nil {
					anchorsOf[file] = anchors(readPage(t, file))
				}
				if !anchorsOf[file][anchor] {
					t.Errorf("%s: the link %s names no heading of %s", where, target, file)
				}
			}
		}
	}
}
