package daemon

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
)

// MinTokenLen is the shortest admin token ReadTokenFile accepts, in bytes.
const MinTokenLen = 16

// ReadTokenFile reads an admin bearer token from a file: its content with leading and
// trailing white space (a final newline) removed, at least MinTokenLen bytes of
// visible ASCII. AdminToken also warns when the file is readable by others.
func ReadTokenFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the admin token: %w", err)
	}
	tok := bytes.TrimSpace(data)
	if len(tok) < MinTokenLen {
		return nil, fmt.Errorf("admin token in %s: %d bytes, want at least %d", path, len(tok), MinTokenLen)
	}
	for _, c := range tok {
		if c <= ' ' || c > '~' {
			return nil, fmt.Errorf("admin token in %s: holds a space, a control character or a non-ASCII byte", path)
		}
	}
	return tok, nil
}

// ReadAdminTokenFile reads the token of a configuration's admin_token_file as
// ReadTokenFile does; an empty path means no token (nil). Errors name the field.
func ReadAdminTokenFile(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	tok, err := ReadTokenFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin_token_file: %w", err)
	}
	return tok, nil
}

// AdminAuth guards an admin endpoint, which speaks plain HTTP, in two ways.
//
// Host: every request, /healthz and /metrics included, must name in its Host header
// a loopback address, "localhost", the address the request arrived on (the one the
// endpoint listens on) or one of Hosts (SetHosts); any other is answered 421 with
// the admin APIs' JSON error shape, code "misdirected_request". A web page whose
// name an attacker re-points at this host (DNS rebinding) names its own host there,
// so a browser cannot be made to reach the endpoint. A request without a Host
// (HTTP/1.0) is let through: browsers always send one.
//
// Token: once a token is set, every request except GET (or HEAD) /healthz and
// /metrics, which load balancers and Prometheus poll, must carry "Authorization:
// Bearer <token>" (RFC 6750); any other request is answered 401 with a
// "WWW-Authenticate: Bearer" header and the JSON error shape, {"status": 401,
// "code": "unauthorized", "message": ...}. Tokens are compared in constant time
// (their SHA-256 digests, so not even the length leaks). The daemons set one by
// default (AdminToken). The token and the hosts can be changed while requests are
// served. The zero AdminAuth has no token and no other hosts.
type AdminAuth struct {
	// Logger receives a warning for each request refused. Nil means none.
	Logger *slog.Logger

	digest atomic.Pointer[[sha256.Size]byte] // nil: no token
	hosts  atomic.Pointer[[]string]          // lower case, without a final dot
}

// SetHosts sets the host names (or addresses) a request's Host header may give
// besides a loopback address, "localhost" and the address the request arrived on:
// the names the endpoint is reached by (a DNS name Prometheus scrapes, say). A port
// in a name is ignored.
func (a *AdminAuth) SetHosts(hosts []string) {
	hs := make([]string, 0, len(hosts))
	for _, h := range hosts {
		hs = append(hs, normalHost(h))
	}
	a.hosts.Store(&hs)
}

// normalHost is the host of a Host header or a configured name without its port,
// brackets and final dot, in lower case.
func normalHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// hostAllowed reports whether r's Host header names this endpoint (see AdminAuth).
func (a *AdminAuth) hostAllowed(r *http.Request) bool {
	if r.Host == "" {
		return true
	}
	h := normalHost(r.Host)
	if h == "localhost" {
		return true
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		ip = ip.Unmap().WithZone("")
		if ip.IsLoopback() {
			return true
		}
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if ap, err := netip.ParseAddrPort(la.String()); err == nil && ap.Addr().Unmap().WithZone("") == ip {
				return true
			}
		}
	}
	if hs := a.hosts.Load(); hs != nil {
		for _, allowed := range *hs {
			if h == allowed {
				return true
			}
		}
	}
	return false
}

// SetToken sets the token requests must present; nil or empty removes it, letting
// every request through.
func (a *AdminAuth) SetToken(token []byte) {
	if len(token) == 0 {
		a.digest.Store(nil)
		return
	}
	d := sha256.Sum256(token)
	a.digest.Store(&d)
}

// Enabled reports whether a token is set.
func (a *AdminAuth) Enabled() bool { return a.digest.Load() != nil }

// open reports whether r may be served without a token.
func open(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	return r.URL.Path == "/healthz" || r.URL.Path == "/metrics"
}

// Wrap returns next guarded by the token.
func (a *AdminAuth) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.hostAllowed(r) {
			if a.Logger != nil {
				a.Logger.Warn("admin request refused: its Host is not this endpoint", "host", r.Host, "method", r.Method, "path", r.URL.Path, "from", r.RemoteAddr)
			}
			writeRefusal(w, http.StatusMisdirectedRequest, CodeMisdirected, "",
				fmt.Sprintf("Host %q does not name this admin endpoint: use a loopback address, localhost, the address it listens on or a name of admin_hosts", r.Host))
			return
		}
		want := a.digest.Load()
		if want == nil || open(r) {
			next.ServeHTTP(w, r)
			return
		}
		tok, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			a.refuse(w, r, `Bearer`, "this request needs an admin token: Authorization: Bearer <token>")
			return
		}
		got := sha256.Sum256([]byte(tok))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			a.refuse(w, r, `Bearer error="invalid_token"`, "the admin token presented is not the one configured")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer returns the token of an Authorization header of the Bearer scheme (the
// scheme's name is case-insensitive).
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func (a *AdminAuth) refuse(w http.ResponseWriter, r *http.Request, challenge, msg string) {
	if a.Logger != nil {
		a.Logger.Warn("admin request refused: no valid token", "method", r.Method, "path", r.URL.Path, "from", r.RemoteAddr)
	}
	writeRefusal(w, http.StatusUnauthorized, CodeUnauthorized, challenge, msg)
}

// writeRefusal answers with status in the admin APIs' JSON error shape, and a
// WWW-Authenticate challenge unless it is empty.
func writeRefusal(w http.ResponseWriter, status int, code, challenge, msg string) {
	if challenge != "" {
		w.Header().Set("WWW-Authenticate", challenge)
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(struct {
		Status  int    `json:"status"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{status, code, msg})
}

// CodeUnauthorized is the error code of a request refused for want of a valid token.
const CodeUnauthorized = "unauthorized"

// CodeMisdirected is the error code (421) of a request whose Host header does not
// name the admin endpoint.
const CodeMisdirected = "misdirected_request"

// IsLoopbackListen reports whether a listen address ("host:port") is reachable from
// this host only: a loopback IP (127.0.0.0/8, ::1) or "localhost". An empty host,
// which listens on every address, and any other name are not.
func IsLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
