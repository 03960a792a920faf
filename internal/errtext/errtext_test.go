package errtext_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/errtext"
)

func TestQuote(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 63) + "bc"
	for in, want := range map[string]string{
		"":                            `""`,
		"order-1":                     `"order-1"`,
		"nul\x00":                     `"nul\x00"`,
		"bad \xff":                    `"bad \xff"`,
		long:                          `"` + strings.Repeat("a", 63) + `b"...`,
		strings.Repeat("a", 64):       `"` + strings.Repeat("a", 64) + `"`,
		strings.Repeat("é", 40):       `"` + strings.Repeat("é", 32) + `"...`,
		strings.Repeat("a", 63) + "é": `"` + strings.Repeat("a", 63) + `\xc3"...`,
	} {
		require.Equal(t, want, errtext.Quote(in), "%q", in)
	}
}
