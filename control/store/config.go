package store

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// Config says which etcd the Store uses: an embedded single-node etcd in Dir (the
// default), or an external cluster at Endpoints. The zero value of every optional
// field means its documented default.
type Config struct {
	// Dir is the data directory of the embedded etcd: the store's database (under
	// Dir/etcd), the unix socket its client connects through (Dir/etcd.sock) and a
	// lock file (Dir/lock) that keeps a second process off the same data. It is
	// created with mode 0700 when missing. Required without Endpoints, refused with
	// them.
	Dir string `yaml:"dir,omitempty" json:"dir,omitempty"`

	// Endpoints are the client URLs of an external etcd cluster
	// ("https://10.0.0.1:2379"); with them no etcd is embedded, and several
	// processes may use the cluster side by side. Default none: embedded.
	Endpoints []string `yaml:"endpoints,omitempty" json:"endpoints,omitempty"`

	// CertFile and KeyFile are the client certificate and key (PEM) presented to an
	// external etcd that requires client certificates (--client-cert-auth). Both or
	// neither; only with Endpoints. Default none.
	CertFile string `yaml:"cert_file,omitempty" json:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty" json:"key_file,omitempty"`

	// CAFile is the CA certificate (PEM) an external etcd's server certificate must
	// chain to. Only with Endpoints. Default: the system's roots for https endpoints.
	CAFile string `yaml:"ca_file,omitempty" json:"ca_file,omitempty"`

	// Username and PasswordFile authenticate to an external etcd with authentication
	// on (etcd's users and roles, as control/agent.GrantNode sets up for a node):
	// the user's name, and a file holding its password (the first line; the file
	// should be mode 0600). Both or neither; only with Endpoints. Default none.
	Username     string `yaml:"username,omitempty" json:"username,omitempty"`
	PasswordFile string `yaml:"password_file,omitempty" json:"password_file,omitempty"`

	// ListenClientURL is a loopback URL the embedded etcd also serves its clients on,
	// besides its unix socket, so that the nodes on the same machine (or network
	// namespace) reach the store: "http://127.0.0.1:2379". Plain HTTP with no
	// authentication, which is why only a loopback address is taken; port 0 picks a
	// free port (Store.ClientURLs says which). Only embedded. Default none: the
	// unix socket only.
	ListenClientURL string `yaml:"listen_client_url,omitempty" json:"listen_client_url,omitempty"`

	// DialTimeout bounds connecting to etcd when the Store opens. Default 5s.
	DialTimeout config.Duration `yaml:"dial_timeout,omitempty" json:"dial_timeout,omitempty"`

	// StartTimeout bounds the start of the embedded etcd, which replays its write-ahead
	// log and opens its database first. Default 1m.
	StartTimeout config.Duration `yaml:"start_timeout,omitempty" json:"start_timeout,omitempty"`

	// QuotaBackendBytes is the embedded etcd's backend quota: when its database
	// reaches this size etcd raises its NOSPACE alarm and refuses every write
	// (ErrNoSpace) until space is freed (compaction, then defragmentation) and the
	// alarm disarmed; reads and watches go on. The cluster configuration is a few
	// MiB even for thousands of objects, so the quota is there for the history that
	// compaction has not yet dropped and for bulk data. Default 2 GiB (etcd's own
	// default, and its recommended ceiling is 8 GiB). Only embedded: an external
	// cluster's quota is its own flag.
	QuotaBackendBytes int64 `yaml:"quota_backend_bytes,omitempty" json:"quota_backend_bytes,omitempty"`

	// CompactionRetention is how many revisions of history the embedded etcd keeps
	// (auto-compaction in revision mode, run every 5 minutes): older revisions of
	// objects are dropped, History and GetAt cannot reach them, and a watch that
	// falls further behind is answered with a fresh snapshot (Batch.Reset). Revision
	// mode rather than periodic: it bounds history by the number of writes, so a
	// burst of writes cannot grow the database towards the quota between two
	// periodic runs, and 10,000 revisions are weeks of configuration changes.
	// Default 10000. Only embedded.
	CompactionRetention int64 `yaml:"compaction_retention,omitempty" json:"compaction_retention,omitempty"`

	// SnapshotCount is how many committed entries the embedded etcd applies before it
	// snapshots its state and trims its write-ahead log. Default 10000 (etcd's
	// default since 3.6): the log stays small and a restart replays little. Only
	// embedded.
	SnapshotCount uint64 `yaml:"snapshot_count,omitempty" json:"snapshot_count,omitempty"`

	// Logger receives the store's logs and etcd's (server and client), with
	// component=etcd: etcd's warnings and errors at their level, its routine info
	// messages at debug. Default slog.Default().
	Logger *slog.Logger `yaml:"-" json:"-"`
}

// Defaults of Config.
const (
	DefaultDialTimeout         = config.Duration(5 * time.Second)
	DefaultStartTimeout        = config.Duration(time.Minute)
	DefaultQuotaBackendBytes   = 2 << 30
	DefaultCompactionRetention = 10000
	DefaultSnapshotCount       = 10000
)

// maxSocketPath is the longest unix socket path the kernel takes (sun_path).
const maxSocketPath = 107

