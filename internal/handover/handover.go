// Package handover hands a broker's deliveries to a Watermill consumer
// without waiting for their acks, for the batch sources (sources/...):
// each delivery is settled on the broker when its message is acked or
// nacked, in the background, so that a batch can hold many.
package handover

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Delivery is how a delivery is settled on its broker.
type Delivery struct {
	Ack, Nack func() error
}

// Deliver sets msg's context (a child of ctx) and sends msg to out, unless
// ctx ends or closing closes first: then it nacks the delivery and returns
// false. Once msg is sent, it settles the delivery in the background, in
// wg: acked when msg is acked, nacked when msg is nacked, left to the
// broker's redelivery when ctx ends or closing closes first. failed
// receives the errors of acks and nacks.
func Deliver(ctx context.Context, closing <-chan struct{}, out chan<- *message.Message, msg *message.Message, d Delivery, wg *sync.WaitGroup, failed func(error)) bool {
	msgCtx, cancel := context.WithCancel(ctx)
	msg.SetContext(msgCtx)
	select {
	case out <- msg:
	case <-ctx.Done():
		cancel()
		failed(d.Nack())
		return false
	case <-closing:
		cancel()
		failed(d.Nack())
		return false
	}
	wg.Go(func() {
		defer cancel()
		select {
		case <-msg.Acked():
			failed(d.Ack())
		case <-msg.Nacked():
			failed(d.Nack())
		case <-ctx.Done():
		case <-closing:
		}
	})
	return true
}
