package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// readmeStack is [conformancetest.ReadmeStack], the README's stack on an
// in-memory pub/sub, whose router, inbox and Backoff log to logs.
type readmeStack struct {
	*conformancetest.ReadmeStack
	logs *watermill.CaptureLoggerAdapter
}

const readmeRetries = conformancetest.ReadmeRetries

func newReadmeStack(t *testing.T, cfg inbox.Config, backoff inbox.BackoffConfig, h message.NoPublishHandlerFunc) *readmeStack {
	t.Helper()
	logs := watermill.NewCaptureLogger()
	cfg.Logger = logs
	return &readmeStack{conformancetest.NewReadmeStack(t, newMiddleware(t, cfg), backoff, logs, h), logs}
}

// errorLines returns the error-level lines logged with field key set to
// value.
func (s *readmeStack) errorLines(key, value string) []watermill.CapturedMessage {
	var lines []watermill.CapturedMessage
	for _, l := range s.logs.Captured()[watermill.ErrorLogLevel] {
		if l.Fields[key] == value {
			lines = append(lines, l)
		}
	}
	return lines
}

// A handler's own error is poisoned after the retries whatever its Go type:
// a truncated JSON payload (io.ErrUnexpectedEOF), an empty one (io.EOF), a
// mistyped URL (*url.Error, a refused connection inside). Each looks like a
// broken connection by type, but the claim's own connection still answers,
// so the inbox has no evidence of an outage: 4 calls, then the poison queue,
// nothing committed.
func TestHandlerErrorsPoisonedWhateverTheirType(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mistyped := "http://" + l.Addr().String() + "/charge" // nothing listens there
	require.NoError(t, l.Close())
	client := http.Client{Timeout: 5 * time.Second}
	cases := []struct {
		name    string
		payload string
		handle  func(msg *message.Message) error
		is      func(err error) bool
	}{
		{"truncated JSON", `{"amount": 1`, decodePayload, func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"empty payload", ``, decodePayload, func(err error) bool { return errors.Is(err, io.EOF) }},
		{"mistyped URL", `{}`, func(*message.Message) error {
			resp, err := client.Post(mistyped, "application/json", strings.NewReader(`{}`))
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		}, func(err error) bool {
			var u *url.Error
			return errors.As(err, &u)
		}},
	}
	for _, name := range []string{"sqlite", "lib/pq", "pgx-stdlib", "mariadb"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					var calls atomic.Int64
					var last atomic.Value
					s := newReadmeStack(t, inbox.Config{Store: e.store(t, sqlinbox.Config{})}, inbox.BackoffConfig{}, func(msg *message.Message) error {
						calls.Add(1)
						if err := e.insertEffect(msg); err != nil {
							return err
						}
						err := c.handle(msg)
						last.Store(err)
						return err
					})
					s.Deliver(t, eventMsg("order-1", c.payload))
					require.EqualValues(t, 1+readmeRetries, calls.Load(), "the handler's calls: the retry budget")
					err, _ := last.Load().(error)
					require.True(t, c.is(err), "the handler's error is not the case's: %v", err)
					require.Len(t, s.Poisoned(), 1)
					require.Zero(t, e.effectCount(t))
				})
			}
		})
	}
}

// A handler that knows no redelivery can help (a malformed payload) marks
// its error with inbox.Permanent: behind the README's stack the message is
// poisoned at once, after one call, with nothing committed. The mark is the
// handler's word: it holds inside a Transient mark, and over evidence of an
// outage (the server ended the claim's connection under the handler).
func TestPermanentMarkPoisonsAtOnce(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "lib/pq"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name)
			cases := map[string]func(msg *message.Message) error{
				"malformed payload": func(msg *message.Message) error {
					return inbox.Permanent(decodePayload(msg))
				},
				"inside a Transient mark": func(msg *message.Message) error {
					return inbox.Transient(inbox.Permanent(decodePayload(msg)))
				},
			}
			if name == "lib/pq" {
				cases["over an outage"] = func(msg *message.Message) error {
					terminateBackend(t, e.db, msg)
					return inbox.Permanent(fmt.Errorf("saving the invoice: %w", e.insertEffect(msg)))
				}
			}
			for c, fail := range cases {
				t.Run(c, func(t *testing.T) {
					var calls atomic.Int64
					s := newReadmeStack(t, inbox.Config{Store: e.store(t, sqlinbox.Config{})}, inbox.BackoffConfig{}, func(msg *message.Message) error {
						calls.Add(1)
						if err := e.insertEffect(msg); err != nil {
							return err
						}
						return fail(msg)
					})
					s.Deliver(t, eventMsg("order-1", `{"amount": 1`))
					require.EqualValues(t, 1, calls.Load(), "the handler's calls")
					require.Len(t, s.Poisoned(), 1)
					require.True(t, inbox.IsPermanent(s.Returned()[0]), "%v", s.Returned()[0])
					require.Zero(t, e.effectCount(t))
				})
			}
		})
	}
}

