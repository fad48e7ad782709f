package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/bfd"
)

// Reasons a VIP is withdrawn, as Status, GET /bgp and the metrics' reason label give
// them. A gate of l4d's (warm-up) gives its own name.
const (
	ReasonDrain           = "drain"             // POST /drain: the operator took the LD out
	ReasonShutdown        = "shutdown"          // SIGTERM or SIGINT: l4d is stopping
	ReasonDatapathStopped = "datapath_stopped"  // the datapath is not running
	ReasonPortsDown       = "ports_down"        // a port's link is down
	ReasonNoHealthyMember = "no_healthy_member" // none of the VIP's rules has a member up and not drained
	ReasonRemoved         = "removed"           // the VIP is no longer in any rule
	ReasonNotStarted      = "not_started"       // the speaker has not started or has stopped
)

// Options are what a Speaker gets from its daemon.
type Options struct {
	// Logger receives the speaker's and gobgp's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the tiergate_l4_bgp_* metrics.
	Registerer prometheus.Registerer
}

// Speaker is a BGP speaker announcing VIPs. Its methods may be called from any
// goroutine.
type Speaker struct {
	cfg       Config
	log       *slog.Logger
	passwords []string // by peer index

	mu  sync.Mutex
	srv *server.BgpServer // nil before Start and after Stop
	// bfd runs the BFD sessions of the peers with BFD, from Start to Stop; nil
	// when none has it.
	bfd     *bfd.Speaker
	started time.Time
	vips    map[netip.Addr]*vipState
	// counters, under mu
	announcements uint64
	withdrawals   map[string]uint64 // by reason
}

// vipState is one VIP: announced (with the path's gobgp UUID) or withdrawn, why, and
// since when.
type vipState struct {
	announced bool
	uuid      []byte
	reason    string
	since     time.Time
}

// New returns a speaker for cfg, whose defaults must be filled in and which must be
// valid (Defaults, Validate); it reads the peers' password files. Nothing is
// announced until Start and Set.
func New(cfg Config, opts Options) (*Speaker, error) {
	s := &Speaker{cfg: cfg, log: opts.Logger, vips: map[netip.Addr]*vipState{}, withdrawals: map[string]uint64{}}
	if s.log == nil {
		s.log = slog.Default()
	}
	var err error
	if s.passwords, err = readPasswords(cfg.Peers); err != nil {
		return nil, err
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(&collector{s: s}); err != nil {
			return nil, fmt.Errorf("registering the BGP metrics: %w", err)
		}
	}
	return s, nil
}

// readPasswords reads the peers' password files, and refuses TCP MD5 and TTL
// security where the listeners are not plain TCP.
func readPasswords(peers []PeerConfig) ([]string, error) {
	pws := make([]string, len(peers))
	for i, p := range peers {
		pw := ""
		if p.PasswordFile != "" {
			data, err := os.ReadFile(p.PasswordFile)
			if err != nil {
				return nil, &config.FieldError{Path: config.Index("peers", i) + ".password_file", Err: fmt.Errorf("reading the TCP MD5 key: %w", err)}
			}
			pw = strings.TrimSpace(string(data))
			if len(pw) == 0 || len(pw) > 80 {
				return nil, &config.FieldError{Path: config.Index("peers", i) + ".password_file",
					Err: fmt.Errorf("%s holds a key of %d bytes: want 1..80 (TCP_MD5SIG_MAXKEYLEN)", p.PasswordFile, len(pw))}
			}
		}
		pws[i] = pw
		if (pw != "" || p.TTLSecurity) && !plainTCP() {
			return nil, &config.FieldError{Path: config.Index("peers", i), Err: errors.New(
				"TCP MD5 and TTL security need plain TCP listeners, and this program listens with MPTCP (Go's default): build it with //go:debug multipathtcp=0 (cmd/l4d is) or run it with GODEBUG=multipathtcp=0")}
		}
	}
	return pws, nil
}

// plainTCP reports whether the program's listeners are plain TCP: GODEBUG, or the
// binary's default of it, says multipathtcp=0 (or 3, MPTCP for dialing only).
func plainTCP() bool {
	setting := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, kv := range bi.Settings {
			if kv.Key == "DefaultGODEBUG" {
				setting = godebugValue(kv.Value, setting)
			}
		}
	}
	setting = godebugValue(os.Getenv("GODEBUG"), setting)
	return setting == "0" || setting == "3"
}

