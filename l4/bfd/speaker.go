// Package bfd is a single-hop BFD speaker (RFC 5880, 5881) in asynchronous mode, so
// that a router drops the routes of an LD that died within a second instead of at
// its BGP hold timer (3 s at the shortest). l4/bgp opens one session per router next
// to its BGP session; the router (bird2's `bfd on`) withdraws the LD's routes when
// the session goes Down.
//
// A Speaker holds sessions, one per peer address, each in its own goroutine: the
// three-way handshake (Down, Init, Up), a Poll Sequence to move to the configured
// intervals once Up (at most one packet a second before that, as RFC 5880 6.8.3
// requires), detection time (the peer's multiplier times the agreed interval), and
// AdminDown when it is removed. Packets go to UDP port 3784 from a source port in
// 49152-65535 with TTL (hop limit) 255, and only packets that arrive with 255 are
// taken (GTSM, RFC 5881 5): no sender further than the link can reach a session.
// Authentication is not spoken (a packet with the A bit is dropped, AuthError);
// demand mode and the echo function are not either.
package bfd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Port is the UDP port of single-hop BFD control packets (RFC 5881 4).
const Port = 3784

// Source ports of the sessions (RFC 5881 4).
const (
	minSourcePort = 49152
	maxSourcePort = 65535
)

// Params are a session's timers.
type Params struct {
	// MinTx is the desired interval between the packets sent once the session is
	// Up (before, one a second).
	MinTx time.Duration
	// MinRx is the shortest interval between received packets this side accepts.
	MinRx time.Duration
	// Multiplier: the peer takes the session Down after Multiplier of this side's
	// intervals without a packet (1..255).
	Multiplier int
}

// Check refuses parameters a session cannot run with.
func (p Params) Check() error {
	switch {
	case p.MinTx < time.Millisecond || p.MinTx > time.Minute:
		return fmt.Errorf("min_tx %v is outside 1ms..1m", p.MinTx)
	case p.MinRx < time.Millisecond || p.MinRx > time.Minute:
		return fmt.Errorf("min_rx %v is outside 1ms..1m", p.MinRx)
	case p.Multiplier < 1 || p.Multiplier > 255:
		return fmt.Errorf("multiplier %d is outside 1..255", p.Multiplier)
	}
	return nil
}

// Options are what a Speaker gets from its daemon.
type Options struct {
	// Logger receives the state changes. Default slog.Default().
	Logger *slog.Logger
	// OnState, when set, is called at each state change of a session, from that
	// session's goroutine; it must not block.
	OnState func(peer netip.Addr, from, to State, diag Diag)
	// ListenPort is where control packets are received. Default Port (3784); tests
	// of two speakers on one host set others.
	ListenPort uint16
	// PeerPort is where they are sent. Default Port.
	PeerPort uint16
}

// Speaker runs BFD sessions. Its methods may be called from any goroutine.
type Speaker struct {
	log     *slog.Logger
	onState func(netip.Addr, State, State, Diag)
	lport   uint16
	pport   uint16

	mu        sync.Mutex
	closed    bool
	listeners map[bool]*net.UDPConn // by IPv4
	sessions  map[netip.Addr]*session
	byDiscr   map[uint32]*session
	wg        sync.WaitGroup

	drops [numDrops]atomic.Uint64
}

// Reasons a received packet is dropped, as Drops names them.
const (
	dropTTL = iota
	dropMalformed
	dropAuth
	dropUnknown
	dropQueue
	numDrops
)

var dropNames = [numDrops]string{"ttl", "malformed", "auth", "unknown_session", "queue_full"}

// New returns a speaker with no session.
func New(opts Options) *Speaker {
	s := &Speaker{log: opts.Logger, onState: opts.OnState, lport: opts.ListenPort, pport: opts.PeerPort,
		listeners: map[bool]*net.UDPConn{}, sessions: map[netip.Addr]*session{}, byDiscr: map[uint32]*session{}}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.lport == 0 {
		s.lport = Port
	}
	if s.pport == 0 {
		s.pport = Port
	}
	return s
}

// session is one peer's: its socket, its state machine and its goroutine.
type session struct {
	peer, local netip.Addr
	discr       uint32 // this side's discriminator, f's localDiscr
	conn        *net.UDPConn
	dst         netip.AddrPort
	in          chan Packet
	stop        chan bool // true: say AdminDown first
	done        chan struct{}

	mu     sync.Mutex // guards f and the counters, for Sessions
	f      *fsm
	since  time.Time
	flaps  uint64
	rx, tx uint64
	params Params
}

