package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// child is a sender process of -kill: this program started again with
// -child, sending one variant's emails until it kills itself.
type child struct {
	via                       string // the variant whose emails it sends
	dsn, sqlite, schema, mail string // where the run's database and mail server are
}

// name is the child's EHLO name, with which the mail server records what it
// sent.
func (c child) name() string { return "killed-" + c.via + "-sender" }

// killedAfter is the line a child writes before it dies.
const killedAfter = "accepted, now dying: "

// start runs the child until it has killed itself with SIGKILL, and returns
// the Message-ID of the email it died on.
func (c child) start(ctx context.Context) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	args := []string{"-child", c.via, "-smtp", c.mail}
	if c.dsn != "" {
		args = append(args, "-dsn", c.dsn, "-schema", c.schema)
	} else {
		args = append(args, "-sqlite", c.sqlite)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, exe, args...).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return "", fmt.Errorf("the %s sender did not die: %v\n%s", c.via, err, out)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return "", fmt.Errorf("the %s sender did not die of SIGKILL: %v\n%s", c.via, err, out)
	}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if id, ok := strings.CutPrefix(sc.Text(), killedAfter); ok {
			return id, nil
		}
	}
	return "", fmt.Errorf("the %s sender did not say where it died:\n%s", c.via, out)
}

// run is the child's side: it sends its variant's emails and, right after
// the mail server accepted the second one, before recording it sent, kills
// itself with SIGKILL, as a crash or an OOM kill would: nothing after it
// runs. Its River client does not run for leader; the service's does, and
// rescues the jobs this one leaves running.
func (c child) run() error {
	d, _, err := openDB(c.dsn, c.sqlite, c.schema)
	if err != nil {
		return err
	}
	svc, err := newService(d, c.name(), c.mail, false)
	if err != nil {
		return err
	}
	var accepted atomic.Int64
	svc.accepted = func(id string) {
		if accepted.Add(1) == 2 {
			fmt.Println(killedAfter + id)
			self, _ := os.FindProcess(os.Getpid())
			_ = self.Kill()
			select {} // SIGKILL is on its way
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	switch c.via {
	case viaQueue:
		if err := svc.jobs.Start(ctx); err != nil {
			return err
		}
		<-ctx.Done()
	case viaSweeper:
		svc.runSweeper(ctx, 200*time.Millisecond)
	default:
		return fmt.Errorf("-child %q: want %s or %s", c.via, viaQueue, viaSweeper)
	}
	return errors.New("the sender was never killed: fewer than two emails to send?")
}
