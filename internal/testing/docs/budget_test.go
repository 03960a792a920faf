package docs_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// The word budget: docs/ is the house, README.md the front door. Words are
// counted as wc -w counts them.
const (
	docsWordBudget   = 16000
	readmeWordBudget = 1600
	// budgetEnforced turns the check on. Off, the test reports the counts
	// and skips, unless INBOX_TEST_DOCS_BUDGET=1.
	budgetEnforced = true
)

func TestWordBudget(t *testing.T) {
	t.Parallel()
	docs, readme := 0, 0
	var counts []string
	for _, page := range userPages(t) {
		n := len(strings.Fields(readPage(t, page)))
		counts = append(counts, page+" "+strconv.Itoa(n))
		if page == "README.md" {
			readme = n
		} else {
			docs += n
		}
	}
	t.Logf("words: %s", strings.Join(counts, ", "))
	over := ""
	if docs > docsWordBudget {
		over += "docs/*.md has " + strconv.Itoa(docs) + " words, more than its budget of " + strconv.Itoa(docsWordBudget) + ". "
	}
	if readme > readmeWordBudget {
		over += "README.md has " + strconv.Itoa(readme) + " words, more than its budget of " + strconv.Itoa(readmeWordBudget) + ". "
	}
	if over == "" {
		return
	}
	if !budgetEnforced && os.Getenv("INBOX_TEST_DOCS_BUDGET") != "1" {
		t.Skip(over + "(not enforced yet: budgetEnforced is false)")
	}
	t.Error(over + "Say it in fewer words, or once, and link to it.")
}
