package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kfake"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// options sizes one soak.
type options struct {
	deliveries int       // messages published, duplicates included
	dupRatio   float64   // share of deliveries that are copies of an earlier event
	partitions int       // of the topic
	members    int       // consumer group members at most, in this process
	driver     string    // one of stream.Drivers
	dsn        string    // the database, reached directly and through the proxy; SQLite: a file
	children   bool      // a consumer in a child process too, SIGKILLed among the faults
	faultEvery int       // committed records between two injected faults
	errRate    float64   // share of handler calls that fail after writing the effect
	panicRate  float64   // share of handler calls that panic after writing the effect
	keep       bool      // keep the tables for inspection
	progress   io.Writer // progress lines, or nil
}

// messageTimeout bounds one message's handling, so a connection left
// half-open by a cut cannot hold its partition forever.
const messageTimeout = 5 * time.Second

// faults counts what the soak injected.
type faults struct {
	crashes       atomic.Int64 // members killed after a commit, before the ack
	left, joined  atomic.Int64 // members leaving and joining the group
	terminations  atomic.Int64 // rounds of pg_terminate_backend, or of KILL CONNECTION on MySQL
	terminated    atomic.Int64 // connections they killed inside a transaction
	proxyCuts     atomic.Int64 // every connection through the proxy cut
	processKills  atomic.Int64 // consumer processes SIGKILLed
	handlerErrors atomic.Int64
	panics        atomic.Int64
}

func (f *faults) total() int64 {
	return f.crashes.Load() + f.left.Load() + f.joined.Load() + f.terminated.Load() + f.proxyCuts.Load() + f.processKills.Load() + f.handlerErrors.Load() + f.panics.Load()
}

// result is what the database says after the soak.
type result struct {
	deliveries, unique, duplicates int
	attempts                       int64 // messages that reached the middleware, redeliveries included
	outcomes                       map[observe.Outcome]int64
	effects, inboxRows             int64
	missing, doubled, unknown      int64 // events without effect, events with more than one, effects of no event
	elapsed                        time.Duration
}

func (r result) violations() int64 {
	v := r.missing + r.doubled + r.unknown
	if r.inboxRows != int64(r.unique) {
		v++
	}
	return v
}

type soak struct {
	o        options
	direct   *stream.Target // for setup, faults and the final check
	target   *stream.Target // the consumers', through the proxy (SQLite: none)
	cdsn     string         // the consumers' DSN
	proxy    *toxiproxy.Proxy
	broker   *kfake.Cluster // nil in a child process
	addrs    []string       // the broker's
	topic    string
	group    string
	app      string // application_name of the consumers' PostgreSQL connections
	db       string // MySQL: the database the soak created for its tables and connections
	adminDSN string // MySQL: the -dsn, to drop db
	inbox    string
	effects  string
	tmp      string // SQLite's directory, when the soak made one
	child    *child

	faults   faults
	attempts atomic.Int64
	outcomes sync.Map // observe.Outcome -> *atomic.Int64
	armCrash atomic.Bool

	mu      sync.Mutex
	members []*member
	stopped sync.WaitGroup // members stopping in the background
}

type member struct {
	router *message.Router
	sub    *kafka.Subscriber
	done   chan struct{}
	once   sync.Once
}

func name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// run is one soak: it publishes, consumes under faults until the group has
// committed every record, checks the effects in the database and writes the
// table to out.
func run(ctx context.Context, o options, out io.Writer) (result, *faults, error) {
	s := &soak{o: o, topic: name("soak"), group: name("soak"), app: name("inbox_soak"), inbox: name("soak_inbox"), effects: name("soak_effects")}
	res, err := s.run(ctx)
	if err == nil {
		s.print(out, res)
	}
	return res, &s.faults, err
}

