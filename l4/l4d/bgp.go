package l4d

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/bgp"
)

// AnnounceGate is a condition the LD must meet before it announces its VIPs, such as
// session sync's warm-up: ok false keeps every VIP withdrawn, and why says what it
// waits for (GET /bgp). It is called often (every bgp.check_interval), from one
// goroutine at a time, and must not block.
type AnnounceGate func() (ok bool, why string)

// AddAnnounceGate adds gate under name (the reason a VIP is withdrawn for while it is
// closed, in GET /bgp and tiergate_l4_bgp_*; short, like "warmup"). It may be called
// before or during Run; without a bgp section gates are kept and never asked.
func (d *Daemon) AddAnnounceGate(name string, gate AnnounceGate) {
	b := &d.bgp
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gates = append(b.gates, namedGate{name: name, gate: gate})
}

type namedGate struct {
	name string
	gate AnnounceGate
}

// bgpState is l4d's BGP speaker and what decides what it announces. mu orders the
// evaluations, so that a drain or the shutdown, once answered, is not undone by an
// evaluation computed before it.
type bgpState struct {
	mu       sync.Mutex
	speaker  *bgp.Speaker // nil without a bgp section
	gates    []namedGate
	drained  bool
	shutdown bool
	// fromStore is the file's bgp section with the control plane's l4-bgp object
	// (AS, peers, withdraw_unhealthy), nil while the store has none.
	fromStore *bgp.Config
	// closed are the gates closed at the last evaluation, with why.
	closed []GateStatus
}

// GateStatus is a closed announce gate, in GET /bgp.
type GateStatus struct {
	Name string `json:"name"`
	Why  string `json:"why"`
}

// BGPStatus is the body of GET /bgp, POST /drain and POST /undrain.
type BGPStatus struct {
	// Drained is true after POST /drain, until POST /undrain.
	Drained bool `json:"drained"`
	// ClosedGates are the announce gates keeping the VIPs withdrawn (warm-up).
	ClosedGates []GateStatus `json:"closed_gates"`
	bgp.Status
}

// validateBGP fills in the bgp section's defaults, its next hops from the external
// port's addresses, and checks it.
func (c *FileConfig) validateBGP(ck *config.Checker) {
	b := c.BGP
	if b == nil {
		return
	}
	ext := c.Ports.External
	if !b.NextHop.IsValid() && ext.Addr.IsValid() {
		b.NextHop = ext.Addr.Addr()
	}
	if !b.NextHop6.IsValid() && ext.Addr6.IsValid() {
		b.NextHop6 = ext.Addr6.Addr()
	}
	b.Defaults()
	ck.Nest("bgp", b.Validate())
	for i, r := range c.Rules {
		if (r.VIP.Is4() && !b.NextHop.IsValid()) || (r.VIP.Is6() && !r.VIP.Is4In6() && !b.NextHop6.IsValid()) {
			ck.Addf(config.Index("rules", i)+".vip", "%v cannot be announced over BGP: no next hop of its family (bgp.next_hop, bgp.next_hop6)", r.VIP)
		}
	}
}

// bgpSummary is l4d check's line about the bgp section; "" without one.
func (c *FileConfig) bgpSummary() string {
	b := c.BGP
	if b == nil {
		return ""
	}
	var nh, peers []string
	for _, a := range []netip.Addr{b.NextHop, b.NextHop6} {
		if a.IsValid() {
			nh = append(nh, a.String())
		}
	}
	for _, p := range b.Peers {
		bfd := ""
		if b.BFDOn(p) {
			bfd = fmt.Sprintf(", BFD %v x %d", b.BFD.MinTx, b.BFD.Multiplier)
		}
		peers = append(peers, fmt.Sprintf("%v AS %d (hold %v%s)", p.Address, p.AS, p.HoldTime, bfd))
	}
	return fmt.Sprintf("BGP: AS %d, router id %v, next hop %s; peers %s; withdraw_delay %v",
		b.ASN, b.RouterID, strings.Join(nh, ", "), strings.Join(peers, ", "), b.WithdrawDelay)
}

