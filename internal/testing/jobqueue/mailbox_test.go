package jobqueue_test

import (
	"bufio"
	"errors"
	"io"
	"log"
	"net"
	"net/textproto"
	"sync"
	"testing"

	"github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"
)

// mailbox is a real SMTP server, in the test process: every process of the
// service sends to it over TCP, and it records each accepted message's
// Message-ID and the name its sender gave in EHLO. A message is accepted when
// Data returns nil; go-smtp then answers 250.
type mailbox struct {
	addr string

	mu     sync.Mutex
	copies map[string][]string // Message-ID -> the sender of each accepted copy, in order
}

func newMailbox(t testing.TB) *mailbox {
	t.Helper()
	m := &mailbox{copies: map[string][]string{}}
	server := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &smtpConn{box: m, sender: c.Hostname()}, nil
	}))
	server.Domain = "mail.test"
	// A sender killed mid-session resets its connection: not news here.
	server.ErrorLog = log.New(io.Discard, "", 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m.addr = l.Addr().String()
	go func() { _ = server.Serve(l) }()
	t.Cleanup(func() { _ = server.Close() })
	return m
}

// received returns a copy of what the server accepted so far.
func (m *mailbox) received() map[string][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]string, len(m.copies))
	for id, senders := range m.copies {
		out[id] = append([]string(nil), senders...)
	}
	return out
}

type smtpConn struct {
	box    *mailbox
	sender string
}

func (s *smtpConn) Mail(string, *smtp.MailOptions) error { return nil }
func (s *smtpConn) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (s *smtpConn) Reset()                               {}
func (s *smtpConn) Logout() error                        { return nil }

// Data accepts a message with a Message-ID, which is the idempotency key
// the receiver deduplicates on.
func (s *smtpConn) Data(r io.Reader) error {
	tp := textproto.NewReader(bufio.NewReader(r))
	header, err := tp.ReadMIMEHeader()
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, tp.R); err != nil {
		return err
	}
	id := header.Get("Message-Id")
	if id == "" {
		return errors.New("a message without a Message-ID")
	}
	s.box.mu.Lock()
	defer s.box.mu.Unlock()
	s.box.copies[id] = append(s.box.copies[id], s.sender)
	return nil
}
