package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
)

// logger gives gobgp's logs to a slog.Logger, under "component=gobgp", with their
// fields in a fixed order.
type logger struct{ l *slog.Logger }

func newLogger(l *slog.Logger) *logger { return &logger{l: l.With("component", "gobgp")} }

func (g *logger) log(level slog.Level, msg string, fields gobgplog.Fields) {
	if !g.l.Enabled(context.Background(), level) {
		return
	}
	args := make([]any, 0, 2*len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		args = append(args, k, fmt.Sprint(fields[k]))
	}
	g.l.Log(context.Background(), level, msg, args...)
}

func (g *logger) Panic(msg string, fields gobgplog.Fields) {
	g.log(slog.LevelError, msg, fields)
	panic("gobgp: " + msg)
}

// Fatal is what gobgp calls when it cannot go on; logrus, its default, exits.
func (g *logger) Fatal(msg string, fields gobgplog.Fields) {
	g.log(slog.LevelError, msg, fields)
	os.Exit(1)
}

func (g *logger) Error(msg string, fields gobgplog.Fields) { g.log(slog.LevelError, msg, fields) }
func (g *logger) Warn(msg string, fields gobgplog.Fields)  { g.log(slog.LevelWarn, msg, fields) }
func (g *logger) Info(msg string, fields gobgplog.Fields)  { g.log(slog.LevelInfo, msg, fields) }
func (g *logger) Debug(msg string, fields gobgplog.Fields) { g.log(slog.LevelDebug, msg, fields) }

// SetLevel is ignored: the level is the daemon's (log_level).
func (g *logger) SetLevel(gobgplog.LogLevel) {}

// GetLevel tells gobgp whether to build its debug messages at all.
func (g *logger) GetLevel() gobgplog.LogLevel {
	if g.l.Enabled(context.Background(), slog.LevelDebug) {
		return gobgplog.DebugLevel
	}
	return gobgplog.InfoLevel
}