// godebugValue returns the last multipathtcp value in the GODEBUG list s, or def.
func godebugValue(s, def string) string {
	for kv := range strings.SplitSeq(s, ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(kv), "multipathtcp="); ok {
			def = v
		}
	}
	return def
}

// Config returns the speaker's configuration.
func (s *Speaker) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cfg
	c.Peers = slices.Clone(c.Peers)
	return c
}

// SetPeers replaces the speaker's peers with peers, whose defaults must be filled in
// and which must be valid with the speaker's AS (Config.Validate): the sessions of
// peers gone or changed are closed, those of peers new or changed opened, the others
// left as they are; a new session is sent the VIPs announced. The password files are
// read again. Before Start it changes what Start adds.
func (s *Speaker) SetPeers(ctx context.Context, peers []PeerConfig) error {
	pws, err := readPasswords(peers)
	if err != nil {
		return err
	}
	peers = slices.Clone(peers)
	s.mu.Lock()
	defer s.mu.Unlock()
	same := func(i int, p PeerConfig, pw string) bool {
		return reflect.DeepEqual(s.cfg.Peers[i], p) && s.passwords[i] == pw
	}
	oldAt := map[netip.Addr]int{}
	for i, p := range s.cfg.Peers {
		oldAt[p.Address] = i
	}
	newAt := map[netip.Addr]int{}
	for j, p := range peers {
		newAt[p.Address] = j
	}
	var errs []error
	if s.srv != nil {
		for i, p := range s.cfg.Peers {
			if j, ok := newAt[p.Address]; ok && same(i, peers[j], pws[j]) {
				continue
			}
			if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.Address.String()}); err != nil {
				errs = append(errs, fmt.Errorf("removing BGP peer %v: %w", p.Address, err))
			}
		}
	}
	var added []PeerConfig
	for j, p := range peers {
		if i, ok := oldAt[p.Address]; !ok || !same(i, p, pws[j]) {
			added = append(added, p)
		}
	}
	s.cfg.Peers, s.passwords = peers, pws
	if s.srv != nil {
		for _, p := range added {
			if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peer(newAt[p.Address], p)}); err != nil {
				errs = append(errs, fmt.Errorf("adding BGP peer %v (AS %d): %w", p.Address, p.AS, err))
			}
		}
	}
	if s.srv != nil {
		if err := s.syncBFDLocked(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(added) > 0 || len(errs) > 0 {
		s.log.Info("BGP peers changed", "peers", len(peers), "opened", len(added), "errors", len(errs))
	}
	return errors.Join(errs...)
}

// syncBFDLocked makes the BFD sessions those of the peers with BFD: it opens the
// missing ones (and those whose timers or local address changed) and removes the
// others, each saying AdminDown.
func (s *Speaker) syncBFDLocked() error {
	want := map[netip.Addr]bool{}
	var errs []error
	params := bfd.Params{MinTx: s.cfg.BFD.MinTx.D(), MinRx: s.cfg.BFD.MinRx.D(), Multiplier: s.cfg.BFD.Multiplier}
	for _, p := range s.cfg.Peers {
		if !s.cfg.BFDOn(p) {
			continue
		}
		want[p.Address] = true
		if s.bfd == nil {
			s.bfd = bfd.New(bfd.Options{Logger: s.log})
		}
		if err := s.bfd.Add(p.Address, p.LocalAddress, params); err != nil {
			errs = append(errs, fmt.Errorf("opening the BFD session with peer %v: %w", p.Address, err))
		}
	}
	if s.bfd != nil {
		for _, st := range s.bfd.Sessions() {
			if !want[st.Peer] {
				s.bfd.Remove(st.Peer)
			}
		}
	}
	return errors.Join(errs...)
}

// Start starts the BGP server, listening on ListenPort, and adds the peers; it
// connects out to them in the background and announces what Set says.
func (s *Speaker) Start(ctx context.Context) error {
	// BFD first: a socket it cannot open (port 3784 taken) fails the start.
	s.mu.Lock()
	err := s.syncBFDLocked()
	s.mu.Unlock()
	if err != nil {
		s.stopBFD()
		return err
	}
	srv := server.NewBgpServer(server.LoggerOption(newLogger(s.log)))
	go srv.Serve()
	listen := make([]string, 0, len(s.cfg.ListenAddresses))
	for _, a := range s.cfg.ListenAddresses {
		listen = append(listen, a.String())
	}
	if err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:             s.cfg.ASN,
		RouterId:        s.cfg.RouterID.String(),
		ListenPort:      s.cfg.ListenPort,
		ListenAddresses: listen,
	}}); err != nil {
		srv.Stop()
		s.stopBFD()
		return fmt.Errorf("starting the BGP speaker (AS %d, port %d): %w", s.cfg.ASN, s.cfg.ListenPort, err)
	}
	// The peers are added under mu, so that a SetPeers meanwhile waits and then
	// finds the server.
	s.mu.Lock()
	for i, p := range s.cfg.Peers {
		if err := srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peer(i, p)}); err != nil {
			s.mu.Unlock()
			_ = srv.StopBgp(context.WithoutCancel(ctx), &api.StopBgpRequest{})
			srv.Stop()
			s.stopBFD()
			return fmt.Errorf("adding BGP peer %v (AS %d): %w", p.Address, p.AS, err)
		}
	}
	s.srv, s.started = srv, time.Now()
	npeers := len(s.cfg.Peers)
	// What Set asked before Start is announced now.
	var errs []error
	for _, vip := range slices.SortedFunc(maps.Keys(s.vips), netip.Addr.Compare) {
		if st := s.vips[vip]; st.announced && st.uuid == nil {
			if err := s.addLocked(ctx, vip, st); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.mu.Unlock()
	s.log.Info("BGP speaker started", "asn", s.cfg.ASN, "router_id", s.cfg.RouterID, "listen_port", s.cfg.ListenPort, "peers", npeers)
	return errors.Join(errs...)
}

// peer is the gobgp configuration of peer i.
func (s *Speaker) peer(i int, p PeerConfig) *api.Peer {
	sec := func(d config.Duration) uint64 { return uint64(d.D() / time.Second) }
	ap := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.AS,
			AuthPassword:    s.passwords[i],
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime:          sec(p.HoldTime),
			KeepaliveInterval: sec(p.KeepaliveInterval),
			ConnectRetry:      sec(p.ConnectRetry),
			// A session reset is retried after a second, not gobgp's default 30.
			IdleHoldTimeAfterReset: 1,
		}},
		Transport: &api.Transport{
			RemotePort:  uint32(p.Port),
			PassiveMode: p.Passive,
		},
	}
	if p.LocalAddress.IsValid() {
		ap.Transport.LocalAddress = p.LocalAddress.String()
	}
	if p.TTLSecurity {
		ap.TtlSecurity = &api.TtlSecurity{Enabled: true, TtlMin: uint32(256 - p.TTLHops)}
	}
	for _, fam := range s.families() {
		ap.AfiSafis = append(ap.AfiSafis, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: fam, Enabled: true}})
	}
	return ap
}

