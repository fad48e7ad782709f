package l4d

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// codeControlPlane is the admin API's error when a change of rules or pools is asked
// of an l4d whose rules and pools come from the control plane (409).
const codeControlPlane = "control_plane"

// controlState is what the control plane's agent did, for /healthz and GET
// /control.
type controlState struct {
	agent atomic.Pointer[agent.Agent]
	// follower keeps the blacklists in step with the store; nil without any.
	follower atomic.Pointer[blsync.Follower]
	// applied is the revision of the snapshot in force, 0 before the first.
	applied atomic.Int64
}

// startControl starts the node agent when the file has a control section: it reads
// the store's snapshots and applies their L4 rules and pools (applySnapshot). The
// returned stop ends it and waits; it is a no-op without a control section.
func (d *Daemon) startControl(ctx context.Context) (stop func(), err error) {
	nc := d.file.Control
	if nc == nil {
		return func() {}, nil
	}
	addr := ""
	if a := d.AdminAddr(); a != nil {
		addr = a.String()
	}
	fol, err := d.blacklistFollower(nc)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	var versions func() map[string]int64
	var hits func() map[string]uint64
	if fol != nil {
		versions, hits = fol.Versions, fol.Hits
	}
	a, err := agent.New(agent.Config{
		Open:    nc.OpenWith(d.Log),
		Node:    nc.Node,
		Role:    "l4d",
		Address: addr,
		Metrics: addr, // the admin endpoint's /metrics

		Blacklists:    versions,
		BlacklistHits: hits,
		CacheFile:     nc.CacheFile,
		Apply:         d.applyControl,
		Logger:        d.Log,
		Registerer:    d.Reg,
	})
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	d.control.agent.Store(a)
	// Not ctx's end but stop ends it: it reports through the lame-duck delay.
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(actx) })
	if fol != nil {
		wg.Go(func() { fol.Run(actx) })
		d.Log.Info("blacklists from the control plane", "lists", d.file.Blacklists, "dir", d.file.BlacklistDir)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	d.Log.Info("rules and pools from the control plane", "node", nc.Node, "etcd_endpoints", nc.EtcdEndpoints, "cache_file", nc.CacheFile)
	return func() {
		cancel()
		<-done
	}, nil
}

// blacklistFollower puts the lists the file names (blacklists) in force in the
// datapath, empty until the follower it returns fills them from the store (or from
// blacklist_dir, first). It returns nil when the file names none.
func (d *Daemon) blacklistFollower(nc *agent.NodeConfig) (*blsync.Follower, error) {
	names := d.file.Blacklists
	if len(names) == 0 {
		return nil, nil
	}
	byName := make(map[string]*blacklist.List, len(names))
	lists := make([]*blacklist.List, 0, len(names))
	for _, n := range names {
		l := blacklist.NewList(n, blacklist.Options{Registerer: d.Reg})
		if err := l.MetricsError(); err != nil {
			return nil, err
		}
		byName[n] = l
		lists = append(lists, l)
	}
	fol, err := blsync.NewFollower(blsync.FollowerConfig{
		Open: nc.OpenWith(d.Log),
		Dir:  d.file.BlacklistDir,
		List: func(name string) *blacklist.List { return byName[name] },
		Changed: func() {
			if a := d.control.agent.Load(); a != nil {
				a.Report()
			}
		},
		Logger: d.Log,
	})
	if err != nil {
		return nil, err
	}
	d.dist.SetBlacklists(lists...)
	d.control.follower.Store(fol)
	return fol, nil
}

// applyControl is the agent's Apply: it puts the snapshot's L4 rules and pools in
// force on the owner goroutine, as a reload would, all or nothing.
func (d *Daemon) applyControl(_ context.Context, snap *model.Snapshot, rev int64) error {
	var err error
	if e := d.do(func() { err = d.applySnapshot(snap, rev) }); e != nil {
		return e
	}
	return err
}

