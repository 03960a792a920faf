package bench

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// Latency puts a network round trip between the benchmark and its
// databases: connections dialed through a RoundTrips that goes Through it
// reach the server via an in-process TCP proxy (toxiproxy) that delays
// every chunk of bytes by half the round trip in each direction.
//
// The proxy is a delay line, which is what a network is: each chunk leaves
// half a round trip after it arrived, whatever else is in flight, so a
// pipelined batch (native pgx's BEGIN and claim, sent together) pays one
// round trip, and statements sent one after the other pay one each. A delay
// added in the client's dialer instead (the first read after a write waits
// the round trip) would charge the wait from the read, not from when the
// bytes left, and would sit under the drivers' own deadline tricks (pgx's
// non-blocking reads): the proxy leaves the client a plain TCP connection,
// on which RoundTrips counts as before. Toxiproxy's own latency toxic counts
// in whole milliseconds; the toxic registered here counts in microseconds.
//
// The proxy's own hop adds to each round trip (about 0.15 ms on a busy
// 2-core machine), and its work and allocations are this process's.
type Latency struct {
	rtt     time.Duration
	server  *toxiproxy.ApiServer
	mu      sync.Mutex
	proxies map[string]*toxiproxy.Proxy
}

// NewLatency returns a proxy maker adding rtt to every round trip, or an
// error where this system cannot wait that precisely.
func NewLatency(rtt time.Duration) (*Latency, error) {
	w, err := newWaiter()
	if err != nil {
		return nil, fmt.Errorf("no timer for the simulated round trip: %w", err)
	}
	w.close()
	return &Latency{
		rtt:     rtt,
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}, nil
}

// RTT returns the round trip the proxies add.
func (l *Latency) RTT() time.Duration { return l.rtt }

// Close stops every proxy, closing the connections through them.
func (l *Latency) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.proxies {
		p.Stop()
	}
	clear(l.proxies)
}

// addr returns the address of the proxy to upstream, started on first use.
func (l *Latency) addr(upstream string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.proxies[upstream]; ok {
		return p.Listen, nil
	}
	p := toxiproxy.NewProxy(l.server, "bench "+upstream, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("starting the latency proxy to %s: %w", upstream, err)
	}
	for _, stream := range []string{"upstream", "downstream"} {
		half := l.rtt / 2
		if stream == "downstream" {
			half = l.rtt - half
		}
		spec, err := json.Marshal(map[string]any{
			"name": "rtt " + stream, "type": delayToxicType, "stream": stream,
			"attributes": delayToxic{Microseconds: half.Microseconds()},
		})
		if err != nil {
			p.Stop()
			return "", err
		}
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(string(spec))); err != nil {
			p.Stop()
			return "", fmt.Errorf("adding the delay to the proxy to %s: %w", upstream, err)
		}
	}
	l.proxies[upstream] = p
	return p.Listen, nil
}

const delayToxicType = "bench_delay"

func init() { toxics.Register(delayToxicType, new(delayToxic)) }

// delayToxic passes every chunk on Microseconds after the proxy read it:
// toxiproxy's latency toxic, in microseconds and without jitter.
type delayToxic struct {
	Microseconds int64 `json:"microseconds"`
}

func (t *delayToxic) Pipe(stub *toxics.ToxicStub) {
	delay := time.Duration(t.Microseconds) * time.Microsecond
	w, err := newWaiter()
	if err != nil {
		// NewLatency made one: only running out of file descriptors
		// gets here, and a connection without its delay would
		// falsify the run.
		panic(fmt.Sprintf("bench: no timer for the simulated round trip: %v", err))
	}
	defer w.close()
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			// A wait is short (half a round trip): the interrupt of a
			// stopping proxy waits for it.
			_ = w.wait(time.Until(c.Timestamp.Add(delay)))
			stub.Output <- c
		}
	}
}