func (s *soak) run(ctx context.Context) (res result, err error) {
	start := time.Now()
	defer s.teardown()
	if err := s.setup(ctx); err != nil {
		return res, err
	}

	for range s.o.members {
		if err := s.join(); err != nil {
			return res, err
		}
	}
	if s.o.children {
		if err := s.startChild(); err != nil {
			return res, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	unique, published := s.o.deliveries-int(float64(s.o.deliveries)*s.o.dupRatio), make(chan error, 1)
	go func() { published <- s.publish(ctx, unique) }()

	chaosDone := make(chan struct{})
	chaosCtx, stopChaos := context.WithCancel(ctx)
	go func() { defer close(chaosDone); s.chaos(chaosCtx) }()
	defer stopChaos()

	if err := <-published; err != nil {
		return res, fmt.Errorf("publishing: %w", err)
	}
	// Faults go on until nine tenths are consumed, then the group drains.
	if err := s.waitCommitted(ctx, 0.9); err != nil {
		return res, err
	}
	stopChaos()
	<-chaosDone
	if err := s.ensureMember(); err != nil {
		return res, err
	}
	if err := s.waitCommitted(ctx, 1); err != nil {
		return res, err
	}
	s.stopAll()
	if s.child != nil {
		s.child.kill()
		s.child = nil
	}
	res, err = s.check(ctx, unique)
	res.elapsed = time.Since(start)
	return res, err
}

func (s *soak) setup(ctx context.Context) error {
	tables := stream.Tables{Inbox: s.inbox, Effects: s.effects}
	dsn := s.o.dsn
	if s.o.driver == "sqlite" {
		if dsn == "" {
			dir, err := os.MkdirTemp("", "inbox-soak-")
			if err != nil {
				return err
			}
			s.tmp, dsn = dir, filepath.Join(dir, "soak.db")
		}
		dsn = sqlinbox.SQLiteDSN(dsn)
	}
	var err error
	if s.o.driver == "mysql" {
		if dsn, err = s.ownDatabase(ctx, dsn); err != nil {
			return err
		}
	}
	if s.direct, err = stream.Connect(ctx, s.o.driver, dsn, tables, 4); err != nil {
		return err
	}
	if err := s.direct.DB.PingContext(ctx); err != nil {
		return fmt.Errorf("no database at %s: %w", s.o.dsn, err)
	}

	// The consumers reach a database server through a TCP proxy that the
	// soak cuts, under an application_name that pg_terminate_backend
	// targets.
	s.cdsn = dsn
	if s.o.driver != "sqlite" {
		if s.cdsn, err = s.proxied(dsn); err != nil {
			return err
		}
	}
	if s.target, err = stream.Connect(ctx, s.o.driver, s.cdsn, tables, s.o.partitions+4); err != nil {
		return err
	}
	if err := s.target.Create(ctx); err != nil {
		return fmt.Errorf("creating the tables: %w", err)
	}

	s.broker, err = kafkatest.NewCluster()
	if err != nil {
		return err
	}
	s.addrs = s.broker.ListenAddrs()
	return s.broker.CreateTopic(s.topic, int32(s.o.partitions), nil)
}

// ownDatabase creates a MySQL database for the soak and returns dsn with
// it as the connections' database: the soak's transactions are then those
// of sessions in it, and killTransactions kills those only, not another
// program's on the same server.
func (s *soak) ownDatabase(ctx context.Context, dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("parsing -dsn: %w", err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		return "", err
	}
	defer admin.Close()
	name := name("inbox_soak")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("creating the soak's database %s: %w", name, err)
	}
	s.db, s.adminDSN, cfg.DBName = name, dsn, name
	return cfg.FormatDSN(), nil
}

// proxied starts the proxy in front of the server of dsn and returns the
// DSN that reaches it through the proxy.
func (s *soak) proxied(dsn string) (string, error) {
	var upstream string
	var rewrite func(listen string) string
	if s.o.driver == "mysql" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return "", fmt.Errorf("parsing -dsn: %w", err)
		}
		upstream = cfg.Addr
		rewrite = func(listen string) string { cfg.Addr = listen; return cfg.FormatDSN() }
	} else {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parsing -dsn: %w", err)
		}
		upstream = u.Host
		rewrite = func(listen string) string {
			u.Host = listen
			q := u.Query()
			q.Set("application_name", s.app)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	s.proxy = toxiproxy.NewProxy(srv, "database", "127.0.0.1:0", upstream)
	if err := s.proxy.Start(); err != nil {
		return "", fmt.Errorf("starting the proxy: %w", err)
	}
	return rewrite(s.proxy.Listen), nil
}

