package maintenance

import (
	"testing"
)

// The first consumer is converted once and then costs no allocation; any
// other one still comes back as itself. Not parallel: AllocsPerRun
// refuses to run beside other tests.
func TestConsumerArg(t *testing.T) {
	var c ConsumerArg
	consumer := string([]byte("orders")) // not a constant: converting it allocates
	if got := c.Arg(consumer); got != "orders" {
		t.Fatalf("Arg(%q) = %v", consumer, got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = c.Arg(consumer) }); n != 0 {
		t.Fatalf("Arg of the first consumer allocates %v times, want 0", n)
	}
	other := string([]byte("billing"))
	for range 2 {
		if got := c.Arg(other); got != "billing" {
			t.Fatalf("Arg(%q) = %v", other, got)
		}
	}
	if got := c.Arg(consumer); got != "orders" {
		t.Fatalf("Arg(%q) after another consumer = %v", consumer, got)
	}
}
