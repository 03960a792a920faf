package conformancetest

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// Logger captures what the middleware logs, safe to read while it logs from
// a goroutine of its own (a lease's heartbeat): watermill's capture logger
// hands out the map it writes to.
type Logger struct {
	mu       sync.Mutex
	captured *watermill.CaptureLoggerAdapter
}

// NewLogger returns an empty [Logger].
func NewLogger() *Logger { return &Logger{captured: watermill.NewCaptureLogger()} }

func (l *Logger) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.captured.Error(msg, err, fields)
}

func (l *Logger) Info(msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.captured.Info(msg, fields)
}

func (l *Logger) Debug(msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.captured.Debug(msg, fields)
}

func (l *Logger) Trace(msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.captured.Trace(msg, fields)
}

// With returns l: the middleware adds no fields of its own this way.
func (l *Logger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// Errors returns a copy of the lines logged at error level so far.
func (l *Logger) Errors() []watermill.CapturedMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]watermill.CapturedMessage(nil), l.captured.Captured()[watermill.ErrorLogLevel]...)
}

// Warnings returns a copy of the warnings logged so far: info lines with a
// "warning" field, as the middleware logs a suspicion.
func (l *Logger) Warnings() []watermill.CapturedMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return warnings(l.captured.Captured()[watermill.InfoLogLevel])
}

func warnings(lines []watermill.CapturedMessage) []watermill.CapturedMessage {
	var out []watermill.CapturedMessage
	for _, m := range lines {
		if _, ok := m.Fields["warning"]; ok {
			out = append(out, m)
		}
	}
	return out
}

// Infos returns a copy of the lines logged at info level so far.
func (l *Logger) Infos() []watermill.CapturedMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]watermill.CapturedMessage(nil), l.captured.Captured()[watermill.InfoLogLevel]...)
}
