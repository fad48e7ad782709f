package bfd

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/testkit/bird"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Now()
}

type stateLog struct {
	mu     sync.Mutex
	events []string
}

func (l *stateLog) on(peer netip.Addr, from, to State, diag Diag) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf("%v %v>%v %v", peer, from, to, diag))
	l.mu.Unlock()
}

func (l *stateLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.events, s)
}

// TestSpeakers: two speakers on loopback (127.0.0.1 and 127.0.0.2, ports of their
// own) bring a session Up, each moves to its fast interval, and one that goes
// silent is taken Down by the other within its detection time; one removed says
// AdminDown, which the other takes for neighbor_down.
func TestSpeakers(t *testing.T) {
	a1, a2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var la, lb stateLog
	pa, pb := freeUDPPort(t), freeUDPPort(t)
	a := New(Options{ListenPort: pa, PeerPort: pb, OnState: la.on})
	b := New(Options{ListenPort: pb, PeerPort: pa, OnState: lb.on})
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	// Multipliers of 10: a loaded machine's stalls do not take the sessions down.
	params := Params{MinTx: 50 * time.Millisecond, MinRx: 50 * time.Millisecond, Multiplier: 10}
	if err := a.Add(a2, a1, params); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(a1, a2, Params{MinTx: 60 * time.Millisecond, MinRx: 60 * time.Millisecond, Multiplier: 10}); err != nil {
		t.Fatal(err)
	}
	up := func(s *Speaker, peer netip.Addr) bool {
		st, ok := s.Session(peer)
		return ok && st.Up()
	}
	waitFor(t, 10*time.Second, "both sessions up", func() bool { return up(a, a2) && up(b, a1) })
	// The poll to the fast intervals: a's detection time is b's multiplier (10)
	// times max(a's MinRx 50 ms, b's MinTx 60 ms).
	waitFor(t, 10*time.Second, "the fast intervals agreed", func() bool {
		st, _ := a.Session(a2)
		return st.DetectTimeMs == 600 && st.TxIntervalMs == 50
	})
	rx0 := must(a.Session(a2)).RxPackets
	time.Sleep(300 * time.Millisecond)
	if got := must(a.Session(a2)).RxPackets - rx0; got < 2 {
		t.Errorf("a received %d packets in 300 ms at b's 60 ms", got)
	}
	if !la.has("127.0.0.2 init>up none") && !la.has("127.0.0.2 down>up none") || !lb.has("127.0.0.1 init>up none") && !lb.has("127.0.0.1 down>up none") {
		t.Errorf("state changes: a %v, b %v", la.events, lb.events)
	}

	// b dies (no AdminDown): a takes the session Down within its detection time
	// (600 ms) and a margin for a loaded machine.
	silent := time.Now()
	b.close(false)
	took := waitFor(t, 5*time.Second, "a's session down", func() bool { return !up(a, a2) }).Sub(silent)
	t.Logf("a's session went down %v after b fell silent (detection time 600ms)", took.Round(time.Millisecond))
	if took > 2600*time.Millisecond {
		t.Errorf("a's session went down %v after b fell silent: detection time 600ms", took)
	}
	if st := must(a.Session(a2)); st.Diag != "detect_expired" || st.Flaps < 1 || st.RemoteDiscr != 0 {
		t.Errorf("a after b's silence: %+v", st)
	}

	// b again; then a removes the session, saying AdminDown.
	var lc stateLog
	c := New(Options{ListenPort: pb, PeerPort: pa, OnState: lc.on})
	t.Cleanup(c.Close)
	if err := c.Add(a1, a2, params); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the session up again", func() bool { return up(a, a2) && up(c, a1) })
	a.Remove(a2)
	waitFor(t, 5*time.Second, "c's session down by AdminDown", func() bool { return lc.has("127.0.0.1 up>down neighbor_down") })
	if _, ok := a.Session(a2); ok {
		t.Error("a still has the session it removed")
	}
}

func must(st SessionStatus, ok bool) SessionStatus {
	if !ok {
		panic("no session")
	}
	return st
}

