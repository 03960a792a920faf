package bench

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// waiter sleeps for short durations precisely. Go's timers wake an idle
// process through epoll_wait, whose timeout counts in whole milliseconds,
// so a 250 µs sleep takes about 1.1 ms; a timerfd read through the
// runtime's poller wakes when the kernel's timer fires, as the arrival of a
// packet would.
type waiter struct {
	f   *os.File
	buf [8]byte
}

func newWaiter() (*waiter, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("timerfd_create", err)
	}
	return &waiter{f: os.NewFile(uintptr(fd), "timerfd")}, nil
}

func (w *waiter) wait(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	sc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	var serr error
	if err := sc.Control(func(fd uintptr) { serr = unix.TimerfdSettime(int(fd), 0, &spec, nil) }); err != nil {
		return err
	}
	if serr != nil {
		return os.NewSyscallError("timerfd_settime", serr)
	}
	_, err = w.f.Read(w.buf[:]) // the number of expirations, always 1
	return err
}

func (w *waiter) close() { _ = w.f.Close() }
