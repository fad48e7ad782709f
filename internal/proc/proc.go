// Package proc runs a child process with its standard output and error in a log file,
// waits for it to answer on HTTP, and stops it gracefully: SIGTERM, a grace period,
// then SIGKILL. The demo, the benchmarks and the end-to-end tests start Tiergate's
// daemons and their peers (nginx, haproxy) through it.
package proc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a child process that Start started.
type Process struct {
	Name string // as messages name it: "keyserverd", "l7d l7a", ...
	Log  string // the file holding its standard output and error
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, valid once done is closed
}

// Option changes how Start starts a process.
type Option func(*options)

type options struct {
	appendLog bool
}

// AppendLog makes Start append to the log file instead of truncating it, so that a
// process started again after a stop or a kill keeps the lines of its earlier runs.
func AppendLog() Option { return func(o *options) { o.appendLog = true } }

// Start starts cmd, prepared by the caller (path, arguments, environment, and
// SysProcAttr if it wants one), with its standard output and error going to the file
// at logPath. When cmd.SysProcAttr is nil the child gets SIGKILL if the thread that
// started it dies first (PR_SET_PDEATHSIG), so that an interrupted run leaves no
// daemon behind; a caller whose child must stop its own children first (nginx) sets
// a Pdeathsig it handles, such as SIGTERM.
func Start(name, logPath string, cmd *exec.Cmd, opts ...Option) (*Process, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if o.appendLog {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	logFile, err := os.OpenFile(logPath, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating %s's log: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr returns how the process ended (nil: exit status 0); call it after Done is
// closed.
func (p *Process) ExitErr() error { return p.err }

// Exited describes how a process that ended ended, with the last lines of its log;
// call it after Done is closed.
func (p *Process) Exited() error {
	return fmt.Errorf("%s exited: %v (log %s):\n%s", p.Name, p.err, p.Log, indent(p.LogTail(20)))
}

// Signal sends sig to the process; after it has exited, it does nothing.
func (p *Process) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling %s: %w", p.Name, err)
	}
	return nil
}

// Kill kills the process at once, as a crash would, and waits for it to be gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop sends SIGTERM, waits up to grace for the process to exit, then kills it. It
// returns the exit error of a process that did not exit cleanly (including one that
// had exited before), or says that it had to be killed.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.exitErr()
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%s did not stop within %v of SIGTERM and was killed", p.Name, grace)
	}
}

func (p *Process) exitErr() error {
	if p.err != nil {
		return fmt.Errorf("%s: %w", p.Name, p.err)
	}
	return nil
}

// WaitHTTP polls url through hc (nil: a client with a one-second timeout) until it
// answers 200 OK. It fails when the process exits first (with the end of its log),
// when timeout passes, or when ctx ends.
func (p *Process) WaitHTTP(ctx context.Context, hc *http.Client, url string, timeout time.Duration) error {
	if hc == nil {
		hc = &http.Client{Timeout: time.Second}
	}
	deadline := time.Now().Add(timeout)
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
			return fmt.Errorf("%s did not answer 200 at %s within %v (log %s): %w", p.Name, url, timeout, p.Log, err)
		}
		select {
		case <-p.done:
			return p.Exited()
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", p.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string { return Tail(p.Log, n) }

// tailBytes bounds how much of the end of a file Tail reads.
const tailBytes = 256 << 10

// Tail returns the last n lines of the file at path (of its last 256 KiB), or ""
// when it cannot be read.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > tailBytes {
		if _, err := f.Seek(-tailBytes, io.SeekEnd); err != nil {
			return ""
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, tailBytes))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func indent(s string) string {
	if s == "" {
		return s
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