// startBGP starts the speaker when the file has a bgp section, and the evaluation of
// what it announces every check_interval. stop withdraws nothing by itself: it ends
// the evaluations and closes the sessions (the peers drop the routes with them).
func (d *Daemon) startBGP(ctx context.Context) (stop func(), err error) {
	cfg := d.current().file.BGP
	if cfg == nil {
		return func() {}, nil
	}
	// The store's setting, when the agent applied a snapshot already; a later one
	// changes the speaker's peers (applyStoreBGP).
	d.bgp.mu.Lock()
	if d.bgp.fromStore != nil {
		cfg = d.bgp.fromStore
	}
	sp, err := bgp.New(*cfg, bgp.Options{Logger: d.Log, Registerer: d.Reg})
	if err == nil {
		d.bgp.speaker = sp
	}
	d.bgp.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("bgp: %w", err)
	}
	d.evaluateBGP(ctx)
	if err := sp.Start(ctx); err != nil {
		return nil, fmt.Errorf("bgp: %w", err)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(cfg.CheckInterval.D())
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				d.evaluateBGP(lctx)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer scancel()
			if err := sp.Stop(sctx); err != nil {
				d.Log.Error("stopping BGP", "err", err)
			}
		})
	}, nil
}

// evaluateBGP decides, for every VIP of the rules in force, whether it is announced
// or why not, and has the speaker announce or withdraw what changed.
func (d *Daemon) evaluateBGP(ctx context.Context) {
	b := &d.bgp
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.speaker == nil {
		return
	}
	global := ""
	b.closed = b.closed[:0]
	for _, g := range b.gates {
		if ok, why := g.gate(); !ok {
			b.closed = append(b.closed, GateStatus{Name: g.name, Why: why})
			if global == "" {
				global = g.name
			}
		}
	}
	switch {
	case b.shutdown:
		global = bgp.ReasonShutdown
	case b.drained:
		global = bgp.ReasonDrain
	case !d.running.Load():
		global = bgp.ReasonDatapathStopped
	case !d.portsUp():
		global = bgp.ReasonPortsDown
	}
	fwd := d.forwarding()
	cfg := b.fromStore
	if cfg == nil {
		cfg = d.current().file.BGP
	}
	var schedulable map[string]int
	if global == "" && *cfg.WithdrawUnhealthy && d.dist != nil {
		schedulable = map[string]int{}
		for _, r := range d.dist.Status().Rules {
			schedulable[r.Name] = r.Members
		}
	}
	want := map[netip.Addr]string{}
	for _, r := range fwd.Rules {
		vip := r.VIP.Unmap()
		if global != "" {
			want[vip] = global
			continue
		}
		reason, seen := want[vip]
		if schedulable != nil && schedulable[r.Name] == 0 {
			if !seen {
				want[vip] = bgp.ReasonNoHealthyMember
			}
			continue
		}
		if !seen || reason != "" {
			want[vip] = ""
		}
	}
	if err := b.speaker.Set(ctx, want); err != nil {
		d.Log.Error("BGP announcement", "err", err)
	}
}

// storeBGP returns the bgp configuration that snap's l4-bgp object makes of the
// file's bgp section (model.L4BGP.Config), with its defaults, or nil when the store
// has none; ok false without a bgp section in the file, which the store's object
// does not give (each LD's router ID, next hops, local addresses and passwords are
// its own). It refuses, naming the object's fields, a setting l4/bgp refuses and a
// change of the AS the speaker runs with (that needs l4d restarted). Called on the
// owner goroutine.
func (d *Daemon) storeBGP(snap *model.Snapshot) (cfg *bgp.Config, ok bool, err error) {
	file := d.file.BGP
	if file == nil {
		return nil, false, nil
	}
	obj := snap.BGP()
	if obj == nil {
		cfg = file
	} else {
		c := obj.Config(*file)
		c.Defaults()
		if err := c.Validate(); err != nil {
			var ck config.Checker
			ck.Nest(model.KindL4BGP+"/"+obj.Name, err)
			return nil, true, ck.Err()
		}
		cfg = &c
	}
	d.bgp.mu.Lock()
	sp := d.bgp.speaker
	d.bgp.mu.Unlock()
	if sp != nil {
		if running := sp.Config().ASN; running != cfg.ASN {
			path := "bgp.asn"
			if obj != nil {
				path = model.KindL4BGP + "/" + obj.Name + ".asn"
			}
			return nil, true, &config.FieldError{Path: path, Err: fmt.Errorf(
				"%d: this LD's BGP speaker runs as AS %d, and a change of AS needs l4d restarted", cfg.ASN, running)}
		}
	}
	if obj == nil {
		return nil, true, nil
	}
	return cfg, true, nil
}

