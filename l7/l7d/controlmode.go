package l7d

// l7d fed by the control plane.
//
// With a control section in its file, l7d runs the node agent (control/agent) with
// role "l7d": the agent reads the cluster configuration from the store, checks it
// whole and gives it here (applySnapshot), which puts it in force through the very
// prepare/commit path of a file reload, on the owner goroutine. What the node serves
// is the file's node settings with the snapshot's listeners, routing policies,
// pools, certificates and certificate bindings (withSnapshot):
//
//   - every listener of the snapshot, sorted by name, with the node's own settings
//     of it from node_listeners: the address it binds (default the listener's),
//     its QUIC server ID and its client_ip rules (PROXY protocol, trusted proxies),
//     which belong to where the node sits in the network, not to the cluster;
//   - the routing policies and pools, as route.Config;
//   - the certificates, chain and key ID only, served with remote keys through the
//     node's keyservers (l7d never holds their private keys), each listener the
//     certificates its bindings name for their server names (certs.PrepareMem).
//
// A snapshot the node cannot apply (a key its keyservers do not hold, an expired
// certificate, an address it cannot bind at start, a blacklist for a listener that
// is gone) is refused: the agent reports a NACK with the error and the
// configuration in force stays and keeps serving. Changes that the L7 server only
// takes at a restart are refused the same way, with an error that says so: adding,
// removing or renaming a listener, or changing its address, timeouts or limits (a
// restart of l7d reads the store again and serves the new listeners). Everything
// else (routes, pools, certificates and their new versions, bindings) is applied in
// place: new handshakes get the new certificates, connections already open keep
// theirs.
//
// The first snapshot starts the L7 server: until the agent has applied one, from
// the store or, when the store is out of reach, from the cache file, l7d serves
// nothing, the admin endpoint included. A reload of the file (SIGHUP, POST /reload)
// reads the node settings again and applies them with the snapshot in force.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/certs"
	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
)

// Role is what l7d reports itself as in the control plane.
const Role = "l7d"

// NodeListener is a node's own settings of a listener the control plane gives.
type NodeListener struct {
	// Addr is the "ip:port" this node binds for the listener instead of the
	// listener's own address: a VIP the tunnel delivers here, or a port of its own
	// when several nodes share a host. Changing it takes a restart. Default: the
	// listener's address.
	Addr string `yaml:"addr" json:"addr,omitempty"`

	// QUICServerID is l7.Listener.QUICServerID on this node: 1 to 65535, unique
	// among the nodes behind the same L4 distributors and equal to this node's
	// quic_id in their pools. Changing it takes a restart. Default 0: random QUIC
	// connection IDs.
	QUICServerID uint16 `yaml:"quic_server_id" json:"quic_server_id,omitempty"`

	// ClientIP says where the client address may come from, as a file listener's
	// client_ip (clientip.Config). Its PROXY protocol settings take a restart.
	// Default: the packet's source, headers ignored.
	ClientIP clientip.Config `yaml:"client_ip" json:"client_ip,omitzero"`
}

// validateControl checks a file with a control section: what the control plane
// gives is not in it, keyservers are, and the rest is the node's own.
func (c *FileConfig) validateControl(ck *config.Checker) {
	from := "given by the control plane when control is set; remove it from the file"
	if len(c.Listeners) > 0 {
		ck.Addf("listeners", "%s (the node's own settings of a listener go under node_listeners)", from)
	}
	if c.Routing != nil {
		ck.Addf("routing", "%s", from)
	}
	if len(c.Backends) > 0 {
		ck.Addf("backends", "%s", from)
	}
	if len(c.Certificates.Certificates) > 0 {
		ck.Addf("certificates.certificates", "%s (certificates and cert-bindings)", from)
	}
	if c.Certificates.Dir != "" {
		ck.Addf("certificates.dir", "%s (certificates and cert-bindings)", from)
	}
	if c.Certificates.Default != "" {
		ck.Addf("certificates.default", "%s (a cert-binding with default: true)", from)
	}
	if c.KeyServers == nil {
		ck.Addf("keyservers", "required with control: the control plane's certificates are served with keys the keyservers hold")
	}
	ck.Nest("control", c.Control.Validate())
	c.Control.Defaults(c.admin().StateDir)
	for _, name := range slices.Sorted(maps.Keys(c.NodeListeners)) {
		nl := c.NodeListeners[name]
		path := config.At("node_listeners", name)
		probe := l7.Listener{Addr: nl.Addr}
		ck.Nest(path, probe.Validate())
		ck.Nest(config.At(path, "client_ip"), nl.ClientIP.Validate())
	}
	for _, name := range slices.Sorted(maps.Keys(c.Blacklists)) {
		b := c.Blacklists[name]
		ck.Nest(config.At("blacklists", name), b.Validate())
	}
	c.validateNode(ck)
}

