package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
)

// CacheFileName is the name of the cache file in a daemon's state directory
// unless NodeConfig.CacheFile says otherwise.
const CacheFileName = "control-snapshot.json"

// NodeConfig is the control section of a node's own configuration file (l7d, l4d,
// keyserverd): which node it is and how it reaches the store. The same shape in
// every daemon:
//
//	control:
//	  node: l7-a
//	  etcd_endpoints: [https://10.0.0.1:2379]
//	  ca_file: /etc/tiergate/etcd-ca.pem
//	  cert_file: /etc/tiergate/l7-a-etcd.pem
//	  key_file: /etc/tiergate/l7-a-etcd.key
//	  username: l7-a
//	  password_file: /etc/tiergate/l7-a-etcd.password
//
// The zero value of every optional field means its documented default.
type NodeConfig struct {
	// Node is the node's name, unique in the cluster: its status is reported at
	// /tiergate/nodes/v1/<node> and its etcd role is tiergate-node-<node>
	// (GrantNode). A store name: letters, digits, '.', '_', ':' and '-', starting
	// with a letter or digit. Required.
	Node string `yaml:"node" json:"node"`

	// EtcdEndpoints are the client URLs of the store's etcd, as controld prints
	// them: an external cluster's https:// URLs, or the loopback URL controld's
	// embedded etcd serves with -etcd-listen (http://127.0.0.1:2379) for the nodes
	// on its machine. Required.
	EtcdEndpoints []string `yaml:"etcd_endpoints" json:"etcd_endpoints"`

	// CAFile is the CA certificate (PEM) the etcd server's certificate must chain
	// to. Default: the system's roots for https endpoints.
	CAFile string `yaml:"ca_file,omitempty" json:"ca_file,omitempty"`

	// CertFile and KeyFile are the node's client certificate and key (PEM), for an
	// etcd that requires client certificates. Both or neither. Default none.
	CertFile string `yaml:"cert_file,omitempty" json:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty" json:"key_file,omitempty"`

	// Username and PasswordFile authenticate the node to an etcd with
	// authentication on: its etcd user (granted the node's role, GrantNode) and a
	// file holding the password on its first line (mode 0600). Both or neither.
	// Default none.
	Username     string `yaml:"username,omitempty" json:"username,omitempty"`
	PasswordFile string `yaml:"password_file,omitempty" json:"password_file,omitempty"`

	// CacheFile keeps the last snapshot the node applied, so that a start while the
	// store is out of reach serves it. Default <state_dir>/control-snapshot.json
	// (Defaults).
	CacheFile string `yaml:"cache_file,omitempty" json:"cache_file,omitempty"`

	// DialTimeout bounds connecting to etcd each time the agent opens the store.
	// Default 5s.
	DialTimeout config.Duration `yaml:"dial_timeout,omitempty" json:"dial_timeout,omitempty"`
}

// Defaults fills in the default of every field left zero; stateDir is the
// daemon's state directory (for CacheFile).
func (n *NodeConfig) Defaults(stateDir string) {
	if n.CacheFile == "" && stateDir != "" {
		n.CacheFile = filepath.Join(stateDir, CacheFileName)
	}
	if n.DialTimeout == 0 {
		n.DialTimeout = store.DefaultDialTimeout
	}
}

// Validate checks n and returns every problem, each a *config.FieldError named by
// its path inside the section ("node", "etcd_endpoints[1]"); a daemon nests them
// under its own ("control.node") with config.Checker.Nest.
func (n *NodeConfig) Validate() error {
	var ck config.Checker
	if n.Node == "" {
		ck.Addf("node", "required: the node's name in the cluster")
	} else if err := store.CheckName(n.Node); err != nil {
		ck.Add("node", err)
	}
	if len(n.EtcdEndpoints) == 0 {
		ck.Addf("etcd_endpoints", "required: the store's etcd client URLs (controld prints them)")
	}
	// The rest is the store's own check of an external etcd's settings.
	sc := n.StoreConfig()
	if err := sc.Validate(); err != nil {
		ck.Nest("", unwrapStore(err))
	}
	if n.CacheFile != "" && filepath.Base(n.CacheFile) == "." {
		ck.Addf("cache_file", "%q: want a file", n.CacheFile)
	}
	return ck.Err()
}

// unwrapStore returns the field errors of a store.Config's Validate, renamed to
// this section's fields.
func unwrapStore(err error) error {
	var ck config.Checker
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		if fe, ok := err.(*config.FieldError); ok {
			path := fe.Path
			switch {
			case path == "endpoints":
				path = "etcd_endpoints"
			case len(path) > len("endpoints[") && path[:len("endpoints[")] == "endpoints[":
				path = "etcd_" + path
			case path == "dir":
				return // said by etcd_endpoints' required
			}
			ck.Add(path, fe.Err)
			return
		}
		if u, ok := err.(interface{ Unwrap() error }); ok && u.Unwrap() != nil {
			walk(u.Unwrap())
			return
		}
		ck.Add("", err)
	}
	walk(err)
	return ck.Err()
}

// StoreConfig returns the configuration of the store the node opens (an external
// etcd at EtcdEndpoints).
func (n *NodeConfig) StoreConfig() store.Config {
	return store.Config{
		Endpoints: n.EtcdEndpoints,
		CAFile:    n.CAFile, CertFile: n.CertFile, KeyFile: n.KeyFile,
		Username: n.Username, PasswordFile: n.PasswordFile,
		DialTimeout: n.DialTimeout,
	}
}

// Open returns the function that opens the node's store, for Config.Open: each
// call connects anew (the agent calls it again after the store was lost). The
// store logs to slog.Default(); OpenWith takes a logger.
func (n *NodeConfig) Open() func(ctx context.Context) (*store.Store, error) {
	return n.OpenWith(nil)
}

// OpenWith is Open with the logger the store (and its etcd client) logs to; nil
// is slog.Default().
func (n *NodeConfig) OpenWith(log *slog.Logger) func(ctx context.Context) (*store.Store, error) {
	sc := n.StoreConfig()
	sc.Logger = log
	node := n.Node
	return func(ctx context.Context) (*store.Store, error) {
		st, err := store.Open(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		return st, nil
	}
}