func decodePayload(msg *message.Message) error {
	var order struct{ Amount int }
	return json.NewDecoder(bytes.NewReader(msg.Payload)).Decode(&order)
}

// A handler's error is transient on evidence only. Marked with
// inbox.Transient (a payment API answering 503), it is waited out in place
// and never poisoned. Returned as a plain string after the server ended the
// claim's connection under it (an ORM that does not wrap), the probe of
// that connection finds it gone: transient. A failed statement on a live
// connection (a syntax error, which aborts a PostgreSQL transaction) is the
// handler's own.
func TestHandlerErrorsTransientOnEvidence(t *testing.T) {
	t.Parallel()
	t.Run("marked by the handler", func(t *testing.T) {
		t.Parallel()
		e := openErrorsDB(t, "sqlite")
		var calls atomic.Int64
		s := newReadmeStack(t, inbox.Config{Store: e.store(t, sqlinbox.Config{})}, inbox.BackoffConfig{InitialInterval: 10 * time.Millisecond}, func(msg *message.Message) error {
			if calls.Add(1) <= 5 {
				return inbox.Transient(errors.New("charging: payment API answered 503"))
			}
			return e.insertEffect(msg)
		})
		s.Deliver(t, eventMsg("order-1", `{}`))
		require.EqualValues(t, 6, calls.Load())
		require.Empty(t, s.Poisoned())
		require.Equal(t, 1, e.effectCount(t))
	})
	for _, name := range []string{"lib/pq", "pgx-stdlib"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name)
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
			_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
				terminateBackend(t, e.db, msg)
				if err := e.insertEffect(msg); err != nil {
					return nil, fmt.Errorf("saving the invoice: %v", err) // the chain lost
				}
				return nil, errors.New("the insert succeeded on a terminated connection")
			})(eventMsg("order-1", `{}`))
			require.True(t, inbox.IsTransient(err), "not transient: %v", err)
			require.Contains(t, err.Error(), "the claim's connection no longer answers")

			_, err = mw(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := inbox.TxFromContext(msg.Context())
				_, err := tx.ExecContext(msg.Context(), `SELEC 1`)
				return nil, err
			})(eventMsg("order-2", `{}`))
			require.Error(t, err)
			require.False(t, inbox.IsTransient(err), "transient: %v", err)
		})
	}
}

// A ShardKey the store cannot keep is refused at NewMiddleware when the
// configuration shows it (a key function without the column, the column
// without a key function), and poisons the message at once when one
// message's key is empty (the docs' Metadata.Get of a header it lacks) or
// longer than the column: every copy of the event gets the same key, so no
// retry can help. The handler is not called.
func TestShardKeyMisconfigurationIsPermanent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQLIfServed(t)
	keyed, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "keyed"), ShardKeyColumn: "shard_key"})
	require.NoError(t, err)
	require.NoError(t, keyed.CreateSchema(ctx))
	plain, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "plain")})
	require.NoError(t, err)
	customer := func(msg *message.Message) (string, error) { return msg.Metadata.Get("customer_id"), nil }

	_, err = inbox.NewMiddleware(inbox.Config{Store: plain, ShardKey: customer})
	require.ErrorIs(t, err, inbox.ErrInvalidShardKey)
	require.ErrorContains(t, err, "has no shard key column")
	_, err = inbox.NewMiddleware(inbox.Config{Store: keyed})
	require.ErrorIs(t, err, inbox.ErrInvalidShardKey)
	require.ErrorContains(t, err, "set inbox.Config.ShardKey")

	var calls atomic.Int64
	s := newReadmeStack(t, inbox.Config{Store: keyed, ShardKey: customer}, inbox.BackoffConfig{}, func(*message.Message) error {
		calls.Add(1)
		return nil
	})
	for _, key := range []string{"", strings.Repeat("k", sqlinbox.MaxShardKeyLength+45)} {
		msg := eventMsg("order-"+fmt.Sprint(len(key)), `{}`)
		if key != "" {
			msg.Metadata.Set("customer_id", key)
		}
		s.Deliver(t, msg)
	}
	reasons := s.Poisoned()
	require.Len(t, reasons, 2)
	for _, r := range reasons {
		require.Contains(t, r, "invalid shard key")
	}
	require.Zero(t, calls.Load())
	ok := eventMsg("order-ok", `{}`)
	ok.Metadata.Set("customer_id", "customer-42")
	s.Deliver(t, ok)
	require.EqualValues(t, 1, calls.Load())
}

