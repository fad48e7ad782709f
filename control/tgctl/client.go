package tgctl

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Exit codes of tgctl, stable for scripts.
const (
	ExitOK          = 0 // done
	ExitError       = 1 // any other error (and, for diff, differences found)
	ExitUsage       = 2 // bad arguments or flags
	ExitConflict    = 3 // 412: an object changed since it was read (If-Match)
	ExitInvalid     = 4 // 422 and the certificate checks: the change is refused, fields named
	ExitNotFound    = 5 // 404: no such object
	ExitAuth        = 6 // 401 or 403: no token, a bad token, or a role that may not
	ExitUnreachable = 7 // the API could not be reached
	// ExitDiffFailed is diff's exit for what other commands answer ExitError, since
	// diff exits 1 when it finds differences (as kubectl diff and diff(1) do).
	ExitDiffFailed = 8
)

// APIError is an error answered by controld: the API's one error shape
// (daemon.APIError) with the field problems of a 422 and a conflict's revisions.
type APIError struct {
	// What is what tgctl was doing ("reading pools/app").
	What    string `json:"-"`
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Errors are the field problems of a 422, each by its path.
	Errors []FieldProblem `json:"errors,omitempty"`
	// Kind, Name, Expected and Actual describe a conflict.
	Kind     string `json:"kind,omitempty"`
	Name     string `json:"name,omitempty"`
	Expected int64  `json:"expected,omitempty"`
	Actual   int64  `json:"actual,omitempty"`
	// Keyserver names the keyserver that failed an upload, when the API says.
	Keyserver string `json:"keyserver,omitempty"`
}

// FieldProblem is one refused field.
type FieldProblem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// Error renders the code and message on the first line and each field problem on a
// line of its own.
func (e *APIError) Error() string {
	var b strings.Builder
	if e.What != "" {
		b.WriteString(e.What + ": ")
	}
	msg := e.Message
	// The message often ends with the problems the lines below give one by one.
	if len(e.Errors) > 0 && e.Errors[0].Path != "" {
		if i := strings.Index(msg, ": "+e.Errors[0].Path); i > 0 {
			msg = msg[:i]
		}
	}
	fmt.Fprintf(&b, "%s (%d): %s", e.Code, e.Status, msg)
	for _, p := range e.Errors {
		switch {
		case p.Path == "":
			fmt.Fprintf(&b, "\n  %s", p.Message)
		case p.Message == "":
			fmt.Fprintf(&b, "\n  %s", p.Path)
		default:
			fmt.Fprintf(&b, "\n  %s: %s", p.Path, p.Message)
		}
	}
	if e.Keyserver != "" {
		fmt.Fprintf(&b, "\n  keyserver: %s", e.Keyserver)
	}
	switch {
	case e.Status == http.StatusUnauthorized:
		b.WriteString("\n  (give a token with --token, TIERGATE_TOKEN or the config file's token)")
	case e.Code == "use_upload":
		b.WriteString("\n  (certificates are stored by tgctl cert upload)")
	}
	return b.String()
}

// ExitCode returns the exit code for an error of the API.
func (e *APIError) ExitCode() int {
	switch {
	case e.Status == http.StatusPreconditionFailed || e.Code == "conflict":
		return ExitConflict
	case e.Status == http.StatusUnprocessableEntity, e.Code == "invalid", e.Code == "bad_chain", e.Code == "key_mismatch", e.Code == "expired":
		return ExitInvalid
	case e.Status == http.StatusNotFound && e.Code != "no_route":
		return ExitNotFound
	case e.Status == http.StatusUnauthorized, e.Status == http.StatusForbidden:
		return ExitAuth
	}
	return ExitError
}

// UnreachableError is the API out of reach: refused, timed out, no such host.
type UnreachableError struct {
	API string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("the API at %s is out of reach: %v", e.API, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// UsageError is a bad argument or flag.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error { return &UsageError{fmt.Errorf(format, args...)} }

// exitError carries an exit code with a message that may be empty (already said).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// ExitCode returns the exit code for err: 0 for nil.
func ExitCode(err error) int {
	var ae *APIError
	var ue *UnreachableError
	var us *UsageError
	var ee *exitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &us):
		return ExitUsage
	case errors.As(err, &ae):
		return ae.ExitCode()
	case errors.As(err, &ue):
		return ExitUnreachable
	}
	return ExitError
}