// withSnapshot returns the configuration the node serves: the node file c with the
// listeners, routing and certificates of snap. c is not changed.
func (c *FileConfig) withSnapshot(snap *model.Snapshot) (*FileConfig, error) {
	out := *c
	out.Listeners = nil
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(snap.Listeners)) {
		l := ListenerFile{Listener: snap.Listeners[name].Listener}
		if nl, ok := c.NodeListeners[name]; ok {
			if nl.Addr != "" {
				l.Addr = nl.Addr
			}
			l.QUICServerID = nl.QUICServerID
			l.ClientIP = nl.ClientIP
		}
		l.Listener.Defaults()
		if c.StateDir != "" && strings.ContainsAny(name, "/\x00") {
			errs = append(errs, fmt.Errorf("listeners/%s: the name names its blacklist's file in state_dir: no '/'", name))
		}
		out.Listeners = append(out.Listeners, l)
	}
	if len(out.Listeners) == 0 {
		errs = append(errs, errors.New("listeners: the configuration has no listener; l7d needs at least one"))
	}
	out.Routing = snap.RouteConfig()
	for _, name := range slices.Sorted(maps.Keys(c.Blacklists)) {
		if _, ok := snap.Listeners[name]; !ok && name != blacklist.GlobalName {
			errs = append(errs, fmt.Errorf("blacklists.%s (in the node's file): a list is %q or a listener's name, and the configuration has no listener %q", name, blacklist.GlobalName, name))
		}
	}
	mem := &certs.MemConfig{TicketKeyFiles: c.Certificates.TicketKeyFiles, Listeners: map[string][]certs.Binding{}}
	for _, name := range slices.Sorted(maps.Keys(snap.Certificates)) {
		mc := snap.Certificates[name]
		mem.Certificates = append(mem.Certificates, certs.MemCert{Name: mc.Name, Version: mc.Version, Chain: []byte(mc.Chain)})
	}
	for _, name := range slices.Sorted(maps.Keys(snap.CertBindings)) {
		b := snap.CertBindings[name]
		for _, l := range b.Listeners {
			mem.Listeners[l] = append(mem.Listeners[l], certs.Binding{
				Name: "cert-bindings/" + b.Name, Certificates: b.Certificates, ServerNames: b.ServerNames, Default: b.Default,
			})
		}
	}
	out.mem = mem
	out.revision = snap.Revision
	return &out, errors.Join(errs...)
}

// keyserverWait is how long a snapshot refused because no keyserver could be
// reached is tried again before it is reported refused.
var keyserverWait = 30 * time.Second