// A message refused behind a PoisonQueue, which acks it, leaves a line in
// the log all the same: one per kind and consumer, with the reason. Two
// messages without an event id, two whose id is 300 bytes, two whose
// handler fails: three lines, and every message poisoned.
func TestRefusedAndPoisonedMessagesLogged(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "lib/pq"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name)
			s := newReadmeStack(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), EventID: inbox.EventIDFromMetadata("event_id")}, inbox.BackoffConfig{}, func(msg *message.Message) error {
				return errors.New("customer not found")
			})
			for i := range 2 {
				s.Deliver(t, message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
				s.Deliver(t, eventMsg(strings.Repeat("x", 300), `{}`))
				s.Deliver(t, eventMsg(fmt.Sprintf("order-%d", i), `{}`))
			}
			require.Len(t, s.Poisoned(), 6)
			for kind, reason := range map[string]string{
				"missing_id":     `metadata "event_id" is not set`,
				"invalid_id":     "at most 255 allowed",
				"handler_failed": "customer not found",
			} {
				lines := s.errorLines("kind", kind)
				require.Len(t, lines, 1, kind)
				require.Equal(t, "billing", lines[0].Fields["consumer"])
				require.ErrorContains(t, lines[0].Err, reason)
			}
		})
	}
}

// Backoff waits out a dependency that is down for 2.5 s in place: the
// broker gets no nack, the router logs no error, and the middleware logs
// one line when it starts, at most one per LogInterval (1 s here) while it
// lasts, and one when it ends. The message is processed once.
func TestBackoffWaitsOutQuietly(t *testing.T) {
	t.Parallel()
	e := openErrorsDB(t, "sqlite")
	var calls atomic.Int64
	var down atomic.Value // when the dependency comes back
	s := newReadmeStack(t, inbox.Config{Store: e.store(t, sqlinbox.Config{})},
		inbox.BackoffConfig{InitialInterval: 10 * time.Millisecond, MaxInterval: 200 * time.Millisecond, LogInterval: time.Second},
		func(msg *message.Message) error {
			calls.Add(1)
			if time.Now().Before(down.Load().(time.Time)) {
				return inbox.Transient(errors.New("payments: connection refused"))
			}
			return e.insertEffect(msg)
		})
	const outage = 2500 * time.Millisecond
	start := time.Now()
	down.Store(start.Add(outage))
	s.Deliver(t, eventMsg("order-1", `{}`))
	took := time.Since(start)
	require.GreaterOrEqual(t, took, outage)

	require.Equal(t, 1, e.effectCount(t))
	require.Empty(t, s.Poisoned())
	// Waits of 10 ms doubling to 200 ms: at most 6 to reach the cap, then
	// one per 160 ms at least (200 ms less a fifth).
	require.LessOrEqual(t, calls.Load(), int64(7+took/(160*time.Millisecond)), "attempts")
	var failures, over int
	for level, lines := range s.logs.Captured() {
		for _, l := range lines {
			switch {
			case level == watermill.ErrorLogLevel && strings.HasPrefix(l.Msg, "Inbox: transient failures, waited out"):
				failures++
			case level == watermill.InfoLogLevel && l.Msg == "Inbox: transient failures over":
				over++
			case level == watermill.ErrorLogLevel:
				t.Errorf("another error line: %s %v", l.Msg, l.Err)
			}
		}
	}
	require.Equal(t, 1, over, "the line when it ends")
	require.GreaterOrEqual(t, failures, 1)
	require.LessOrEqual(t, failures, 1+int(took/time.Second), "at most one line per LogInterval")
}

// A handler's deadline that fires while the database does not answer is an
// outage, as before, on each driver: the network stalls under the handler's
// slow statement, then the database stays out of reach for a while. The
// message is waited out in place and processed once it is back
// (conformancetest.DeadlineDuringAnOutage). The same deadline with the
// database answering is the handler's own error (the conformance suite's
// HandlerDeadlineIsItsOwn).
func TestHandlerDeadlineDuringAnOutage(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"lib/pq", "pgx-stdlib", "mariadb"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name) // the table through a connection the outage spares
			driver := map[string]string{"lib/pq": "postgres", "pgx-stdlib": "pgx", "mariadb": "mysql"}[name]
			dsn, proxy := testdb.Proxied(t, driver)
			store, err := sqlinbox.New(testdb.Open(t, driver, dsn), sqlinbox.Config{Dialect: e.dialect, Table: e.store(t, sqlinbox.Config{}).Table()})
			require.NoError(t, err)
			mw := newMiddleware(t, inbox.Config{Store: store})
			conformancetest.DeadlineDuringAnOutage(t, proxy, mw, e.dialect, func(ctx context.Context, query string) error {
				tx, _ := inbox.TxFromContext(ctx)
				_, err := tx.ExecContext(ctx, query)
				return err
			})
		})
	}
}