// applySnapshot is applyControl on the owner goroutine. Errors name the objects of
// the snapshot ("l4-rules/web.vip: ...").
func (d *Daemon) applySnapshot(snap *model.Snapshot, rev int64) (err error) {
	defer func() { d.CountChange("control", err) }()
	next := d.fwd.clone()
	next.Rules, next.Pools = snap.L4()
	if next.Rules == nil {
		next.Rules = []datapath.RuleConfig{}
	}
	dcfg, err := d.file.with(next).Datapath()
	if err != nil {
		return objectPaths(err, next)
	}
	bgpCfg, speaks, err := d.storeBGP(snap)
	if err != nil {
		return err
	}
	if err := d.dist.Apply(dcfg); err != nil {
		return objectPaths(err, next)
	}
	d.setInForce(d.file, next)
	if speaks {
		d.applyStoreBGP(context.Background(), bgpCfg)
	}
	d.control.applied.Store(rev)
	d.Log.Info("configuration from the control plane in force", "revision", rev, "rules", len(next.Rules), "pools", len(next.Pools))
	return nil
}

// objectPaths renames the file's paths of rules and pools in err to the control
// plane's objects: rules[i] is l4-rules/<its name>, pools.<name> is
// l4-pools/<name>.
func objectPaths(err error, f Forwarding) error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	// Longest first: a pool "a.b" is matched before a pool "a".
	pools := slices.SortedFunc(maps.Keys(f.Pools), func(a, b string) int { return len(b) - len(a) })
	var ck config.Checker
	for _, e := range errs {
		var fe *config.FieldError
		if !errors.As(e, &fe) {
			ck.Nest("", e)
			continue
		}
		ck.Add(objectPath(fe.Path, f.Rules, pools), fe.Err)
	}
	return ck.Err()
}

// objectPath returns the control plane's name of the file's path.
func objectPath(path string, rules []datapath.RuleConfig, pools []string) string {
	for i, r := range rules {
		base := config.Index("rules", i)
		if rest, ok := strings.CutPrefix(path, base); ok && (rest == "" || rest[0] == '.') {
			return model.KindL4Rule + "/" + r.Name + rest
		}
	}
	for _, name := range pools {
		base := config.At("pools", name)
		if rest, ok := strings.CutPrefix(path, base); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			return model.KindL4Pool + "/" + name + rest
		}
	}
	return path
}

// controlHealth is /healthz's word on the control plane: unhealthy until a first
// snapshot is in force (l4d forwards nothing before).
func (d *Daemon) controlHealth() error {
	if d.current().file.Control == nil || d.control.applied.Load() > 0 {
		return nil
	}
	return errors.New("no configuration from the control plane yet")
}

// controlled refuses a change of the forwarding configuration through the admin
// API when the rules and pools come from the control plane.
func (d *Daemon) controlled() error {
	nc := d.current().file.Control
	if nc == nil {
		return nil
	}
	return daemon.Errorf(http.StatusConflict, codeControlPlane,
		"the rules and pools of this l4d come from the control plane (node %q): change them there, with tgctl", nc.Node)
}

// controlStatus is the body of GET /control.
type controlStatus struct {
	// Enabled says whether a control section is configured; the rest is empty
	// without.
	Enabled bool `json:"enabled"`
	// Node, EtcdEndpoints and CacheFile are the control section's.
	Node          string   `json:"node,omitempty"`
	EtcdEndpoints []string `json:"etcd_endpoints,omitempty"`
	CacheFile     string   `json:"cache_file,omitempty"`
	// Status is what the agent reports to the store: the revision in force, or the
	// one refused and why.
	Status *agent.Status `json:"status,omitempty"`
	// Blacklists are the versions of the blacklists in force by name (0 until a
	// first version), and BlacklistErrors why the store's last version of a list
	// was not put in force (the version before stays).
	Blacklists      map[string]int64  `json:"blacklists,omitempty"`
	BlacklistErrors map[string]string `json:"blacklist_errors,omitempty"`
}

// controlInfo returns GET /control's body.
func (d *Daemon) controlInfo() controlStatus {
	nc := d.current().file.Control
	if nc == nil {
		return controlStatus{}
	}
	cs := controlStatus{Enabled: true, Node: nc.Node, EtcdEndpoints: nc.EtcdEndpoints, CacheFile: nc.CacheFile}
	if a := d.control.agent.Load(); a != nil {
		st := a.Status()
		cs.Status = &st
	}
	if f := d.control.follower.Load(); f != nil {
		cs.Blacklists = f.Versions()
		for _, n := range d.current().file.Blacklists {
			if _, ok := cs.Blacklists[n]; !ok {
				cs.Blacklists[n] = 0
			}
		}
		if errs := f.Errors(); len(errs) > 0 {
			cs.BlacklistErrors = errs
		}
	}
	return cs
}
