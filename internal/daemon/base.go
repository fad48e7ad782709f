package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Base is what every daemon sets up the same way around its own work: a logger whose
// level a reload may change, a metrics registry with the Go and process collectors,
// the counter of configuration changes, the admin endpoint (its listener, its guard
// by token and Host, and where the token in force came from) and the lame-duck stop.
// A daemon embeds it, calls Init first, and reads and applies the admin endpoint's
// access with ReadAdminAccess and SetAdminAccess at start and on reload.
type Base struct {
	// Log is the daemon's logger (Init); its level is Level.
	Log *slog.Logger
	// Level is Log's level, which SetLevel changes.
	Level slog.LevelVar
	// Reg is the daemon's metrics registry (Init), served on /metrics.
	Reg *prometheus.Registry
	// Auth guards the admin endpoint; the daemon's admin handler wraps its routes in
	// it. ReadAdminAccess and SetAdminAccess set its token and hosts.
	Auth AdminAuth
	// Lame is the daemon's stop: /healthz unhealthy for its Delay, then the shutdown.
	Lame LameDuck

	changes   *prometheus.CounterVec // NewChanges; nil: changes are not counted
	tokenFile string                 // where the admin token in force came from; "" for none
	admin     net.Listener
	adminSrv  *http.Server

	servingOnce sync.Once
	serving     chan struct{}
	markOnce    sync.Once
}

// Init makes Log, a text logger writing to w at level (already validated: LogLevel),
// and Reg with the Go and process collectors, and gives Log to Auth and Lame.
func (b *Base) Init(w io.Writer, level string) {
	b.SetLevel(level)
	b.Log = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: &b.Level}))
	b.Auth.Logger, b.Lame.Logger = b.Log, b.Log
	b.Reg = prometheus.NewRegistry()
	b.Reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// SetLevel sets Log's level to level (already validated; empty means info).
func (b *Base) SetLevel(level string) {
	lvl, _ := LogLevel(level)
	b.Level.Set(lvl)
}

// NewChanges registers in Reg the counter of configuration changes, name, with the
// labels source (what made the change: "reload", "api") and result ("ok", "error");
// CountChange counts in it.
func (b *Base) NewChanges(name, help string) {
	b.changes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"source", "result"})
	b.Reg.MustRegister(b.changes)
}

// CountChange counts a change from source that ended with err (nil: ok).
func (b *Base) CountChange(source string, err error) {
	if b.changes != nil {
		b.changes.WithLabelValues(source, Result(err)).Inc()
	}
}

// AdminConfig is an admin endpoint's settings as a daemon's configuration file gives
// them.
type AdminConfig struct {
	// Listen is admin_listen; "off" means no admin endpoint, and no token.
	Listen string
	// TokenFile is admin_token_file: the token is read from it. Empty: generated.
	TokenFile string
	// Insecure is admin_insecure: without TokenFile, no token.
	Insecure bool
	// Hosts is admin_hosts (AdminAuth.SetHosts).
	Hosts []string
	// StateDir is the directory the token is generated in (AdminToken).
	StateDir string
}

// FixedChanges names the settings of c fixed at start that next changes:
// admin_listen, admin_insecure, state_dir.
func (c AdminConfig) FixedChanges(next AdminConfig) []string {
	var diff []string
	if c.Listen != next.Listen {
		diff = append(diff, "admin_listen")
	}
	if c.Insecure != next.Insecure {
		diff = append(diff, "admin_insecure")
	}
	if c.StateDir != next.StateDir {
		diff = append(diff, "state_dir")
	}
	return diff
}

// TokenSummary says where the admin endpoint's token comes from, for a daemon's
// check command: "off", "token from FILE", "no token: admin_insecure" or "token in
// STATE_DIR/admin.token, generated if missing".
func (c AdminConfig) TokenSummary() string {
	switch {
	case c.Listen == "off":
		return "off"
	case c.TokenFile != "":
		return "token from " + c.TokenFile
	case c.Insecure:
		return "no token: admin_insecure"
	}
	return "token in " + filepath.Join(c.StateDir, GeneratedTokenFile) + ", generated if missing"
}