// applySnapshot is the agent's Apply: it puts snap in force through the reload
// path, on the owner goroutine; the first one starts the L7 server. A snapshot
// refused because no keyserver connection was up (keyservers starting with l7d, or a
// short outage) is tried again, with a backoff from 200ms to 5s, for keyserverWait:
// the agent tries a revision once, and a node that starts with its keyservers
// would otherwise serve nothing until the next write.
func (d *Daemon) applySnapshot(ctx context.Context, snap *model.Snapshot, rev int64) error {
	start, wait := time.Now(), 200*time.Millisecond
	for {
		var err error
		if e := d.do(func(c *control) { err = c.apply(snap, rev) }); e != nil {
			return e
		}
		if err == nil || !errors.Is(err, client.ErrUnavailable) || time.Since(start)+wait > keyserverWait {
			return err
		}
		d.Log.Warn("configuration from the control plane not applied: no keyserver connection; trying again",
			"revision", rev, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (c *control) apply(snap *model.Snapshot, rev int64) (err error) {
	defer func() { c.d.countReload(err) }()
	next, err := c.file.withSnapshot(snap)
	if err != nil {
		return err
	}
	if c.d.srv == nil {
		if err := c.start(next); err != nil {
			return err
		}
	} else {
		r, err := c.prepareConfig(next)
		if err != nil {
			return err
		}
		c.commitReload(r)
	}
	c.snap = snap
	c.d.Log.Info("configuration from the control plane applied", "revision", rev,
		"listeners", len(next.Listeners), "certificates", len(snap.Certificates))
	return nil
}

// start builds and starts the L7 server from the first snapshot: everything that can
// fail first (certificates, blacklists, the server and its sockets), then it commits
// the rest.
func (c *control) start(cfg *FileConfig) error {
	d := c.d
	names := listNames(cfg)
	if err := d.bl.PrepareDir(names); err != nil {
		return err
	}
	pc, err := d.store.PrepareMem(*cfg.mem)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	pol, err := newDecider(cfg, d.lists, d.Log)
	if err != nil {
		return err
	}
	lists, err := d.bl.Prepare(cfg.Blacklists, names)
	if err != nil {
		return err
	}
	if d.blsync != nil {
		var ls []string
		for _, l := range cfg.Listeners {
			ls = append(ls, l.Name)
		}
		d.blsync.start(ls)
	}
	srv, err := l7.NewServer(d.l7Config(cfg, pol))
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	d.srv = srv
	d.store.Commit(pc)
	d.bl.Commit(lists)
	for _, l := range cfg.Listeners {
		d.listenerNames = append(d.listenerNames, l.Name)
	}
	c.setConfig(cfg)
	close(d.started)
	return nil
}

// certificatesInUse lists the certificates served, for the node's status.
func (d *Daemon) certificatesInUse() []agent.CertInUse {
	set := d.store.Set()
	if set == nil {
		return nil
	}
	out := make([]agent.CertInUse, 0, len(set.Certs()))
	for _, c := range set.Certs() {
		sum := sha256.Sum256(c.Chain[0])
		out = append(out, agent.CertInUse{Name: c.Name, Version: c.Version, SHA256: hex.EncodeToString(sum[:])})
	}
	return out
}

// runAgent runs the node agent until ctx is done; the returned function stops it
// and waits for it.
func (d *Daemon) runAgent(ctx context.Context, cfg *FileConfig) (stop func(), err error) {
	nc := cfg.Control
	addr := cfg.AdminListen
	if addr == "off" {
		addr = ""
	}
	sl, err := d.newStoreLists(nc, cfg.admin().StateDir)
	if err != nil {
		return nil, err
	}
	d.blsync = sl
	a, err := agent.New(agent.Config{
		Open:          nc.OpenWith(d.Log.With("component", "store")),
		Node:          nc.Node,
		Role:          Role,
		Address:       addr, // the admin endpoint's, none when it is off
		Metrics:       addr,
		Certificates:  d.certificatesInUse,
		Blacklists:    sl.versions,
		BlacklistHits: sl.f.Hits,
		CacheFile:     nc.CacheFile,
		Apply:         d.applySnapshot,
		Logger:        d.Log,
		Registerer:    d.Reg,
	})
	if err != nil {
		return nil, err
	}
	d.agent = a
	actx, cancel := context.WithCancel(ctx)
	done, slDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(actx); err != nil && !errors.Is(err, context.Canceled) {
			d.Log.Error("node agent stopped", "err", err)
		}
	}()
	go func() { defer close(slDone); sl.run(actx) }()
	return func() { cancel(); <-done; <-slDone }, nil
}