var (
	familyIPv4 = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	familyIPv6 = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
)

// families are the address families the speaker announces: those it has a next hop
// of.
func (s *Speaker) families() []*api.Family {
	var f []*api.Family
	if s.cfg.NextHop.IsValid() {
		f = append(f, familyIPv4)
	}
	if s.cfg.NextHop6.IsValid() {
		f = append(f, familyIPv6)
	}
	return f
}

// Set makes the announced VIPs what want says: a VIP whose reason is "" is
// announced, one with a reason is withdrawn for it, and a VIP Set announced or
// withdrew before that is not in want is withdrawn and forgotten (ReasonRemoved).
// Only changes reach the peers. A VIP of a family the speaker has no next hop of is
// refused in the error, and the others are still set.
func (s *Speaker) Set(ctx context.Context, want map[netip.Addr]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, vip := range slices.SortedFunc(maps.Keys(s.vips), netip.Addr.Compare) {
		if _, ok := want[vip]; !ok {
			if err := s.setLocked(ctx, vip, ReasonRemoved); err != nil {
				errs = append(errs, err)
			}
			delete(s.vips, vip)
		}
	}
	for _, vip := range slices.SortedFunc(maps.Keys(want), netip.Addr.Compare) {
		if err := s.setLocked(ctx, vip, want[vip]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WithdrawAll withdraws every VIP for reason (not "").
func (s *Speaker) WithdrawAll(ctx context.Context, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, vip := range slices.SortedFunc(maps.Keys(s.vips), netip.Addr.Compare) {
		if err := s.setLocked(ctx, vip, reason); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// setLocked announces vip (reason "") or withdraws it for reason.
func (s *Speaker) setLocked(ctx context.Context, vip netip.Addr, reason string) error {
	vip = vip.Unmap()
	if (vip.Is4() && !s.cfg.NextHop.IsValid()) || (vip.Is6() && !s.cfg.NextHop6.IsValid()) {
		return fmt.Errorf("announcing VIP %v: no next hop of its family (set bgp.next_hop or next_hop6)", vip)
	}
	st, ok := s.vips[vip]
	if !ok {
		st = &vipState{reason: ReasonNotStarted, since: time.Now()}
		s.vips[vip] = st
	}
	if reason == "" {
		if st.announced {
			return nil
		}
		// Only a path the server took is announced: a failure leaves the VIP
		// withdrawn, and the next Set tries again.
		if s.srv != nil {
			if err := s.addLocked(ctx, vip, st); err != nil {
				return err
			}
		}
		st.announced, st.reason, st.since = true, "", time.Now()
		s.announcements++
		s.log.Info("announcing VIP", "vip", vip)
		return nil
	}
	if !st.announced {
		st.reason = reason // still withdrawn, perhaps now for another reason
		return nil
	}
	if st.uuid != nil && s.srv != nil {
		// A failure leaves the VIP announced, and the next Set tries again.
		if err := s.srv.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Uuid: st.uuid}); err != nil {
			return fmt.Errorf("withdrawing VIP %v: %w", vip, err)
		}
	}
	st.uuid = nil
	st.announced, st.reason, st.since = false, reason, time.Now()
	s.withdrawals[reason]++
	s.log.Info("withdrawing VIP", "vip", vip, "reason", reason)
	return nil
}

// addLocked adds vip's path to the global table, which the peers are sent.
func (s *Speaker) addLocked(ctx context.Context, vip netip.Addr, st *vipState) error {
	path, err := s.path(vip)
	if err != nil {
		return err
	}
	res, err := s.srv.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path})
	if err != nil {
		return fmt.Errorf("announcing VIP %v: %w", vip, err)
	}
	st.uuid = res.Uuid
	return nil
}

// path is vip's host route with the LD's next hop, origin IGP.
func (s *Speaker) path(vip netip.Addr) (*api.Path, error) {
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: vip.String(), PrefixLen: uint32(vip.BitLen())})
	if err != nil {
		return nil, err
	}
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0})
	if err != nil {
		return nil, err
	}
	if vip.Is4() {
		nh, err := anypb.New(&api.NextHopAttribute{NextHop: s.cfg.NextHop.String()})
		if err != nil {
			return nil, err
		}
		return &api.Path{Family: familyIPv4, Nlri: nlri, Pattrs: []*anypb.Any{origin, nh}}, nil
	}
	mp, err := anypb.New(&api.MpReachNLRIAttribute{Family: familyIPv6, NextHops: []string{s.cfg.NextHop6.String()}, Nlris: []*anypb.Any{nlri}})
	if err != nil {
		return nil, err
	}
	return &api.Path{Family: familyIPv6, Nlri: nlri, Pattrs: []*anypb.Any{origin, mp}}, nil
}