func (s *soak) teardown() {
	s.stopAll()
	if s.child != nil {
		s.child.kill()
	}
	if s.broker != nil {
		s.broker.Close()
	}
	if s.proxy != nil {
		s.proxy.Stop()
	}
	if s.target != nil {
		s.target.Close()
	}
	if s.direct != nil {
		if !s.o.keep {
			_ = s.direct.Drop(context.Background())
		}
		s.direct.Close()
	}
	if s.db != "" && !s.o.keep {
		if admin, err := sql.Open("mysql", s.adminDSN); err == nil {
			_, _ = admin.Exec("DROP DATABASE IF EXISTS " + s.db)
			_ = admin.Close()
		}
	}
	if s.tmp != "" && !s.o.keep {
		_ = os.RemoveAll(s.tmp)
	}
}

// publish writes every event once and, spread among them, copies of recent
// events (a relay republishing after a crash), for deliveries records in
// all (stream.Publish).
func (s *soak) publish(ctx context.Context, unique int) error {
	return stream.Publish(ctx, s.addrs, s.topic, 0, unique, s.o.deliveries)
}

func (s *soak) records() (n int64) {
	for _, p := range s.broker.PartitionInfos(s.topic) {
		n += p.HighWatermark
	}
	return n
}

func (s *soak) committed() (n int64) {
	g := s.broker.GroupInfo(s.group)
	if g == nil {
		return 0
	}
	for _, c := range g.Commits[s.topic] {
		n += c.Offset
	}
	return n
}

// waitCommitted waits until the group has committed share of the records;
// it gives up when nothing moves for a minute.
func (s *soak) waitCommitted(ctx context.Context, share float64) error {
	want := int64(float64(s.o.deliveries) * share)
	last, lastMove := int64(-1), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n := s.committed()
		if n >= want && (share < 1 || n == s.records()) {
			return nil
		}
		if n != last {
			if s.o.progress != nil && n/10000 != last/10000 {
				fmt.Fprintf(s.o.progress, "committed %d/%d, %d faults\n", n, s.o.deliveries, s.faults.total())
			}
			last, lastMove = n, time.Now()
		}
		if time.Since(lastMove) > time.Minute {
			s.mu.Lock()
			members := len(s.members)
			s.mu.Unlock()
			return fmt.Errorf("consumption stalled at %d of %d records with %d members", n, s.o.deliveries, members)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (s *soak) saramaConfig() *sarama.Config {
	return kafkatest.SubscriberConfig(kafkatest.SessionTimeout)
}

type committedKey struct{}

// join starts a new member of the consumer group.
func (s *soak) join() error {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               s.addrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: s.saramaConfig(),
		ConsumerGroup:         s.group,
		NackResendSleep:       10 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: s.target.Store, Consumer: "soak", Observer: s})
	if err != nil {
		return err
	}
	m := &member{router: router, sub: sub, done: make(chan struct{})}
	router.AddConsumerHandler("soak", s.topic, sub, s.handle).AddMiddleware(middleware.Recoverer, s.crashAfterCommit(m), mw)
	go func() {
		defer close(m.done)
		_ = router.Run(context.Background())
	}()
	select {
	case <-router.Running():
	case <-m.done:
		return errors.New("a member's router stopped at start")
	}
	s.mu.Lock()
	s.members = append(s.members, m)
	s.mu.Unlock()
	return nil
}

// crashAfterCommit kills the member, when a crash is armed, right after a
// message's transaction committed and before its ack reaches Kafka: the
// subscriber closes first, then the router, and the message is nacked. Its
// offset is not committed, so another member receives it again. As a
// supervisor would, the soak then starts a new member in its place: a
// crash of the last member must not leave the group empty.
func (s *soak) crashAfterCommit(m *member) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			s.attempts.Add(1)
			committed := new(atomic.Bool)
			// A deadline per message, as a service should have: a
			// connection left half-open by a cut would otherwise hold
			// its partition forever.
			ctx, cancel := context.WithTimeout(msg.Context(), messageTimeout)
			defer cancel()
			msg.SetContext(context.WithValue(ctx, committedKey{}, committed))
			out, err := h(msg)
			if err != nil || !committed.Load() || !s.armCrash.CompareAndSwap(true, false) {
				return out, err
			}
			s.faults.crashes.Add(1)
			s.remove(m)
			s.stopLater(m, true)
			return nil, errors.New("member killed after commit, before ack")
		}
	}
}

