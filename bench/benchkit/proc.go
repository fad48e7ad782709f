package benchkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a child process the benchmark started. It is killed if the benchmark
// process dies first (PR_SET_PDEATHSIG; see DeathSignal), and stopped by Stop
// otherwise.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	log     *os.File
	done    chan struct{}
	err     error // valid once done is closed
}

// ProcessOption changes how StartProcess starts a process.
type ProcessOption func(*exec.Cmd)

// DeathSignal sets the signal the process gets when the benchmark process dies first
// (PR_SET_PDEATHSIG) instead of SIGKILL. A process whose own children would outlive
// it, such as nginx's master process and its workers, wants one it handles by stopping
// them (SIGTERM for nginx).
func DeathSignal(sig syscall.Signal) ProcessOption {
	return func(c *exec.Cmd) { c.SysProcAttr.Pdeathsig = sig }
}

// StartProcess starts path with args and env (appended to this process's
// environment), its standard output and error going to logPath.
func StartProcess(name, path string, args, env []string, logPath string, opts ...ProcessOption) (*Process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	for _, o := range opts {
		o(cmd)
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr returns how the process ended; call it after Done is closed.
func (p *Process) ExitErr() error { return p.err }

// CPU returns a clock of the process's CPU time.
func (p *Process) CPU() CPUClock { return ProcessCPU(p.PID()) }

// Stop sends SIGTERM, waits up to grace for the process to exit, then kills it. It
// returns the exit error of a process that did not exit cleanly on SIGTERM.
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
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %v of SIGTERM and was killed", p.Name, grace)
	}
}

func (p *Process) exitErr() error {
	if p.err != nil {
		return fmt.Errorf("%s: %w", p.Name, p.err)
	}
	return nil
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment ago: it
// listens on port 0 and closes the listener.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), nil
}

// WaitHTTP polls url until it answers 200 OK, the process p exits (p may be nil),
// timeout passes or ctx ends.
func WaitHTTP(ctx context.Context, url string, p *Process, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	var done <-chan struct{}
	if p != nil {
		done = p.Done()
	}
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
			return fmt.Errorf("%s: %w", url, err)
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited: %v", p.Name, p.ExitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
