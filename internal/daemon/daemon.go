// Package daemon holds what every Tiergate daemon shares: strict YAML configuration
// files, log levels, the command line, the admin endpoint's /metrics and /healthz, its
// bearer-token authentication and its one error shape (APIError, WriteError, Handler),
// the lame-duck stop, and state files written so that a crash never leaves half of one.
// Base puts the common parts of a daemon together (logger, registry, admin endpoint,
// its token), and Owner runs a daemon's changes one at a time on one goroutine.
package daemon

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/internal/config"
)

// DecodeYAML decodes data into v, refusing unknown fields; an empty document leaves v
// as it is. name is used in errors. A value v's type reads as text (an address, a
// duration) that does not parse is reported by its path and line (config.Locate).
func DecodeYAML(data []byte, name string, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && err != io.EOF {
		if fe := config.Locate(data, v); fe != nil {
			err = fe
		}
		return fmt.Errorf("configuration %s: %w", name, err)
	}
	return nil
}

// LogLevel parses debug, info, warn or error; empty means info.
func LogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log_level %q: want debug, info, warn or error", s)
}

// NewLogger returns a text logger at level (already validated) writing to w.
func NewLogger(level string, w io.Writer) *slog.Logger {
	lvl, _ := LogLevel(level)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

// Result is the result label of a change's metric: "ok" when err is nil, else
// "error".
func Result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// AdminMux serves /metrics from reg and /healthz from healthy; callers may add routes.
func AdminMux(reg *prometheus.Registry, healthy func() error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}

// ReadConfig reads the YAML configuration file at path into a new T (unknown fields
// are errors) and checks it with validate, which may fill in defaults.
func ReadConfig[T any](path string, validate func(*T) error) (*T, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading configuration: %w", err)
	}
	return ParseConfig(data, path, validate)
}

// ParseConfig is ReadConfig of data; name is used in errors.
func ParseConfig[T any](data []byte, name string, validate func(*T) error) (*T, error) {
	c := new(T)
	if err := DecodeYAML(data, name, c); err != nil {
		return nil, err
	}
	if err := validate(c); err != nil {
		return nil, fmt.Errorf("configuration %s: %w", name, err)
	}
	return c, nil
}
