package benchkit

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/tiergate/tiergate/internal/proc"
)

// Process is a child process the benchmark started (internal/proc): it is killed if
// the benchmark process dies first (PR_SET_PDEATHSIG; see DeathSignal), and stopped
// by Stop otherwise.
type Process struct{ *proc.Process }

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
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	for _, o := range opts {
		o(cmd)
	}
	p, err := proc.Start(name, logPath, cmd)
	if err != nil {
		return nil, err
	}
	return &Process{p}, nil
}

// CPU returns a clock of the process's CPU time.
func (p *Process) CPU() CPUClock { return ProcessCPU(p.PID()) }

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
