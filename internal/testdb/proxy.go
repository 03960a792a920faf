package testdb

import (
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections to a database server, and can cut them
// all, or stall them, and refuse new ones for a while: an outage, as a
// network partition or a restarting server makes one, of a server other
// tests share.
type Proxy struct {
	target string
	l      net.Listener

	mu     sync.Mutex
	down   bool
	conns  []net.Conn
	resume chan struct{} // while stalled: closed when bytes flow again
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
	p.flow()
}

// Stall holds every byte in flight, leaving the connections open, and
// refuses new ones until [Proxy.Up]: a network partition, where a statement
// waits for its answer until its deadline instead of failing.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

// Up forwards new connections again, and the bytes a stall held.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
	p.flow()
}

// flow ends a stall; p.mu is held.
func (p *Proxy) flow() {
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
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
	go p.pipe(c, s)
	go p.pipe(s, c)
}

// pipe copies src to dst, holding each read while the proxy is stalled.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			resume := p.resume
			p.mu.Unlock()
			if resume != nil {
				<-resume
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Proxied returns the DSN of driverName's test server ("postgres" or "pgx"
// for PostgreSQL, "mysql") through a new [Proxy], with a connect timeout of
// 2 s: a refused connection fails fast.
func Proxied(t testing.TB, driverName string) (dsn string, p *Proxy) {
	t.Helper()
	if driverName == "mysql" {
		c, err := mysql.ParseDSN(MySQLDSN())
		require.NoError(t, err)
		p = NewProxy(t, c.Addr)
		c.Addr, c.Timeout = p.Addr(), 2*time.Second
		return c.FormatDSN(), p
	}
	u, err := url.Parse(PostgresDSN())
	require.NoError(t, err)
	p = NewProxy(t, u.Host)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String(), p
}
