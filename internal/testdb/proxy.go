package testdb

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections to a database server, and can cut them
// all and refuse new ones for a while: an outage, as a network partition or
// a restarting server makes one, of a server other tests share.
type Proxy struct {
	target string
	l      net.Listener

	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port) until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{target: target, l: l}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.forward(c)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		p.Down()
	})
	return p
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Down cuts every connection and refuses new ones until [Proxy.Up].
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Up forwards new connections again.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *Proxy) forward(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		_ = c.Close()
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.conns = append(p.conns, c, s)
	go pipe(c, s)
	go pipe(s, c)
}

func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}