// Defaults fills in the default of every field left zero.
func (c *Config) Defaults() {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.QuotaBackendBytes == 0 {
		c.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	if c.CompactionRetention == 0 {
		c.CompactionRetention = DefaultCompactionRetention
	}
	if c.SnapshotCount == 0 {
		c.SnapshotCount = DefaultSnapshotCount
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks c and returns every problem, each a *config.FieldError named by
// its path ("endpoints[1]", "quota_backend_bytes").
func (c *Config) Validate() error {
	var ck config.Checker
	external := len(c.Endpoints) > 0
	switch {
	case external && c.Dir != "":
		ck.Addf("dir", "set with endpoints: the store is either embedded in dir or external at endpoints")
	case !external && c.Dir == "":
		ck.Addf("dir", "required for the embedded store (or give endpoints of an external etcd)")
	case !external:
		sock := filepath.Join(absDir(c.Dir), socketName)
		if len(sock) > maxSocketPath {
			ck.Addf("dir", "%q is too long: the socket path %s would exceed %d bytes", c.Dir, sock, maxSocketPath)
		}
	}
	for i, ep := range c.Endpoints {
		u, err := url.Parse(ep)
		switch {
		case err != nil:
			ck.Add(config.Index("endpoints", i), err)
		case u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs":
			ck.Addf(config.Index("endpoints", i), "%q: want an http, https, unix or unixs URL", ep)
		case (u.Scheme == "http" || u.Scheme == "https") && u.Host == "":
			ck.Addf(config.Index("endpoints", i), "%q: no host", ep)
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		ck.Addf("cert_file", "cert_file and key_file go together")
	}
	if (c.Username == "") != (c.PasswordFile == "") {
		ck.Addf("username", "username and password_file go together")
	}
	if !external {
		for _, f := range []struct{ path, v string }{{"cert_file", c.CertFile}, {"key_file", c.KeyFile}, {"ca_file", c.CAFile},
			{"username", c.Username}, {"password_file", c.PasswordFile}} {
			if f.v != "" {
				ck.Addf(f.path, "only for an external etcd (endpoints)")
			}
		}
	}
	if c.ListenClientURL != "" {
		if external {
			ck.Addf("listen_client_url", "only for the embedded etcd (not with endpoints)")
		} else if err := CheckLoopbackURL(c.ListenClientURL); err != nil {
			ck.Add("listen_client_url", err)
		}
	}
	for _, d := range []struct {
		path string
		v    config.Duration
	}{{"dial_timeout", c.DialTimeout}, {"start_timeout", c.StartTimeout}} {
		if d.v < 0 {
			ck.Addf(d.path, "%v: must not be negative", d.v)
		}
	}
	if c.QuotaBackendBytes < 0 {
		ck.Addf("quota_backend_bytes", "%d: must not be negative", c.QuotaBackendBytes)
	} else if c.QuotaBackendBytes > 0 && c.QuotaBackendBytes < 64<<20 {
		ck.Addf("quota_backend_bytes", "%d: below 64 MiB the store would soon refuse writes", c.QuotaBackendBytes)
	}
	if c.CompactionRetention < 0 {
		ck.Addf("compaction_retention", "%d: must not be negative", c.CompactionRetention)
	}
	if err := ck.Err(); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// CheckLoopbackURL returns an error unless u is an http URL of a loopback IP
// address with a port and nothing else ("http://127.0.0.1:2379", "http://[::1]:0").
func CheckLoopbackURL(u string) error {
	p, err := url.Parse(u)
	if err != nil {
		return err
	}
	if p.Scheme != "http" || p.Host == "" || p.User != nil || (p.Path != "" && p.Path != "/") || p.RawQuery != "" || p.Fragment != "" {
		return fmt.Errorf("%q: want http://<loopback IP>:<port>", u)
	}
	host, port, err := net.SplitHostPort(p.Host)
	if err != nil || port == "" {
		return fmt.Errorf("%q: want http://<loopback IP>:<port>", u)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q: port %q: want 0 to 65535", u, port)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("%q: only a loopback IP address (127.0.0.1, ::1): the store is served there without TLS or authentication", u)
	}
	return nil
}

// absDir is dir made absolute, or dir when that fails.
func absDir(dir string) string {
	if a, err := filepath.Abs(dir); err == nil {
		return a
	}
	return dir
}

// Settings are the settings of the etcd a Store uses, as that etcd reports them.
type Settings struct {
	// Embedded is set when the Store runs its own etcd.
	Embedded bool
	// Endpoints are the client URLs the Store connects to.
	Endpoints []string
	// QuotaBackendBytes is the backend quota (from the server's status; 0 when the
	// server does not report it, as etcd before 3.6).
	QuotaBackendBytes int64
	// CompactionMode and CompactionRetention are the embedded etcd's auto-compaction
	// ("revision" and the revisions kept); empty and 0 for an external etcd, which
	// does not report them.
	CompactionMode      string
	CompactionRetention int64
	// SnapshotCount is the embedded etcd's snapshot count; 0 for an external etcd.
	SnapshotCount uint64
	// MaxRequestBytes is the embedded etcd's largest request; 0 for an external one
	// (whose default is the same 1.5 MiB).
	MaxRequestBytes uint
}