// Stop closes the sessions (a Cease notification to each established peer, which
// withdraws everything the speaker announced) and stops the server. The VIPs are
// reported withdrawn for ReasonNotStarted, unless withdrawn already.
func (s *Speaker) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	for _, st := range s.vips {
		if st.announced {
			st.announced, st.reason, st.since = false, ReasonNotStarted, time.Now()
			s.withdrawals[ReasonNotStarted]++
		}
		st.uuid = nil
	}
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.StopBgp(ctx, &api.StopBgpRequest{})
	srv.Stop()
	// BFD last: the sessions are closed already, so the routers never learn of
	// a graceful stop from BFD.
	s.stopBFD()
	if err != nil {
		return fmt.Errorf("stopping the BGP speaker: %w", err)
	}
	s.log.Info("BGP speaker stopped")
	return nil
}

// stopBFD ends the BFD sessions, each saying AdminDown.
func (s *Speaker) stopBFD() {
	s.mu.Lock()
	b := s.bfd
	s.bfd = nil
	s.mu.Unlock()
	if b != nil {
		b.Close()
	}
}

// Status is the speaker's view: its sessions and its VIPs.
type Status struct {
	ASN      uint32 `json:"asn"`
	RouterID string `json:"router_id"`
	// Running is true between Start and Stop.
	Running bool         `json:"running"`
	Peers   []PeerStatus `json:"peers"`
	VIPs    []VIPStatus  `json:"vips"`
	// Announced and Withdrawn count the VIPs in each state now.
	Announced int `json:"announced"`
	Withdrawn int `json:"withdrawn"`
	// Announcements counts the VIPs announced since start, Withdrawals those
	// withdrawn, by reason.
	Announcements uint64            `json:"announcements"`
	Withdrawals   map[string]uint64 `json:"withdrawals"`
	// BFDDropped counts the BFD packets received and dropped, by reason (l4/bfd's
	// Speaker.Drops); absent without BFD.
	BFDDropped map[string]uint64 `json:"bfd_dropped,omitempty"`
}

