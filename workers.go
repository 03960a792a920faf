package inbox

import (
	"context"
	"slices"
	"sync"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill/message"
)

// workers groups the handler names one middleware has seen by what they
// run: the topic, the subscriber type and the handler function value. Names
// of one group are one handler added several times to take more messages of
// one queue at once: workers of one consumer, which must share one claim per
// event. A fan-out (each consumer its own function, to run every event) is
// two groups: one function value running its effect twice on purpose is
// no fan-out a user wants.
type workers struct {
	mu     sync.Mutex
	groups map[workerKey][]string // sorted names, replaced, never changed
	of     map[string]workerKey
}

// workerKey is what the names of one group have in common.
type workerKey struct {
	topic, subscriber string
	handler           uintptr // the handler function value ([funcID])
}

// see records that name runs what key says and returns the names of its
// group, sorted, name among them. The slice must not be changed.
func (w *workers) see(name string, key workerKey) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if k, ok := w.of[name]; ok && k == key {
		return w.groups[key]
	}
	if w.of == nil {
		w.of, w.groups = map[string]workerKey{}, map[workerKey][]string{}
	}
	if old, ok := w.of[name]; ok { // the name was reused for another handler
		w.groups[old] = slices.DeleteFunc(slices.Clone(w.groups[old]), func(n string) bool { return n == name })
	}
	w.of[name] = key
	names := append(slices.Clone(w.groups[key]), name)
	slices.Sort(names)
	w.groups[key] = names
	return names
}

// same reports whether names a and b were seen in one group.
func (w *workers) same(a, b string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	ka, oka := w.of[a]
	kb, okb := w.of[b]
	return oka && okb && ka == kb
}

// handlerKey is the group key of a message in a router handler: ok is false
// outside a router, where nothing says what competes.
func handlerKey(ctx context.Context, h message.HandlerFunc) (key workerKey, ok bool) {
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		return key, false
	}
	id, ok := ctx.Value(handlerIDKey{}).(uintptr)
	if !ok {
		id = funcID(h)
	}
	return workerKey{topic: topic, subscriber: message.SubscriberNameFromCtx(ctx), handler: id}, true
}

// handlerIDKey carries, in the message context, the [funcID] of the function
// [Handler] wraps: the middleware sees only Handler's own closure.
type handlerIDKey struct{}

// funcID identifies a function value: the address of its closure, shared by
// every copy of the value and by no other closure while it lives (a
// top-level function's is static). Not its code: a function literal made
// twice, capturing different state (one per consumer of a fan-out), has
// one code and two identities. A handler passed through another
// middleware, or through Router.AddConsumerHandler's adapter, gets an
// identity of its own per handler name, and goes unchecked.
func funcID[F any](f F) uintptr {
	return *(*uintptr)(unsafe.Pointer(&f))
}