// handle is the effect: one row in a table without a unique key, so that a
// second effect of one event shows as a second row. Some calls then fail or
// panic, which must roll the row back.
func (s *soak) handle(msg *message.Message) error {
	ctx := msg.Context()
	id, _, _ := inbox.EventIDFromContext(ctx)
	if err := s.target.WriteEffect(ctx, id); err != nil {
		return fmt.Errorf("writing the effect: %w", err)
	}
	switch r := mrand.Float64(); {
	case r < s.o.errRate:
		s.faults.handlerErrors.Add(1)
		return errors.New("injected handler error")
	case r < s.o.errRate+s.o.panicRate:
		s.faults.panics.Add(1)
		panic("injected handler panic")
	}
	if c, ok := ctx.Value(committedKey{}).(*atomic.Bool); ok {
		return inbox.AfterCommit(ctx, func(context.Context) error { c.Store(true); return nil })
	}
	return nil
}

// Start implements observe.Observer: the soak counts outcomes.
func (s *soak) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		v, _ := s.outcomes.LoadOrStore(ob.Outcome, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
}

func (m *member) stop(abrupt bool) {
	m.once.Do(func() {
		if abrupt {
			_ = m.sub.Close()
			_ = m.router.Close()
		} else {
			_ = m.router.Close()
			_ = m.sub.Close()
		}
		<-m.done
	})
}

