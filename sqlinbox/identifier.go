package sqlinbox

import (
	"fmt"
	"regexp"
	"strings"
)

// maxIdentifierLength leaves room for the suffixes of derived names (indexes,
// partitions) within PostgreSQL's 63-byte limit and MySQL's 64.
const maxIdentifierLength = 40

// identifierPattern is deliberately narrow: lowercase, so that a table behaves
// the same whether quoted or not and on case-insensitive MySQL file systems;
// no characters that need escaping, so a quoted name is always exact.
var identifierPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// tableName is a validated, optionally schema-qualified table name.
type tableName struct {
	schema string // "" when unqualified
	name   string
}

// parseTableName accepts "table" or "schema.table", each part lowercase
// letters, digits and underscores, starting with a letter or underscore, at
// most maxIdentifierLength bytes.
func parseTableName(s string) (tableName, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return tableName{}, fmt.Errorf("table name %q: at most one dot (schema.table)", s)
	}
	for _, p := range parts {
		if len(p) > maxIdentifierLength {
			return tableName{}, fmt.Errorf("table name %q: part %q is longer than %d bytes", s, p, maxIdentifierLength)
		}
		if !identifierPattern.MatchString(p) {
			return tableName{}, fmt.Errorf("table name %q: each part must be lowercase letters, digits and underscores, not starting with a digit", s)
		}
	}
	if len(parts) == 2 {
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	return tableName{name: parts[0]}, nil
}

// String returns the name as the user gave it.
func (t tableName) String() string {
	if t.schema == "" {
		return t.name
	}
	return t.schema + "." + t.name
}

// quoted renders the name with the dialect's identifier quote. Validation
// guarantees the parts contain no quote character.
func (t tableName) quoted(q byte) string {
	quote := func(s string) string { return string(q) + s + string(q) }
	if t.schema == "" {
		return quote(t.name)
	}
	return quote(t.schema) + "." + quote(t.name)
}

// derived returns a sibling object name (index, partition) in the table's
// schema: table "s.inbox" with suffix "processed_at_idx" gives
// s."inbox_processed_at_idx" quoted by the caller.
func (t tableName) derived(suffix string) tableName {
	return tableName{schema: t.schema, name: t.name + "_" + suffix}
}

// quoteName quotes one identifier with the dialect's quote q.
func quoteName(name string, q byte) string { return string(q) + name + string(q) }