// PeerStatus is one session.
type PeerStatus struct {
	Address string `json:"address"`
	AS      uint32 `json:"as"`
	// State is the session's FSM state: idle, connect, active, opensent,
	// openconfirm or established.
	State string `json:"state"`
	// Since is when the session was established (when it is) or went down.
	Since time.Time `json:"since,omitzero"`
	// UptimeSeconds is how long it has been established; 0 when it is not.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// HoldTime is the negotiated hold time in seconds, when established.
	HoldTime uint64 `json:"hold_time,omitempty"`
	// Advertised counts the prefixes sent to the peer and in force there.
	Advertised uint64 `json:"advertised"`
	// Flaps counts the times the session went down after having been established.
	Flaps uint32 `json:"flaps"`
	// BFD is the peer's BFD session (state up, down, init or admin_down, timers,
	// counters); absent when the peer has none.
	BFD *bfd.SessionStatus `json:"bfd,omitempty"`
}

// VIPStatus is one VIP.
type VIPStatus struct {
	VIP       string    `json:"vip"`
	Announced bool      `json:"announced"`
	Reason    string    `json:"reason,omitempty"` // why it is withdrawn
	Since     time.Time `json:"since"`
}

// Status returns the speaker's sessions and VIPs.
func (s *Speaker) Status(ctx context.Context) Status {
	s.mu.Lock()
	st := Status{ASN: s.cfg.ASN, RouterID: s.cfg.RouterID.String(), Running: s.srv != nil,
		Announcements: s.announcements, Withdrawals: maps.Clone(s.withdrawals), VIPs: []VIPStatus{}}
	for _, vip := range slices.SortedFunc(maps.Keys(s.vips), netip.Addr.Compare) {
		v := s.vips[vip]
		st.VIPs = append(st.VIPs, VIPStatus{VIP: vip.String(), Announced: v.announced, Reason: v.reason, Since: v.since})
		if v.announced {
			st.Announced++
		} else {
			st.Withdrawn++
		}
	}
	srv := s.srv
	cfgPeers := slices.Clone(s.cfg.Peers)
	bs := s.bfd
	s.mu.Unlock()
	st.Peers = s.peers(ctx, srv, cfgPeers)
	if bs != nil {
		st.BFDDropped = bs.Drops()
		for i := range st.Peers {
			if b, ok := bs.Session(cfgPeers[i].Address); ok {
				st.Peers[i].BFD = &b
			}
		}
	}
	return st
}

// peers reports the sessions, in the configuration's order; without a server, every
// one idle.
func (s *Speaker) peers(ctx context.Context, srv *server.BgpServer, cfgPeers []PeerConfig) []PeerStatus {
	byAddr := map[string]*api.Peer{}
	if srv != nil {
		_ = srv.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
			if p.Conf != nil {
				byAddr[p.Conf.NeighborAddress] = p
			}
		})
	}
	out := make([]PeerStatus, 0, len(cfgPeers))
	now := time.Now()
	for _, pc := range cfgPeers {
		ps := PeerStatus{Address: pc.Address.String(), AS: pc.AS, State: "idle"}
		if p := byAddr[ps.Address]; p != nil {
			if p.State != nil {
				ps.State = strings.ToLower(p.State.SessionState.String())
				if ps.State == "unknown" {
					ps.State = "idle"
				}
				ps.Flaps = p.State.Flops
			}
			established := ps.State == "established"
			if t := p.Timers; t != nil && t.State != nil {
				if established && t.State.Uptime != nil {
					ps.Since = t.State.Uptime.AsTime()
					ps.UptimeSeconds = now.Sub(ps.Since).Seconds()
					ps.HoldTime = t.State.NegotiatedHoldTime
				} else if !established && t.State.Downtime != nil && t.State.Downtime.AsTime().Unix() > 0 {
					ps.Since = t.State.Downtime.AsTime()
				}
			}
			for _, af := range p.AfiSafis {
				if af.State != nil {
					ps.Advertised += af.State.Advertised
				}
			}
		}
		out = append(out, ps)
	}
	return out
}

// SessionStates are the states a session reports, in FSM order.
var SessionStates = []string{"idle", "connect", "active", "opensent", "openconfirm", "established"}
