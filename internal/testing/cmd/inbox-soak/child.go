package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

// childEnv carries a consumer child's spec, as JSON: a process started
// with it consumes instead of running the soak (main and TestMain check).
const childEnv = "INBOX_SOAK_CHILD"

// childSpec is what a consumer child needs to join the group.
type childSpec struct {
	Driver, DSN        string
	Tables             stream.Tables
	Addrs              []string
	Topic, Group       string
	Partitions         int
	ErrRate, PanicRate float64
}

// childLifetime bounds a child's life if nobody kills it.
const childLifetime = 30 * time.Minute

// child is a consumer process the soak started.
type child struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	once sync.Once
}

// startChild starts a consumer in a child process: this program (or test
// binary) again, with the spec in childEnv.
func (s *soak) startChild() error {
	raw, err := json.Marshal(childSpec{
		Driver: s.o.driver, DSN: s.cdsn, Tables: stream.Tables{Inbox: s.inbox, Effects: s.effects},
		Addrs: s.addrs, Topic: s.topic, Group: s.group, Partitions: s.o.partitions,
		ErrRate: s.o.errRate, PanicRate: s.o.panicRate,
	})
	if err != nil {
		return err
	}
	c := &child{cmd: exec.Command(os.Args[0]), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("starting a consumer process: %w", err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	s.child = c
	return nil
}

// kill SIGKILLs the child, as a consumer dies in production: no deferred
// function runs, no connection is closed, its transaction is cut wherever
// it was. It returns once the child is dead, and whether it was still
// running when killed.
func (c *child) kill() (alive bool) {
	c.once.Do(func() {
		select {
		case <-c.done:
		default:
			alive = c.cmd.Process.Signal(syscall.SIGKILL) == nil
		}
		<-c.done
	})
	return alive
}

// runChild consumes as one member of the soak's group until this process
// is killed, its parent dies, or childLifetime passes.
func runChild(raw string) error {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("decoding the child's spec: %w", err)
	}
	ctx := context.Background()
	target, err := stream.Connect(ctx, spec.Driver, spec.DSN, spec.Tables, spec.Partitions+4)
	if err != nil {
		return err
	}
	defer target.Close()
	s := &soak{
		o:      options{driver: spec.Driver, errRate: spec.ErrRate, panicRate: spec.PanicRate},
		target: target, addrs: spec.Addrs, topic: spec.Topic, group: spec.Group,
		inbox: spec.Tables.Inbox, effects: spec.Tables.Effects,
	}
	if err := s.join(); err != nil {
		return err
	}
	parent := os.Getppid()
	for deadline := time.Now().Add(childLifetime); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if os.Getppid() != parent {
			return errors.New("the soak died: stopping")
		}
	}
	return errors.New("nobody killed this consumer process")
}
