package sqlinbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTableName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"watermill_inbox": `"watermill_inbox"`,
		"app.inbox":       `"app"."inbox"`,
		"_x9":             `"_x9"`,
	} {
		tn, err := parseTableName(in)
		require.NoError(t, err, in)
		require.Equal(t, want, tn.quoted('"'))
		require.Equal(t, in, tn.String())
	}
	for _, bad := range []string{
		"", ".", "a.", ".a", "a.b.c", "Inbox", "9inbox", "in box", "inbox;", `in"box`, "in`box", "in'box",
		"inbox--", "inbox/*", "ïnbox", "in\x00box", strings.Repeat("a", maxIdentifierLength+1),
		`x"; DROP TABLE users; --`,
	} {
		_, err := parseTableName(bad)
		require.Error(t, err, "%q", bad)
	}
}

// FuzzParseTableName: an accepted name quotes to an identifier that cannot
// break out of its quotes, on every dialect's quote character.
func FuzzParseTableName(f *testing.F) {
	for _, seed := range []string{"watermill_inbox", "app.inbox", `a"b`, "a`b", "a.b.c", "", "x;y", "A", "é", "a\x00"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tn, err := parseTableName(s)
		if err != nil {
			return
		}
		for _, q := range []byte{'"', '`'} {
			quoted := tn.quoted(q)
			inner := strings.ReplaceAll(quoted, string(q)+"."+string(q), "")
			inner = strings.Trim(inner, string(q))
			if strings.ContainsAny(inner, "\"`'; \x00\\") {
				t.Fatalf("parseTableName(%q) accepted a name that quotes to %s", s, quoted)
			}
		}
		if len(tn.name) > maxIdentifierLength || len(tn.schema) > maxIdentifierLength {
			t.Fatalf("parseTableName(%q) accepted an over-long part", s)
		}
	})
}
