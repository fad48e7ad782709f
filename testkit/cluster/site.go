package cluster

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tiergate/tiergate/testkit/testpki"
)

// SiteCert is a site certificate for an upload: its chain (leaf, then the site CA)
// and its private key, PEM.
type SiteCert struct {
	ChainPEM, KeyPEM []byte
	Leaf             *x509.Certificate
	Key              crypto.Signer
}

// Serial is the leaf's serial number.
func (s *SiteCert) Serial() *big.Int { return s.Leaf.SerialNumber }

// IssueSite signs a leaf for key with the site CA, valid from notBefore to
// notAfter (zero: an hour ago to a day from now) for names, and returns it with
// the site CA after it.
func (c *Cluster) IssueSite(key crypto.Signer, notBefore, notAfter time.Time, names ...string) (*SiteCert, error) {
	return IssueWith(c.SiteCA, c.SiteCA, key, notBefore, notAfter, names...)
}

// IssueWith signs a leaf for key with signer and returns it followed by next's
// certificate as its chain: a chain whose second certificate did not sign the
// first when next is not signer.
func IssueWith(signer, next *testpki.CA, key crypto.Signer, notBefore, notAfter time.Time, names ...string) (*SiteCert, error) {
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-time.Hour)
	}
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer.Cert, key.Public(), signer.Key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := testpki.KeyPEM(key)
	if err != nil {
		return nil, err
	}
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: next.DER})...)
	return &SiteCert{ChainPEM: chain, KeyPEM: keyPEM, Leaf: leaf, Key: key}, nil
}

// APIError is an answer of controld's API other than 2xx.
type APIError struct {
	Status int
	Body   string
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, strings.TrimSpace(e.Body)) }

// Call sends a request to controld's API with the admin token (body as JSON
// unless nil) and decodes a 2xx answer into out (unless nil); any other answer
// is an *APIError.
func (c *Cluster) Call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.API+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %w", method, path, &APIError{Status: resp.StatusCode, Body: string(data)})
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}

// WriteSite writes, in one change set, the listener the l7d nodes serve (each
// on a loopback port of its own), its routing (every request answered 200 with
// body by l7d itself) and the binding of certificate cert to it. The
// certificate must be uploaded already.
func (c *Cluster) WriteSite(ctx context.Context, cert, body string) error {
	zero := int64(0)
	type change struct {
		Kind       string `json:"kind"`
		Name       string `json:"name"`
		Object     any    `json:"object"`
		IfRevision *int64 `json:"if_revision"`
	}
	obj := func(kind, name string, o any) change { return change{kind, name, o, &zero} }
	respond := map[string]any{"status": 200, "body": body}
	cs := map[string]any{"changes": []change{
		obj("listeners", c.Opts.Listener, map[string]any{"name": c.Opts.Listener, "addr": "198.18.0.10:443", "disable_http3": true}),
		obj("routing", c.Opts.Listener, map[string]any{"name": c.Opts.Listener, "vhosts": []any{map[string]any{"names": []string{"*"},
			"routes": []any{map[string]any{"name": "all", "action": map[string]any{"respond": respond}}}}}}),
		obj("cert-bindings", cert, map[string]any{"name": cert, "certificates": []string{cert}, "listeners": []string{c.Opts.Listener}}),
	}}
	if err := c.Call(ctx, "POST", "/v1/changesets", cs, nil); err != nil {
		return fmt.Errorf("writing the listener, its routing and the binding: %w", err)
	}
	return nil
}

// Upload uploads s as a new version of certificate name (POST
// /v1/certificates/{name}/versions) and returns the revision it was stored at
// and its version.
func (c *Cluster) Upload(ctx context.Context, name string, s *SiteCert) (revision int64, version int, err error) {
	var ans struct {
		Revision    int64 `json:"revision"`
		Certificate struct {
			Version int `json:"version"`
		} `json:"certificate"`
	}
	err = c.Call(ctx, "POST", "/v1/certificates/"+name+"/versions", map[string]any{"chain": string(s.ChainPEM), "key": string(s.KeyPEM)}, &ans)
	return ans.Revision, ans.Certificate.Version, err
}

// Served makes a TLS handshake with addr for serverName, trusting roots, and
// returns the leaf certificate served.
func Served(ctx context.Context, addr, serverName string, roots *x509.CertPool) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{ServerName: serverName, RootCAs: roots, NextProtos: []string{"http/1.1"}}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TLS handshake with %s for %s: %w", addr, serverName, err)
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// WaitServed polls each l7d node (every one when nodes is empty) with new
// handshakes until each serves the certificate of serial for serverName, and
// returns how long that took; an error once timeout passed.
func (c *Cluster) WaitServed(ctx context.Context, serverName string, serial *big.Int, timeout time.Duration, nodes ...*L7) (time.Duration, error) {
	if len(nodes) == 0 {
		nodes = c.L7
	}
	start := time.Now()
	deadline := start.Add(timeout)
	roots := c.SiteCA.Pool()
	for _, n := range nodes {
		for {
			leaf, err := Served(ctx, n.Listen, serverName, roots)
			if err == nil && leaf.SerialNumber.Cmp(serial) == 0 {
				break
			}
			if time.Now().After(deadline) {
				got := "error: " + fmt.Sprint(err)
				if err == nil {
					got = fmt.Sprintf("serial %x", leaf.SerialNumber)
				}
				return 0, fmt.Errorf("%s does not serve serial %x %v after the upload (%s)", n.Name, serial, timeout, got)
			}
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return time.Since(start), nil
}

// Node is a node as GET /v1/nodes lists it.
type Node struct {
	Node            string `json:"node"`
	Role            string `json:"role"`
	Address         string `json:"address"`
	AppliedRevision int64  `json:"applied_revision"`
	State           string `json:"state"`
	Error           string `json:"error"`
}

// Nodes returns the nodes controld lists, by name.
func (c *Cluster) Nodes(ctx context.Context) (map[string]Node, error) {
	var ans struct {
		Nodes []Node `json:"nodes"`
	}
	if err := c.Call(ctx, "GET", "/v1/nodes", nil, &ans); err != nil {
		return nil, err
	}
	out := map[string]Node{}
	for _, n := range ans.Nodes {
		out[n.Node] = n
	}
	return out, nil
}

// WaitNodes waits until controld lists each of names in state ok, at most
// timeout.
func (c *Cluster) WaitNodes(ctx context.Context, timeout time.Duration, names ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		nodes, err := c.Nodes(ctx)
		missing := ""
		for _, n := range names {
			if err == nil && nodes[n].State != "ok" {
				missing = fmt.Sprintf("%s is %+v", n, nodes[n])
				break
			}
		}
		if err == nil && missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("waiting for nodes %v: %w", names, err)
			}
			return fmt.Errorf("nodes %v not all reporting ok after %v: %s", names, timeout, missing)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