// Add opens a session with peer from local (the invalid Addr: the kernel's source
// address towards peer now, or its choice for each packet while it has no route to
// peer), with p's timers. Its sockets are made before Add returns
// (in the network namespace of the calling thread). A session with peer already
// there is replaced when p or local differ.
func (s *Speaker) Add(peer, local netip.Addr, p Params) error {
	if err := p.Check(); err != nil {
		return fmt.Errorf("BFD session with %v: %w", peer, err)
	}
	peer = peer.Unmap()
	if !peer.IsValid() {
		return errors.New("BFD session: no peer address")
	}
	if !local.IsValid() {
		var err error
		if local, err = sourceFor(peer, s.pport); err != nil {
			// No route yet (an interface still down): the kernel picks the
			// source of each packet when there is one.
			local = netip.IPv4Unspecified()
			if peer.Is6() {
				local = netip.IPv6Unspecified()
			}
			s.log.Warn("BFD session: no source address towards the peer yet; sending from the kernel's choice", "peer", peer, "err", err)
		}
	}
	local = local.Unmap()
	if local.Is4() != peer.Is4() {
		return fmt.Errorf("BFD session with %v: local address %v is of another family", peer, local)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("BFD session: the speaker is closed")
	}
	old := s.sessions[peer]
	s.mu.Unlock()
	if old != nil {
		old.mu.Lock()
		same := old.params == p && old.local == local
		old.mu.Unlock()
		if same {
			return nil
		}
		s.Remove(peer)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("BFD session: the speaker is closed")
	}
	if err := s.listenLocked(peer.Is4()); err != nil {
		return err
	}
	conn, err := sendSocket(local)
	if err != nil {
		return fmt.Errorf("BFD session with %v: %w", peer, err)
	}
	discr := uint32(0)
	for discr == 0 || s.byDiscr[discr] != nil {
		discr = rand.Uint32()
	}
	ss := &session{peer: peer, local: local, discr: discr, conn: conn, dst: netip.AddrPortFrom(peer, s.pport),
		in: make(chan Packet, 16), stop: make(chan bool, 1), done: make(chan struct{}),
		f: newFSM(discr, p.MinTx, p.MinRx, uint8(p.Multiplier)), since: time.Now(), params: p}
	s.sessions[peer], s.byDiscr[discr] = ss, ss
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(ss)
	}()
	s.log.Info("BFD session opened", "peer", peer, "local", local, "min_tx", p.MinTx, "min_rx", p.MinRx, "multiplier", p.Multiplier)
	return nil
}

// Remove ends the session with peer, telling it AdminDown first (so that it is not
// taken for a failure); nothing without one.
func (s *Speaker) Remove(peer netip.Addr) {
	peer = peer.Unmap()
	s.mu.Lock()
	ss := s.sessions[peer]
	if ss != nil {
		delete(s.sessions, peer)
		delete(s.byDiscr, ss.discr)
	}
	s.mu.Unlock()
	if ss != nil {
		ss.stop <- true
		<-ss.done
	}
}

// Close ends every session, each telling its peer AdminDown, and closes the
// sockets.
func (s *Speaker) Close() { s.close(true) }

// close ends the speaker; admin false stops sending without a word, as a speaker
// that died would (tests).
func (s *Speaker) close(admin bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	sessions := slices.Collect(maps.Values(s.sessions))
	clear(s.sessions)
	clear(s.byDiscr)
	s.mu.Unlock()
	for _, ss := range sessions {
		ss.stop <- admin
	}
	for _, ss := range sessions {
		<-ss.done
	}
	s.mu.Lock()
	for _, l := range s.listeners {
		l.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// sourceFor is the kernel's source address towards peer.
func sourceFor(peer netip.Addr, port uint16) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, port)))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr(), nil
}

// sendSocket opens a session's socket: local with a free port of 49152-65535,
// TTL (hop limit) 255.
func sendSocket(local netip.Addr) (*net.UDPConn, error) {
	network := "udp4"
	if local.Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if local.Is4() {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, 255)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 255)
			}
		})
		return errors.Join(err, serr)
	}}
	start := minSourcePort + rand.IntN(maxSourcePort-minSourcePort+1)
	var last error
	for i := range 256 {
		port := minSourcePort + (start-minSourcePort+i*97)%(maxSourcePort-minSourcePort+1)
		c, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(local, uint16(port)).String())
		if err == nil {
			return c.(*net.UDPConn), nil
		}
		last = err
		if !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("opening a BFD socket on %v with a source port in %d-%d: %w", local, minSourcePort, maxSourcePort, last)
}

