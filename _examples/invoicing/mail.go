package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"mime/multipart"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"sync"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// messageID is the Message-ID of every copy of an invoice's email, derived
// from the order event's id: the idempotency key a receiver drops copies by.
func messageID(via, eventID string) string {
	return "<" + eventID + "." + via + "@invoicing.shop.example>"
}

// sender is the From address of each variant's emails.
func sender(via string) string { return "invoices-" + via + "@shop.example" }

// invoiceEmail is the email of one invoice, its PDF attached.
func invoiceEmail(id string, o order, pdf string) []byte {
	var body bytes.Buffer
	parts := multipart.NewWriter(&body)
	text, _ := parts.CreatePart(textproto.MIMEHeader{"Content-Type": {"text/plain; charset=utf-8"}})
	fmt.Fprintf(text, "Thank you for order %s. Your invoice is attached.\r\n", o.ID)
	att, _ := parts.CreatePart(textproto.MIMEHeader{
		"Content-Type":              {"application/pdf"},
		"Content-Disposition":       {`attachment; filename="invoice-` + o.ID + `.pdf"`},
		"Content-Transfer-Encoding": {"base64"},
	})
	fmt.Fprint(att, base64.StdEncoding.EncodeToString([]byte(pdf)))
	parts.Close()
	var msg bytes.Buffer
	fmt.Fprintf(&msg, "Message-ID: %s\r\nDate: %s\r\nFrom: Shop <invoices@shop.example>\r\nTo: %s\r\nSubject: Your invoice for order %s\r\n",
		id, time.Now().Format(time.RFC1123Z), o.Customer, o.ID)
	fmt.Fprintf(&msg, "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=%s\r\n\r\n", parts.Boundary())
	msg.Write(body.Bytes())
	return msg.Bytes()
}

// sendMail sends msg and returns nil once the server accepted it (its 250
// after DATA). From then on the email is out: what fails after it (QUIT) is
// no error, or a retry would send it again.
func sendMail(addr, helo, from, to string, msg []byte) error {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	host, _, _ := net.SplitHostPort(addr)
	c, err := smtp.NewClient(conn, host)
	if err != nil {
		conn.Close()
		return err
	}
	defer c.Close()
	if err := c.Hello(helo); err != nil {
		return err
	}
	if err := c.Mail(from); err != nil {
		return err
	}
	if err := c.Rcpt(to); err != nil {
		return fmt.Errorf("sending to %s: %w", to, err)
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(msg); err != nil {
		return err
	}
	if err := w.Close(); err != nil { // the server's answer to DATA
		return err
	}
	_ = c.Quit()
	return nil
}

// mailServer is the mail provider, a real SMTP server in the process. It
// greylists the first attempt for every greylistEvery-th new (sender,
// recipient) pair, as many receivers do: a temporary failure that a correct
// sender retries. It records each accepted email by Message-ID with the
// EHLO name of the process that sent it.
type mailServer struct {
	addr          string
	greylistEvery int

	mu         sync.Mutex
	pairs      map[string]bool     // sender/recipient pairs seen
	greylisted map[string]int      // by sender
	copies     map[string][]string // Message-ID -> the sender process of each accepted copy
}

func startMailServer(greylistEvery int) (*mailServer, func(), error) {
	m := &mailServer{greylistEvery: greylistEvery, pairs: map[string]bool{}, greylisted: map[string]int{}, copies: map[string][]string{}}
	server := gosmtp.NewServer(gosmtp.BackendFunc(func(c *gosmtp.Conn) (gosmtp.Session, error) {
		return &smtpConn{server: m, helo: c.Hostname()}, nil
	}))
	server.Domain = "mx.shop.example"
	server.ErrorLog = log.New(io.Discard, "", 0) // a sender killed mid-transfer resets its connection
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	m.addr = l.Addr().String()
	go func() { _ = server.Serve(l) }()
	return m, func() { _ = server.Close() }, nil
}

// accepted returns, for each Message-ID, the processes whose copy the
// server accepted, in order.
func (m *mailServer) accepted() map[string][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]string, len(m.copies))
	for id, s := range m.copies {
		out[id] = append([]string(nil), s...)
	}
	return out
}

func (m *mailServer) greylistedFrom(from string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.greylisted[from]
}

type smtpConn struct {
	server *mailServer
	helo   string
	from   string
}

func (s *smtpConn) Mail(from string, _ *gosmtp.MailOptions) error {
	s.from = from
	return nil
}

func (s *smtpConn) Rcpt(to string, _ *gosmtp.RcptOptions) error {
	m := s.server
	m.mu.Lock()
	defer m.mu.Unlock()
	pair := s.from + " " + to
	if m.pairs[pair] {
		return nil
	}
	m.pairs[pair] = true
	if len(m.pairs)%m.greylistEvery != 0 {
		return nil
	}
	m.greylisted[s.from]++
	return &gosmtp.SMTPError{Code: 451, EnhancedCode: gosmtp.EnhancedCode{4, 7, 1}, Message: "Greylisted, try again later"}
}

func (s *smtpConn) Data(r io.Reader) error {
	msg, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, msg.Body); err != nil {
		return err
	}
	id := msg.Header.Get("Message-Id")
	if id == "" {
		return &gosmtp.SMTPError{Code: 554, EnhancedCode: gosmtp.EnhancedCode{5, 6, 0}, Message: "No Message-ID"}
	}
	s.server.mu.Lock()
	s.server.copies[id] = append(s.server.copies[id], s.helo)
	s.server.mu.Unlock()
	return nil
}

func (s *smtpConn) Reset()        { s.from = "" }
func (s *smtpConn) Logout() error { return nil }
