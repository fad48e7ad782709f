package agent

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
)

// TestNodeConfigDecode: the control section as a daemon's file holds it, decoded
// with the daemons' decoder (unknown fields refused) and its defaults.
func TestNodeConfigDecode(t *testing.T) {
	var file struct {
		Control NodeConfig `yaml:"control"`
	}
	doc := `
control:
  node: l7-a
  etcd_endpoints: [https://192.0.2.10:2379, https://192.0.2.11:2379]
  ca_file: /etc/tiergate/etcd-ca.pem
  cert_file: /etc/tiergate/l7-a.pem
  key_file: /etc/tiergate/l7-a.key
  username: l7-a
  password_file: /etc/tiergate/l7-a.password
  dial_timeout: 2s
`
	if err := config.Decode([]byte(doc), "the test file", &file); err != nil {
		t.Fatal(err)
	}
	n := file.Control
	n.Defaults("/var/lib/tiergate/l7d")
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	if n.Node != "l7-a" || len(n.EtcdEndpoints) != 2 || n.Username != "l7-a" || n.DialTimeout.D() != 2*time.Second ||
		n.CacheFile != "/var/lib/tiergate/l7d/control-snapshot.json" {
		t.Fatalf("decoded %+v", n)
	}
	if err := config.Decode([]byte("control:\n  node: a\n  etcd_endpoint: [x]\n"), "the test file", &file); err == nil {
		t.Fatal("an unknown field was taken")
	}
}

// TestNodeConfigValidate: every problem is named by its path in the section.
func TestNodeConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		n     NodeConfig
		paths []string
	}{
		{NodeConfig{}, []string{"node", "etcd_endpoints"}},
		{NodeConfig{Node: "a/b", EtcdEndpoints: []string{"https://192.0.2.1:2379"}}, []string{"node"}},
		{NodeConfig{Node: "l4-a", EtcdEndpoints: []string{"https://192.0.2.1:2379", "ftp://x"}}, []string{"etcd_endpoints[1]"}},
		{NodeConfig{Node: "l4-a", EtcdEndpoints: []string{"https://192.0.2.1:2379"}, CertFile: "c.pem"}, []string{"cert_file"}},
		{NodeConfig{Node: "l4-a", EtcdEndpoints: []string{"https://192.0.2.1:2379"}, Username: "l4-a"}, []string{"username"}},
		{NodeConfig{Node: "l4-a", EtcdEndpoints: []string{"https://192.0.2.1:2379"}, DialTimeout: -1}, []string{"dial_timeout"}},
	} {
		err := tc.n.Validate()
		if err == nil {
			t.Errorf("%+v: taken", tc.n)
			continue
		}
		var ck config.Checker
		ck.Nest("control", err)
		got := map[string]bool{}
		for _, e := range ck.Err().(interface{ Unwrap() []error }).Unwrap() {
			var fe *config.FieldError
			if !errors.As(e, &fe) {
				t.Errorf("%+v: %v is not a field error", tc.n, e)
				continue
			}
			got[fe.Path] = true
		}
		for _, p := range tc.paths {
			if !got["control."+p] {
				t.Errorf("%+v: errors %v, want one at control.%s", tc.n, err, p)
			}
		}
		if len(got) != len(tc.paths) {
			t.Errorf("%+v: errors at %v, want %v", tc.n, got, tc.paths)
		}
	}
}

// TestNodeConfigOpen: a node configured with the control section reaches the
// embedded store at its loopback URL as the etcd user of its role (GrantNode),
// with its password from a file, applies the configuration and reports; its
// credentials write neither the configuration nor another node's status.
func TestNodeConfigOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(ctx, store.Config{Dir: filepath.Join(dir, "store"), ListenClientURL: "http://127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var url string
	for _, u := range s.ClientURLs() {
		if strings.HasPrefix(u, "http://127.0.0.1:") {
			url = u
		}
	}
	if url == "" {
		t.Fatalf("client URLs %v: no loopback URL", s.ClientURLs())
	}
	rev, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}

	// etcd's authentication: root, and the node's user with its role.
	cli := s.Client()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "l7-a", "node-pw"); return err },
		func() error { return GrantNode(ctx, cli, "l7-a") },
		func() error { _, err := cli.UserGrantRole(ctx, "l7-a", RoleName("l7-a")); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth step %d: %v", i, err)
		}
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, Username: "root", Password: "root-pw", DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	pwFile := filepath.Join(dir, "l7-a.password")
	if err := os.WriteFile(pwFile, []byte("node-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// etcd checks a password with bcrypt, seconds under the race detector on a
	// loaded machine: the dial timeout leaves room for it.
	n := NodeConfig{Node: "l7-a", EtcdEndpoints: []string{url}, Username: "l7-a", PasswordFile: pwFile, DialTimeout: config.Duration(30 * time.Second)}
	n.Defaults(dir)
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	a, err := New(Config{Open: n.OpenWith(testLogger(t)), Node: n.Node, Role: "l7d", CacheFile: n.CacheFile, Apply: rec.apply, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	start(t, a)
	waitStatus(t, root, "l7-a", "ACK through the node's credentials", ack(rev))
	if _, err := os.Stat(filepath.Join(dir, CacheFileName)); err != nil {
		t.Fatalf("cache file: %v", err)
	}

	nodeStore, err := n.Open()(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer nodeStore.Close()
	if _, err := nodeStore.Put(ctx, model.KindPool, "evil", pool("evil", "198.18.1.9:80"), store.Any); err == nil {
		t.Fatal("the node's credentials wrote the configuration")
	}
	if _, err := nodeStore.Client().Put(ctx, StatusKey("l7-b"), "{}"); err == nil {
		t.Fatal("the node's credentials wrote another node's status")
	}

	// A wrong password is refused at Open.
	if err := os.WriteFile(pwFile, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := n.Open()(ctx); err == nil {
		st.Close()
		t.Fatal("a wrong password was taken")
	}
}