// listenLocked opens the family's receiving socket (port 3784 on every address,
// with the received TTL reported) unless it is open.
func (s *Speaker) listenLocked(v4 bool) error {
	if s.listeners[v4] != nil {
		return nil
	}
	network, addr := "udp6", netip.AddrPortFrom(netip.IPv6Unspecified(), s.lport)
	if v4 {
		network, addr = "udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), s.lport)
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if v4 {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
			}
		})
		return errors.Join(err, serr)
	}}
	c, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return fmt.Errorf("listening for BFD control packets on %v: %w", addr, err)
	}
	conn := c.(*net.UDPConn)
	s.listeners[v4] = conn
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.receive(conn, v4)
	}()
	return nil
}

// receive reads control packets until conn is closed, and hands each that passes
// GTSM and Decode to its session.
func (s *Speaker) receive(conn *net.UDPConn, v4 bool) {
	buf := make([]byte, 512)
	oob := make([]byte, 128)
	for {
		n, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("reading BFD control packets", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if ttl, ok := receivedTTL(oob[:oobn], v4); !ok || ttl != 255 {
			s.drops[dropTTL].Add(1)
			continue
		}
		p, err := Decode(buf[:n])
		if err != nil {
			var ae *AuthError
			if errors.As(err, &ae) {
				s.drops[dropAuth].Add(1)
			} else {
				s.drops[dropMalformed].Add(1)
			}
			continue
		}
		src := from.Addr().Unmap()
		s.mu.Lock()
		ss := s.sessions[src]
		if p.YourDiscr != 0 {
			ss = s.byDiscr[p.YourDiscr]
		}
		s.mu.Unlock()
		if ss == nil || ss.peer != src {
			s.drops[dropUnknown].Add(1)
			continue
		}
		select {
		case ss.in <- p:
		default:
			s.drops[dropQueue].Add(1)
		}
	}
}

// receivedTTL finds the TTL (hop limit) in a packet's control messages.
func receivedTTL(oob []byte, v4 bool) (int, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if len(m.Data) < 1 {
			continue
		}
		if (v4 && m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TTL) ||
			(!v4 && m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_HOPLIMIT) {
			if len(m.Data) >= 4 {
				return int(binary.NativeEndian.Uint32(m.Data)), true // an int
			}
			return int(m.Data[0]), true
		}
	}
	return 0, false
}

// run is a session's goroutine: it sends the periodic packets, takes the received
// ones, and watches the detection time, until stopped.
func (s *Speaker) run(ss *session) {
	defer close(ss.done)
	defer ss.conn.Close()
	tx := time.NewTimer(0) // the first packet at once
	defer tx.Stop()
	detect := time.NewTimer(time.Hour)
	detect.Stop()
	defer detect.Stop()
	buf := make([]byte, 0, HeaderLen)
	send := func(final bool) {
		ss.mu.Lock()
		p := ss.f.packet(final)
		ss.mu.Unlock()
		if _, err := ss.conn.WriteToUDPAddrPort(p.Append(buf[:0]), ss.dst); err != nil {
			s.log.Debug("sending a BFD control packet", "peer", ss.peer, "err", err)
			return
		}
		ss.mu.Lock()
		ss.tx++
		ss.mu.Unlock()
	}
	// schedule sets the time to the next periodic packet; while the peer wants
	// none, it looks again a second later.
	schedule := func() {
		ss.mu.Lock()
		iv := ss.f.txInterval()
		ss.mu.Unlock()
		if iv == 0 {
			iv = slowTx
		}
		tx.Reset(iv)
	}
	changed := func(before State) {
		ss.mu.Lock()
		after, diag := ss.f.state, ss.f.diag
		if after != before {
			ss.since = time.Now()
			if before == StateUp {
				ss.flaps++
			}
		}
		ss.mu.Unlock()
		if after == before {
			return
		}
		level := slog.LevelInfo
		if before == StateUp {
			level = slog.LevelWarn
		}
		s.log.Log(context.Background(), level, "BFD session "+after.String(), "peer", ss.peer, "from", before.String(), "diag", diag.String())
		if s.onState != nil {
			s.onState(ss.peer, before, after, diag)
		}
		// A new state is told at once, not at the next periodic packet.
		send(false)
		schedule()
	}
	for {
		select {
		case admin := <-ss.stop:
			if admin {
				ss.mu.Lock()
				before := ss.f.state
				ss.f.adminDown()
				ss.since = time.Now()
				ss.mu.Unlock()
				send(false)
				send(false)
				if s.onState != nil && before != StateAdminDown {
					s.onState(ss.peer, before, StateAdminDown, DiagAdminDown)
				}
			}
			return
		case p := <-ss.in:
			ss.mu.Lock()
			final, before := ss.f.receive(p)
			dt := ss.f.detectTime()
			ss.rx++
			ss.mu.Unlock()
			if dt > 0 {
				detect.Reset(dt)
			}
			if final {
				send(true)
			}
			changed(before)
		case <-tx.C:
			send(false)
			schedule()
		case <-detect.C:
			ss.mu.Lock()
			before := ss.f.expire()
			ss.mu.Unlock()
			changed(before)
		}
	}
}

