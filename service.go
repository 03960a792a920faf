package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill"
)

// ConsumerRegistry is implemented by stores that record which service owns
// each consumer of their table ([sqlinbox.Store] and [pgxinbox.Store], in
// a table CreateSchema creates beside the inbox). The middleware registers
// each consumer once per process, before its first claim, and refuses the
// messages of a consumer another service owns: two services whose handlers
// share a name would otherwise share one claim per event, and each event
// would run in only one of them.
//
// [sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type ConsumerRegistry interface {
	// RegisterConsumer records service as the owner of consumer unless a
	// service already owns it, and returns the owner. Without the
	// registry's table it returns an error wrapping
	// [ErrNoConsumerRegistry] that says what to run.
	RegisterConsumer(ctx context.Context, consumer, service string) (owner string, err error)
}

// ErrNoConsumerRegistry means the store's consumer registry table does not
// exist: a table created before the registry, by a migration that does not
// include it yet. The middleware logs it once and processes the consumer's
// messages unchecked.
var ErrNoConsumerRegistry = errors.New("inbox: the consumer registry table does not exist")

// unknownService is the main package path of a binary built from files
// (go run main.go) rather than from a package: every such binary has it.
const unknownService = "command-line-arguments"

// defaultService is the main package path of the running binary, "" when
// it has none that tells it from other binaries.
func defaultService() string {
	info, ok := debug.ReadBuildInfo()
	if !ok || info.Path == unknownService || validateName("service name", info.Path) != nil {
		return ""
	}
	return info.Path
}

// owner is what the registry said about one consumer.
type owner int

const (
	ownedHere owner = iota + 1 // registered to this service, or unchecked
	ownedElsewhere
)

type ownership struct {
	owner owner
	by    string // the other service, for ownedElsewhere
}

// checkOwner refuses a message of a consumer another service owns. The
// registry is asked once per consumer; afterwards a message costs a map
// lookup under a read lock.
func (e *engine) checkOwner(ctx context.Context, consumer string) error {
	if e.registry == nil {
		return nil
	}
	e.ownersMu.RLock()
	o, known := e.owners[consumer]
	e.ownersMu.RUnlock()
	if !known {
		var err error
		if o, err = e.register(ctx, consumer); err != nil {
			return err
		}
	}
	if o.owner == ownedHere {
		return nil
	}
	return e.foreignConsumer(consumer, o.by)
}

// register asks the registry about consumer and remembers the answer; an
// error other than a missing registry is not remembered, so the next
// message asks again.
func (e *engine) register(ctx context.Context, consumer string) (ownership, error) {
	by, err := e.registry.RegisterConsumer(ctx, consumer, e.config.Service)
	o := ownership{owner: ownedHere}
	switch {
	case errors.Is(err, ErrNoConsumerRegistry):
		e.config.Logger.Error("Inbox: the store has no consumer registry, so this consumer is not checked against other services that might use the same name on this table; run the store's CreateSchema, or apply the registry's CREATE TABLE from its SchemaSQL. Logged once per consumer", err, watermill.LogFields{
			"consumer": consumer, "service": e.config.Service,
		})
	case err != nil:
		return o, fmt.Errorf("inbox: registering consumer %q for service %q: %w", consumer, e.config.Service, err)
	case by != e.config.Service:
		o = ownership{owner: ownedElsewhere, by: by}
		e.config.Logger.Error("Inbox: "+e.foreignDetail(consumer, by)+". Every message of the consumer is refused with inbox.ErrMiswired; logged once per consumer", ErrMiswired, watermill.LogFields{
			"consumer": consumer, "service": e.config.Service, "owner": by,
		})
	}
	e.ownersMu.Lock()
	if e.owners == nil {
		e.owners = map[string]ownership{}
	}
	e.owners[consumer] = o
	e.ownersMu.Unlock()
	return o, nil
}

func (e *engine) foreignConsumer(consumer, owner string) error {
	return fmt.Errorf("%w: %s", ErrMiswired, e.foreignDetail(consumer, owner))
}

func (e *engine) foreignDetail(consumer, owner string) string {
	return fmt.Sprintf("consumer %q of this inbox table belongs to service %q, and this is service %q: two services with one consumer name share one claim per event, so each event would run in only one of them. Give this service's consumers names of their own (prefix the handler name with the service, or set inbox.Config.Consumer), or, if both binaries are one service (renamed, or split), give both the same inbox.Config.Service", consumer, owner, e.config.Service)
}