// stopLater stops m in the background; stopAll waits for it. A crashed
// member stops abruptly and a new one takes its place.
func (s *soak) stopLater(m *member, crashed bool) {
	s.stopped.Add(1)
	go func() {
		defer s.stopped.Done()
		m.stop(crashed)
		if !crashed {
			return
		}
		for range 50 {
			if s.join() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

func (s *soak) remove(m *member) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.members {
		if x == m {
			s.members = append(s.members[:i], s.members[i+1:]...)
			return true
		}
	}
	return false
}

func (s *soak) ensureMember() error {
	s.mu.Lock()
	n := len(s.members)
	s.mu.Unlock()
	if n > 0 {
		return nil
	}
	return s.join()
}

func (s *soak) stopAll() {
	s.mu.Lock()
	ms := s.members
	s.members = nil
	s.mu.Unlock()
	for _, m := range ms {
		m.stop(false)
	}
	s.stopped.Wait()
}

// chaos injects a fault each time the group has committed faultEvery more
// records, in turn: a crash after commit, a member leaving, the consumers'
// connections killed inside their transactions, a cut of every proxied
// connection, a member joining, the consumer child process SIGKILLed and
// a new one started. Faults a database cannot have (SQLite has no server
// connections) are skipped. Pacing by progress rather than by time keeps
// the group consuming between rebalances on a slow machine.
func (s *soak) chaos(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		for s.committed() < int64((i+1)*s.o.faultEvery) {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		switch i % 6 {
		case 0:
			s.armCrash.Store(true)
		case 1:
			s.mu.Lock()
			var m *member
			if len(s.members) > 1 {
				m = s.members[mrand.IntN(len(s.members))]
			}
			s.mu.Unlock()
			if m != nil && s.remove(m) {
				s.faults.left.Add(1)
				s.stopLater(m, false)
			}
		case 2:
			if n, ok := s.killTransactions(ctx); ok {
				s.faults.terminations.Add(1)
				s.faults.terminated.Add(n)
			}
		case 3:
			if s.proxy != nil {
				s.proxy.Stop()
				if err := s.proxy.Start(); err == nil {
					s.faults.proxyCuts.Add(1)
				}
			}
		case 5:
			if s.child != nil {
				if s.child.kill() {
					s.faults.processKills.Add(1)
				} else if s.o.progress != nil {
					fmt.Fprintf(s.o.progress, "the consumer process had exited:\n%s", s.child.out.String())
				}
				s.child = nil
				if err := s.startChild(); err != nil && s.o.progress != nil {
					fmt.Fprintln(s.o.progress, "starting a consumer process:", err)
				}
			}
		}
		// Keep the group between one and members members.
		s.mu.Lock()
		n := len(s.members)
		s.mu.Unlock()
		if n == 0 || (i%6 == 4 && n < s.o.members) {
			if s.join() == nil {
				s.faults.joined.Add(1)
			}
		}
	}
}

// killTransactions kills the consumers' connections that are inside a
// transaction, from the server side, and returns how many it killed; ok is
// false where the database has no such connections (SQLite).
func (s *soak) killTransactions(ctx context.Context) (n int64, ok bool) {
	switch s.direct.Dialect() {
	case sqlinbox.PostgreSQL:
		err := s.direct.DB.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = $1 AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`, s.app).Scan(&n)
		return n, err == nil
	case sqlinbox.MySQL:
		// The soak's sessions are those in its own database.
		rows, err := s.direct.DB.QueryContext(ctx, `SELECT t.trx_mysql_thread_id FROM information_schema.innodb_trx t
			JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
			WHERE p.db = ? AND t.trx_mysql_thread_id <> CONNECTION_ID()`, s.db)
		if err != nil {
			return 0, false
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if rows.Scan(&id) == nil {
				ids = append(ids, id)
			}
		}
		_ = rows.Close()
		for _, id := range ids {
			if _, err := s.direct.DB.ExecContext(ctx, fmt.Sprintf(`KILL CONNECTION %d`, id)); err == nil {
				n++
			}
		}
		return n, true
	}
	return 0, false
}

// check reads the verdict from the database: one effect row per event,
// none missing, none extra, one inbox row per event.
func (s *soak) check(ctx context.Context, unique int) (result, error) {
	r := result{deliveries: s.o.deliveries, unique: unique, duplicates: s.o.deliveries - unique, attempts: s.attempts.Load(), outcomes: map[observe.Outcome]int64{}}
	s.outcomes.Range(func(k, v any) bool {
		r.outcomes[k.(observe.Outcome)] = v.(*atomic.Int64).Load()
		return true
	})
	v, err := stream.Count(ctx, s.direct, unique)
	if err != nil {
		return r, fmt.Errorf("checking the effects: %w", err)
	}
	r.effects, r.inboxRows = int64(v.Effects), int64(v.InboxRows)
	r.missing, r.doubled, r.unknown = int64(v.Missing), int64(v.Doubled), int64(v.Unknown)
	return r, nil
}

func (s *soak) print(out io.Writer, r result) {
	f := &s.faults
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, v any, note string) { fmt.Fprintf(w, "%s\t%v\t  %s\n", label, v, note) }
	row("database", s.o.driver, "")
	row("deliveries", r.deliveries, "records published to Kafka")
	row("unique events", r.unique, "")
	row("duplicates", r.duplicates, fmt.Sprintf("%.1f%% of deliveries, published as relay retries", 100*float64(r.duplicates)/float64(r.deliveries)))
	row("handled", r.attempts, "messages that reached the inbox in this process, redeliveries after faults included")
	for _, o := range []observe.Outcome{observe.Processed, observe.Duplicate, observe.RolledBack, observe.ClaimFailed, observe.CommitFailed, observe.InFlight} {
		row("  "+string(o), r.outcomes[o], "")
	}
	row("faults injected", f.total(), "")
	row("  crashes after commit", f.crashes.Load(), "member killed before the ack")
	row("  members left", f.left.Load(), "")
	row("  members joined", f.joined.Load(), "")
	row("  connections killed", f.terminated.Load(), fmt.Sprintf("inside a transaction, by the server (pg_terminate_backend, KILL CONNECTION), in %d rounds", f.terminations.Load()))
	row("  proxy cuts", f.proxyCuts.Load(), "every consumer connection cut at once")
	row("  process kills", f.processKills.Load(), "the consumer child process SIGKILLed, a new one started")
	row("  handler errors", f.handlerErrors.Load(), "")
	row("  handler panics", f.panics.Load(), "")
	row("effects", r.effects, "rows written by committed handlers")
	row("inbox rows", r.inboxRows, "")
	row("missing effects", r.missing, "")
	row("double effects", r.doubled, "")
	row("unknown effects", r.unknown, "")
	row("violations", r.violations(), "")
	row("elapsed", r.elapsed.Round(time.Millisecond), fmt.Sprintf("%.0f deliveries/s", float64(r.deliveries)/r.elapsed.Seconds()))
	_ = w.Flush()
}