// SessionStatus is one session, as Sessions reports it.
type SessionStatus struct {
	Peer  netip.Addr `json:"peer"`
	Local netip.Addr `json:"local"`
	// State is admin_down, down, init or up; RemoteState the peer's, from its last
	// packet.
	State       string `json:"state"`
	RemoteState string `json:"remote_state"`
	// Diag is why the session last went down (none while it never did).
	Diag string `json:"diag"`
	// Since is when the session entered State.
	Since       time.Time `json:"since"`
	LocalDiscr  uint32    `json:"local_discr"`
	RemoteDiscr uint32    `json:"remote_discr"`
	// MinTxMs, MinRxMs and Multiplier are the configured timers; TxIntervalMs is
	// the DesiredMinTx now advertised (1 s before Up) and DetectTimeMs the time
	// without a packet after which this side takes the session down (0 before the
	// peer's first packet).
	MinTxMs      float64 `json:"min_tx_ms"`
	MinRxMs      float64 `json:"min_rx_ms"`
	Multiplier   int     `json:"multiplier"`
	TxIntervalMs float64 `json:"tx_interval_ms"`
	DetectTimeMs float64 `json:"detect_time_ms"`
	// Flaps counts the times the session left Up; RxPackets and TxPackets the
	// control packets taken and sent.
	Flaps     uint64 `json:"flaps"`
	RxPackets uint64 `json:"rx_packets"`
	TxPackets uint64 `json:"tx_packets"`
}

// Up reports whether the session is Up.
func (st SessionStatus) Up() bool { return st.State == StateUp.String() }

// Sessions reports the sessions, by peer address.
func (s *Speaker) Sessions() []SessionStatus {
	s.mu.Lock()
	sessions := slices.Collect(maps.Values(s.sessions))
	s.mu.Unlock()
	slices.SortFunc(sessions, func(a, b *session) int { return a.peer.Compare(b.peer) })
	out := make([]SessionStatus, 0, len(sessions))
	for _, ss := range sessions {
		ss.mu.Lock()
		f := ss.f
		out = append(out, SessionStatus{
			Peer: ss.peer, Local: ss.local, State: f.state.String(), RemoteState: f.remoteState.String(),
			Diag: f.diag.String(), Since: ss.since, LocalDiscr: f.localDiscr, RemoteDiscr: f.remoteDiscr,
			MinTxMs: ms(ss.params.MinTx), MinRxMs: ms(ss.params.MinRx), Multiplier: ss.params.Multiplier,
			TxIntervalMs: ms(f.advertisedTx), DetectTimeMs: ms(f.detectTime()),
			Flaps: ss.flaps, RxPackets: ss.rx, TxPackets: ss.tx,
		})
		ss.mu.Unlock()
	}
	return out
}

// Session reports the session with peer, if there is one.
func (s *Speaker) Session(peer netip.Addr) (SessionStatus, bool) {
	for _, st := range s.Sessions() {
		if st.Peer == peer.Unmap() {
			return st, true
		}
	}
	return SessionStatus{}, false
}

// Drops counts the received packets dropped, by reason: ttl (not 255: GTSM),
// malformed, auth (authentication is not spoken), unknown_session, queue_full.
func (s *Speaker) Drops() map[string]uint64 {
	m := make(map[string]uint64, numDrops)
	for i := range s.drops {
		m[dropNames[i]] = s.drops[i].Load()
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