// RestartError is a reload refused because it changes settings fixed at start.
type RestartError struct {
	// Daemon is the daemon's name, for the message.
	Daemon string
	// Fields name the settings changed, by their names in the file.
	Fields []string
}

func (e *RestartError) Error() string {
	return strings.Join(e.Fields, ", ") + " cannot change at runtime: restart " + e.Daemon + " to apply"
}

// Restart returns a RestartError of daemon naming fields, or nil when there are none.
func Restart(daemon string, fields []string) error {
	if len(fields) == 0 {
		return nil
	}
	return &RestartError{Daemon: daemon, Fields: slices.Clone(fields)}
}

// AdminAccess is who may use an admin endpoint, read from an AdminConfig and not yet
// in force: the token and the file it came from, and the hosts.
type AdminAccess struct {
	token []byte
	file  string
	hosts []string
}

// ReadAdminAccess reads the token c gives (AdminToken: from its file, generated in
// its state directory, or none with Insecure or when the endpoint is off) and warns
// about a token file others can read. Nothing changes until SetAdminAccess.
func (b *Base) ReadAdminAccess(c AdminConfig) (AdminAccess, error) {
	a := AdminAccess{hosts: c.Hosts}
	if c.Listen == "off" {
		return a, nil
	}
	var err error
	if a.token, a.file, err = AdminToken(c.TokenFile, c.Insecure, c.StateDir, b.Log); err != nil {
		return AdminAccess{}, err
	}
	return a, nil
}

// SetAdminAccess puts a in force: Auth's token and hosts, and TokenFile.
func (b *Base) SetAdminAccess(a AdminAccess) {
	b.Auth.SetToken(a.token)
	b.Auth.SetHosts(a.hosts)
	b.tokenFile = a.file
}

// TokenFile returns the file the admin token in force came from; "" for none. It is
// read on the goroutine that sets the access, or after Serving.
func (b *Base) TokenFile() string { return b.tokenFile }

// ServeAdmin listens on addr (unless it is "off") and serves h there in the
// background, reading a request's header for at most 5s. It logs the address and,
// with a token, its file and a request to examplePath that sends it. h is served as
// it is: the daemon's handler wraps what it serves in Auth.
func (b *Base) ServeAdmin(addr string, h http.Handler, examplePath string) error {
	if addr == "off" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	b.admin = ln
	b.adminSrv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go b.adminSrv.Serve(ln)
	example := fmt.Sprintf("curl http://%s%s", ln.Addr(), examplePath)
	if b.tokenFile != "" {
		example = fmt.Sprintf("curl -H \"Authorization: Bearer $(cat %s)\" http://%s%s", b.tokenFile, ln.Addr(), examplePath)
	}
	b.Log.Info("admin", "addr", ln.Addr().String(), "token_required", b.Auth.Enabled(), "token_file", b.tokenFile, "example", example)
	return nil
}

// AdminAddr returns the admin listener's address, or nil.
func (b *Base) AdminAddr() net.Addr {
	if b.admin == nil {
		return nil
	}
	return b.admin.Addr()
}

// CloseAdmin closes the admin endpoint and its connections at once, if it serves.
func (b *Base) CloseAdmin() {
	if b.adminSrv != nil {
		b.adminSrv.Close()
	}
}

// ShutdownAdmin stops the admin endpoint, letting requests in progress finish until
// ctx ends; then it closes what is left.
func (b *Base) ShutdownAdmin(ctx context.Context) {
	if b.adminSrv != nil {
		if err := b.adminSrv.Shutdown(ctx); err != nil {
			b.adminSrv.Close()
		}
	}
}

// Serving returns a channel closed once the daemon serves (MarkServing): its
// listeners and its admin endpoint are up. A Run that fails before never closes it.
func (b *Base) Serving() <-chan struct{} {
	b.servingOnce.Do(func() { b.serving = make(chan struct{}) })
	return b.serving
}

// MarkServing closes Serving's channel; later calls do nothing.
func (b *Base) MarkServing() {
	b.Serving()
	b.markOnce.Do(func() { close(b.serving) })
}
