package inbox

import (
	"context"
	"reflect"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// workers groups the handler names one middleware has seen by what they
// run: the topic, the subscriber type and the handler function. Names of
// one group are the same handler added several times to take more messages
// of one queue at once: workers of one consumer, which must share one claim
// per event. A fan-out (two functions, each to run every event) is two
// groups. The same function subscribed twice as a fan-out looks like one
// group: it is refused, or shared under a fixed consumer, never doubled.
type workers struct {
	mu     sync.Mutex
	groups map[workerKey][]string // sorted names, replaced, never changed
	of     map[string]workerKey
}

// workerKey is what the names of one group have in common.
type workerKey struct {
	topic, subscriber string
	handler           uintptr // the code of the handler function
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
	code, ok := ctx.Value(handlerCodeKey{}).(uintptr)
	if !ok {
		code = reflect.ValueOf(h).Pointer()
	}
	if code == consumerAdapter() {
		return key, false
	}
	return workerKey{topic: topic, subscriber: message.SubscriberNameFromCtx(ctx), handler: code}, true
}

// consumerAdapter is the code of the closure [message.Router.AddConsumerHandler]
// wraps every function in: it hides which function runs, so that handlers
// added with it go unchecked ([ConsumerHandler] tells).
var consumerAdapter = sync.OnceValue(func() uintptr {
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0
	}
	r.AddConsumerHandler("inbox", "inbox", nil, func(*message.Message) error { return nil })
	return reflect.ValueOf(r.Handlers()["inbox"]).Pointer()
})

// handlerCodeKey carries, in the message context, the code of the function
// [Handler] wraps: the middleware sees only Handler's own closure, which is
// the same for every handler.
type handlerCodeKey struct{}