// applyStoreBGP puts cfg, storeBGP's (nil: the file's own), in force: the speaker's
// sessions with peers that changed are closed and opened again, the others kept, and
// what is announced is evaluated again (withdraw_unhealthy). Called on the owner
// goroutine.
func (d *Daemon) applyStoreBGP(ctx context.Context, cfg *bgp.Config) {
	d.bgp.mu.Lock()
	d.bgp.fromStore = cfg
	sp := d.bgp.speaker
	d.bgp.mu.Unlock()
	if cfg == nil {
		cfg = d.file.BGP
	}
	if sp == nil {
		return // startBGP takes fromStore
	}
	if !reflect.DeepEqual(sp.Config().Peers, cfg.Peers) {
		if err := sp.SetPeers(ctx, cfg.Peers); err != nil {
			d.Log.Error("BGP peers from the control plane", "err", err)
		}
	}
	d.evaluateBGP(ctx)
}

// portsUp reports whether every port's link is up.
func (d *Daemon) portsUp() bool {
	if d.ports == nil {
		return false
	}
	for _, dev := range d.ports.devices {
		if up, _, err := dev.Link(); err != nil || !up {
			return false
		}
	}
	return true
}

// withdrawForStop withdraws every VIP (reason shutdown) and returns how long l4d
// should go on forwarding so that the routers move the traffic away; 0 without BGP.
func (d *Daemon) withdrawForStop() time.Duration {
	b := &d.bgp
	b.mu.Lock()
	b.shutdown = true
	sp := b.speaker
	b.mu.Unlock()
	if sp == nil {
		return 0
	}
	d.evaluateBGP(context.Background())
	delay := d.current().file.BGP.WithdrawDelay.D()
	d.Log.Info("VIPs withdrawn from BGP; forwarding while the routers move the traffic", "withdraw_delay", delay)
	return delay
}

// bgpStatus is GET /bgp's body.
func (d *Daemon) bgpStatus(ctx context.Context) BGPStatus {
	b := &d.bgp
	b.mu.Lock()
	st := BGPStatus{Drained: b.drained, ClosedGates: slices.Clone(b.closed)}
	sp := b.speaker
	b.mu.Unlock()
	if st.ClosedGates == nil {
		st.ClosedGates = []GateStatus{}
	}
	st.Status = sp.Status(ctx)
	return st
}

// bgpRoutes adds GET /bgp, POST /drain and POST /undrain.
func (d *Daemon) bgpRoutes(handle func(string, daemon.Handler)) {
	speaker := func() error {
		d.bgp.mu.Lock()
		defer d.bgp.mu.Unlock()
		if d.bgp.speaker == nil {
			return notFound("BGP is not configured (no bgp section)")
		}
		return nil
	}
	handle("GET /bgp", func(w http.ResponseWriter, r *http.Request) error {
		if err := speaker(); err != nil {
			return err
		}
		daemon.WriteJSON(w, http.StatusOK, d.bgpStatus(r.Context()))
		return nil
	})
	for _, op := range []struct {
		verb    string
		drained bool
	}{{"drain", true}, {"undrain", false}} {
		handle("POST /"+op.verb, func(w http.ResponseWriter, r *http.Request) error {
			if err := speaker(); err != nil {
				return err
			}
			d.bgp.mu.Lock()
			d.bgp.drained = op.drained
			d.bgp.mu.Unlock()
			// Not the request's context: a client gone must not cut a change half-way.
			d.evaluateBGP(context.WithoutCancel(r.Context()))
			d.Log.Info("LD "+op.verb+"ed through the admin API", "from", r.RemoteAddr)
			daemon.WriteJSON(w, http.StatusOK, d.bgpStatus(r.Context()))
			return nil
		})
	}
}
