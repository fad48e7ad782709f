package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// stopGrace is how long a daemon has to stop after SIGTERM before it is killed.
const stopGrace = 15 * time.Second

// proc is a daemon the demo started.
type proc struct {
	name string // as printed: "keyserverd", "l7d l7a", ...
	log  string // its log file
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// stack is what a demo run has started, torn down in reverse order by close: daemons
// stopped gracefully, then the other clean-ups (listeners, namespaces).
type stack struct {
	out   io.Writer
	bin   string // where the daemons' binaries are
	steps []func()
	died  chan *proc // daemons that ended on their own, in the order they did
}

func newStack(out io.Writer, bin string) *stack {
	return &stack{out: out, bin: bin, died: make(chan *proc, 16)}
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
func (s *stack) start(name, logPath string, env []string, ns *netNS, args ...string) (*proc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating %s's log: %w", name, err)
	}
	cmd := ns.command(args[0], args[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	stopping := make(chan struct{})
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
		select {
		case <-stopping:
		default:
			s.died <- p
		}
	}()
	s.onClose(func() {
		close(stopping)
		p.stop()
		fmt.Fprintf(s.out, "%s stopped\n", p.name)
	})
	return p, nil
}

// stop sends SIGTERM and waits for the daemon to end, killing it after stopGrace.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exitError describes how p ended, with the tail of its log.
func (p *proc) exitError() error {
	return fmt.Errorf("%s exited: %v (log %s):\n%s", p.name, p.err, p.log, logTail(p.log, 8))
}

// logTail returns the last n lines of the file at path.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, "    "+sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
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

// waitHealthy polls url with hc until it answers 200, p ends, ctx ends or 20 seconds
// pass.
func waitHealthy(ctx context.Context, hc *http.Client, url string, p *proc) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not become healthy at %s (log %s): %w", p.name, url, p.log, err)
		}
		select {
		case <-p.done:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", p.name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