// client calls controld's API.
type client struct {
	base  *url.URL
	token string
	hc    *http.Client
}

// clear reports whether the API is plain http to a host that is not loopback:
// what is sent to it (a token, a private key) crosses the network in clear.
func (c *client) clear() bool {
	if c.base.Scheme != "http" {
		return false
	}
	host := c.base.Hostname()
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.Unmap().IsLoopback()
}

// maxAnswer bounds an answer read from the API.
const maxAnswer = 64 << 20

func newClient(api, token, caFile string, timeout time.Duration) (*client, error) {
	u, err := url.Parse(api)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("--api %q: want http(s)://host:port", api)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if caFile != "" {
		if u.Scheme != "https" {
			return nil, usagef("--ca-file is for an https API, not %s", api)
		}
		pemBytes, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading the API's CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, fmt.Errorf("the API's CA %s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &client{base: u, token: token, hc: &http.Client{Transport: tr, Timeout: timeout}}, nil
}

// request is one call of the API.
type request struct {
	method string
	path   string // under the API's base, with its query
	body   any    // encoded as JSON when not nil
	header map[string]string
	what   string // for errors: "reading pools/app"
}

// do calls the API and decodes a 2xx answer's JSON into out (when not nil). An
// answer of 400 or more is an *APIError, a failure to reach the API an
// *UnreachableError.
func (c *client) do(ctx context.Context, r request, out any) (http.Header, error) {
	u := *c.base
	path, query, _ := strings.Cut(r.path, "?")
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query
	var body io.Reader
	if r.body != nil {
		data, err := json.Marshal(r.body)
		if err != nil {
			return nil, fmt.Errorf("%s: encoding the request: %w", r.what, err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.what, err)
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if unreachable(err) {
			return nil, &UnreachableError{API: c.base.String(), Err: err}
		}
		return nil, fmt.Errorf("%s: %w", r.what, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, &UnreachableError{API: c.base.String(), Err: fmt.Errorf("reading the answer: %w", err)}
	}
	if resp.StatusCode >= 400 {
		ae := &APIError{What: r.what}
		if json.Unmarshal(data, ae) != nil || ae.Code == "" {
			ae = &APIError{What: r.what, Code: "http", Message: strings.TrimSpace(string(data))}
			if ae.Message == "" {
				ae.Message = http.StatusText(resp.StatusCode)
			}
		}
		ae.Status = resp.StatusCode
		return resp.Header, ae
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if raw, ok := out.(*json.RawMessage); ok {
			*raw = append((*raw)[:0], data...)
		} else if err := json.Unmarshal(data, out); err != nil {
			return resp.Header, fmt.Errorf("%s: the API's answer: %w", r.what, err)
		}
	}
	return resp.Header, nil
}

// unreachable reports whether err, from http.Client.Do, means the API was not
// reached or did not answer: a refused connection, no route, no such host, a
// timeout. A TLS verification failure is not: the API was reached, and is not the
// one the CA vouches for.
func unreachable(err error) bool {
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) {
		return false
	}
	var op *net.OpError
	var dns *net.DNSError
	var ne net.Error
	return errors.As(err, &op) || errors.As(err, &dns) || (errors.As(err, &ne) && ne.Timeout()) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// revisionOf reads an ETag ("12", W/"12") as a revision.
func revisionOf(etag string) (int64, error) {
	rev, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(strings.TrimSpace(etag), "W/"), `"`), 10, 64)
	if err != nil || rev <= 0 {
		return 0, fmt.Errorf("ETag %q is not a revision", etag)
	}
	return rev, nil
}

func etag(rev int64) string { return `"` + strconv.FormatInt(rev, 10) + `"` }

// pathEscape escapes a name for a path segment.
func pathEscape(s string) string { return url.PathEscape(s) }