// freeUDPPort is a UDP port free on loopback now.
func freeUDPPort(t *testing.T) uint16 {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// TestGTSM: packets that arrive with a TTL below 255, or that are malformed,
// authenticated or of no session, are dropped and counted; none changes the
// session.
func TestGTSM(t *testing.T) {
	pa := freeUDPPort(t)
	s := New(Options{ListenPort: pa, PeerPort: freeUDPPort(t)})
	t.Cleanup(s.Close)
	peer := netip.MustParseAddr("127.0.0.1")
	if err := s.Add(peer, peer, Params{MinTx: time.Second, MinRx: time.Second, Multiplier: 3}); err != nil {
		t.Fatal(err)
	}
	send := func(ttl int, b []byte) {
		t.Helper()
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(pa)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, _ := c.SyscallConn()
		rc.Control(func(fd uintptr) { setTTL(t, fd, ttl) })
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	down := (&Packet{State: StateDown, DetectMult: 3, MyDiscr: 77, DesiredMinTx: time.Second, RequiredMinRx: time.Second}).Append(nil)
	send(64, down)
	send(255, down[:20])
	auth := append(append([]byte(nil), down...), 1, 5, 1, 'k', 'e')
	auth[1] |= flagAuth
	auth[3] = 29
	send(255, auth)
	send(255, (&Packet{State: StateUp, DetectMult: 3, MyDiscr: 77, YourDiscr: 12345, DesiredMinTx: time.Second}).Append(nil))
	want := map[string]uint64{"ttl": 1, "malformed": 1, "auth": 1, "unknown_session": 1, "queue_full": 0}
	waitFor(t, 5*time.Second, "the drops counted", func() bool {
		d := s.Drops()
		for k, v := range want {
			if d[k] != v {
				return false
			}
		}
		return true
	})
	if st := must(s.Session(peer)); st.RxPackets != 0 || st.State != "down" {
		t.Errorf("the session took a dropped packet: %+v", st)
	}
	// The same Down packet with TTL 255 is taken: the session goes Init.
	send(255, down)
	waitFor(t, 5*time.Second, "the session init", func() bool { return must(s.Session(peer)).State == "init" })
}

// TestBird: a speaker in a namespace of its own keeps a session Up with bird2 in
// the router's, whose static route via the speaker's address (with `bfd`) is in the
// router's kernel table while it is; when the speaker falls silent, bird drops the
// route within its detection time (5 x 100 ms: a multiplier a loaded machine keeps)
// and a margin.
func TestBird(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "bird", "bird2")
	rt, ld := netns.New(t, "bfdrt"), netns.New(t, "bfdld")
	netns.Veth(t, ld, "e0", rt, "e0")
	rt.Addr("e0", "198.19.53.1/24")
	ld.Addr("e0", "198.19.53.2/24")
	const prefix = "203.0.113.53/32"
	router := bird.Start(t, rt, bird.Config{RouterID: "198.19.53.1", Address: "198.19.53.1", AS: 65000,
		BFD:    &bird.BFD{MinRx: 100 * time.Millisecond, MinTx: 100 * time.Millisecond, Multiplier: 5},
		Static: []bird.Static{{Prefix: prefix, Via: "198.19.53.2", BFD: true}}})
	var s *Speaker
	params := Params{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 5}
	ld.MustDo(func() error {
		s = New(Options{})
		return s.Add(netip.MustParseAddr("198.19.53.1"), netip.Addr{}, params)
	})
	t.Cleanup(s.Close)
	routed := func() bool {
		gws, err := router.NextHops(prefix)
		return err == nil && len(gws) == 1 && gws[0] == "198.19.53.2"
	}
	waitFor(t, 20*time.Second, "the session up at both ends and the route in the router", func() bool {
		st, _ := s.Session(netip.MustParseAddr("198.19.53.1"))
		sessions, _ := router.BFDSessions()
		return st.Up() && sessions["198.19.53.2"] == "Up" && routed()
	})
	st, _ := s.Session(netip.MustParseAddr("198.19.53.1"))
	if st.Local != netip.MustParseAddr("198.19.53.2") {
		t.Errorf("local address %v", st.Local)
	}
	waitFor(t, 10*time.Second, "bird's 100 ms intervals agreed", func() bool {
		st, _ := s.Session(netip.MustParseAddr("198.19.53.1"))
		return st.DetectTimeMs == 500
	})
	// Up for a while: no flap.
	time.Sleep(time.Second)
	if st, _ := s.Session(netip.MustParseAddr("198.19.53.1")); !st.Up() || st.Flaps != 0 {
		t.Fatalf("the session flapped: %+v\n%s", st, router.LogTail())
	}
	silent := time.Now()
	s.close(false)
	gone := waitFor(t, 10*time.Second, "the route gone from the router", func() bool { return !routed() })
	took := gone.Sub(silent)
	t.Logf("bird dropped the route %v after the speaker fell silent (detection time 500ms)", took.Round(time.Millisecond))
	if took > 2500*time.Millisecond {
		t.Errorf("bird dropped the route %v after the speaker fell silent: detection time 500 ms", took)
	}
	if out, _ := router.Birdc("show", "bfd", "sessions"); !strings.Contains(out, "Down") {
		t.Errorf("bird's session is not down:\n%s", out)
	}
}

func setTTL(t *testing.T, fd uintptr, ttl int) {
	if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, ttl); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6: a session with an IPv6 peer takes a packet that arrives with hop limit
// 255 and drops one with 64.
func TestIPv6(t *testing.T) {
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	pa := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	c.Close()
	s := New(Options{ListenPort: pa, PeerPort: freeUDPPort(t)})
	t.Cleanup(s.Close)
	peer := netip.IPv6Loopback()
	if err := s.Add(peer, netip.Addr{}, Params{MinTx: time.Second, MinRx: time.Second, Multiplier: 3}); err != nil {
		t.Fatal(err)
	}
	send := func(hops int) {
		t.Helper()
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.IPv6loopback, Port: int(pa)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, _ := c.SyscallConn()
		rc.Control(func(fd uintptr) {
			if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, hops); err != nil {
				t.Fatal(err)
			}
		})
		if _, err := c.Write((&Packet{State: StateDown, DetectMult: 3, MyDiscr: 5, DesiredMinTx: time.Second, RequiredMinRx: time.Second}).Append(nil)); err != nil {
			t.Fatal(err)
		}
	}
	send(64)
	waitFor(t, 5*time.Second, "the hop limit drop counted", func() bool { return s.Drops()["ttl"] == 1 })
	send(255)
	waitFor(t, 5*time.Second, "the session init", func() bool { return must(s.Session(peer)).State == "init" })
	if st := must(s.Session(peer)); st.Local != peer || st.RemoteDiscr != 5 {
		t.Errorf("%+v", st)
	}
}

// TestNoRouteYet: a session with a peer the kernel has no route to yet (an
// interface still down) opens, sending from the kernel's choice.
func TestNoRouteYet(t *testing.T) {
	s := New(Options{ListenPort: freeUDPPort(t)})
	t.Cleanup(s.Close)
	ns := netip.MustParseAddr("198.19.55.1")
	var err error
	netns.New(t, "bfdnoroute").MustDo(func() error {
		err = s.Add(ns, netip.Addr{}, Params{MinTx: time.Second, MinRx: time.Second, Multiplier: 3})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := must(s.Session(ns)); !st.Local.IsUnspecified() || st.State != "down" {
		t.Errorf("%+v", st)
	}
}
