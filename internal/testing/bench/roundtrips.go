package bench

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"time"
)

// RoundTrips counts client/server turns on the connections it dials: a turn
// is a read that follows a write, that is one wait for the server. It is the
// unit the inbox's cost is made of on a fast network (each turn costs a
// scheduling round on both sides), so the benchmark reports it per message.
//
// It works as a pgx DialFunc (DialContext) and as a lib/pq Dialer.
type RoundTrips struct {
	n       atomic.Int64
	dialer  net.Dialer
	latency *Latency
}

// Through routes the TCP connections dialed from now on through l's
// proxies, which add its round trip; they are counted as before, on the
// client's side of the proxy.
func (r *RoundTrips) Through(l *Latency) { r.latency = l }

// Count returns the turns counted so far on every connection.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

// DialContext dials a counted connection.
func (r *RoundTrips) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if r.latency != nil && strings.HasPrefix(network, "tcp") {
		var err error
		if addr, err = r.latency.addr(addr); err != nil {
			return nil, err
		}
	}
	c, err := r.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, rt: r}, nil
}

// Dial implements lib/pq's Dialer.
func (r *RoundTrips) Dial(network, addr string) (net.Conn, error) {
	return r.DialContext(context.Background(), network, addr)
}

// DialTimeout implements lib/pq's Dialer.
func (r *RoundTrips) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return r.DialContext(ctx, network, addr)
}

type countedConn struct {
	net.Conn
	rt *RoundTrips
	// wrote is set by a write and cleared by the next read that returns
	// data. pgx may read on a background goroutine, hence atomic.
	wrote atomic.Bool
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.wrote.Store(true)
	return c.Conn.Write(p)
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.wrote.Swap(false) {
		c.rt.n.Add(1)
	}
	return n, err
}
