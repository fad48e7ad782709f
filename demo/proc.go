package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
)

// stopGrace is how long a daemon has to stop after SIGTERM before it is killed.
const stopGrace = 15 * time.Second

// healthWait is how long a daemon has to answer on /healthz after it started.
const healthWait = 20 * time.Second

// stack is what a demo run has started, torn down in reverse order by close: daemons
// stopped gracefully, then the other clean-ups (listeners, namespaces).
type stack struct {
	out   io.Writer
	bin   string // where the daemons' binaries are
	steps []func()
	died  chan *proc.Process // daemons that ended on their own, in the order they did
	// lost are the daemons started with startExpendable that ended on their own:
	// LDs people kill to see the others carry their connections on.
	lost chan *proc.Process
}

func newStack(out io.Writer, bin string) *stack {
	return &stack{out: out, bin: bin, died: make(chan *proc.Process, 16), lost: make(chan *proc.Process, 16)}
}

// onClose adds f to the tear-down; the last added runs first.
func (s *stack) onClose(f func()) { s.steps = append(s.steps, f) }

// close tears everything down.
func (s *stack) close() {
	for i := len(s.steps) - 1; i >= 0; i-- {
		s.steps[i]()
	}
	s.steps = nil
}

// start runs args in ns (nil: the host) with its output in logPath, and adds its stop to
// the tear-down. The daemon gets SIGTERM if tgdemo dies without tearing down, and runs
// in its own process group, so a Ctrl-C reaches tgdemo only and tgdemo stops it in turn.
func (s *stack) start(name, logPath string, env []string, ns *netNS, args ...string) (*proc.Process, error) {
	return s.startTo(s.died, name, logPath, env, ns, args...)
}

// startExpendable is start for a daemon whose end, once it ran, does not end the
// demo: it is reported on s.lost instead of s.died.
func (s *stack) startExpendable(name, logPath string, env []string, ns *netNS, args ...string) (*proc.Process, error) {
	return s.startTo(s.lost, name, logPath, env, ns, args...)
}

func (s *stack) startTo(ended chan *proc.Process, name, logPath string, env []string, ns *netNS, args ...string) (*proc.Process, error) {
	cmd := ns.command(args[0], args[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	p, err := proc.Start(name, logPath, cmd)
	if err != nil {
		return nil, err
	}
	stopping := make(chan struct{})
	go func() {
		<-p.Done()
		select {
		case <-stopping:
		default:
			ended <- p
		}
	}()
	s.onClose(func() {
		close(stopping)
		_ = p.Stop(stopGrace)
		fmt.Fprintf(s.out, "%s stopped\n", p.Name)
	})
	return p, nil
}

// nsHTTP returns an HTTP client whose connections are made inside ns.
func nsHTTP(ns *netNS, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext:       nsDialer(ns),
		DisableKeepAlives: true,
	}}
}

// nsDialer returns a DialContext that creates its sockets inside ns.
func nsDialer(ns *netNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.do(func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
