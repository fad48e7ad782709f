package benchkit

import (
	"fmt"
	"path/filepath"
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
