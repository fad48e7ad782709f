package benchkit

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// NginxErrorLog is where the nginx.conf of NginxHTTPTop has nginx write its errors,
// under its directory.
const NginxErrorLog = "error.log"

// NginxHTTPTop is the top of a benchmark's nginx.conf, up to and inside the http
// block: in the foreground, with workers worker processes, everything it writes
// under dir (pid, NginxErrorLog, temporary files), no access log. The caller adds
// the rest of the http block and closes it.
func NginxHTTPTop(dir string, workers int) string {
	return fmt.Sprintf(`daemon off;
master_process on;
worker_processes %d;
pid %s;
error_log %s warn;

events {
    worker_connections 4096;
}

http {
    access_log off;
    client_body_temp_path %s;
    proxy_temp_path %s;
    fastcgi_temp_path %s;
    uwsgi_temp_path %s;
    scgi_temp_path %s;
`, workers, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, NginxErrorLog),
		filepath.Join(dir, "body"), filepath.Join(dir, "proxy"), filepath.Join(dir, "fastcgi"),
		filepath.Join(dir, "uwsgi"), filepath.Join(dir, "scgi"))
}

// StopNginx stops an nginx master process (SIGTERM: its fast shutdown, which stops
// its workers), then kills any worker it left behind: those in workers (the ones the
// caller saw) and the master's children at the time of the call.
func StopNginx(p *Process, workers []int, grace time.Duration) error {
	if kids, err := ChildPIDs(p.PID()); err == nil {
		workers = append(slices.Clone(workers), kids...)
	}
	err := p.Stop(grace)
	for _, pid := range workers {
		cmdline, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if rerr == nil && strings.HasPrefix(string(cmdline), "nginx: worker") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return err
}
