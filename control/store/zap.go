package store

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore is a zap core that writes etcd's logs (it logs through zap only) to a
// slog.Logger: warnings and errors at their level, info and debug at debug, since
// etcd's info messages are its routine (elections, snapshots, compactions). Once
// the store is closing, the errors etcd logs about its own listeners being closed
// are demoted to debug too.
type slogCore struct {
	log     *slog.Logger
	attrs   []slog.Attr
	closing *atomic.Bool
}

// newZapLogger returns a zap logger writing to log through a slogCore.
func newZapLogger(log *slog.Logger, component string, closing *atomic.Bool) *zap.Logger {
	return zap.New(&slogCore{log: log.With("component", component), closing: closing})
}

func level(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return c.log.Enabled(context.Background(), level(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	n := *c
	n.attrs = append(slices.Clip(c.attrs), attrs(fields)...)
	return &n
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	lvl := level(e.Level)
	if lvl > slog.LevelDebug && (routine[e.Message] || c.closing.Load() && shutdownNoise(e.Message, fields)) {
		lvl = slog.LevelDebug
	}
	if !c.log.Enabled(context.Background(), lvl) {
		return nil
	}
	as := append(slices.Clip(c.attrs), attrs(fields)...)
	c.log.LogAttrs(context.Background(), lvl, e.Message, as...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

// attrs turns zap fields into slog attributes, in key order.
func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		out = append(out, slog.Any(k, enc.Fields[k]))
	}
	return out
}

// routine are the warnings etcd logs at every start of the embedded server, about
// settings the store chose: one listener for gRPC and HTTP (the HTTP gateway is off,
// and the socket is the data directory's), and simple auth tokens (etcd auth is not
// used: the socket's directory is the access control).
var routine = map[string]bool{
	"Running http and grpc server on single port. This is not recommended for production.": true,
	"simple token is not cryptographically signed":                                         true,
}

// shutdownNoise tells the messages etcd logs as errors or warnings while it stops
// serving on listeners the store closed.
func shutdownNoise(msg string, fields []zapcore.Field) bool {
	text := msg
	for _, f := range fields {
		if f.Type == zapcore.ErrorType {
			if err, ok := f.Interface.(error); ok {
				text += " " + err.Error()
			}
		}
	}
	text = strings.ToLower(text)
	for _, s := range []string{"server closed", "use of closed network connection", "stopping insecure grpc server", "stopped insecure grpc server"} {
		if strings.Contains(text, s) {
			return true
		}
	}
	return false
}

var _ zapcore.Core = (*slogCore)(nil)
