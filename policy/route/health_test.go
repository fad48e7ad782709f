package route

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// flakyServer is a real HTTP server on 127.0.0.1 whose health endpoint answers
// status, counting the checks it answers with each.
type flakyServer struct {
	*httptest.Server
	status       atomic.Int32
	good, bad    atomic.Int32
	lastHost     atomic.Value
	lastPath     atomic.Value
	healthChecks atomic.Int32
}

func newFlakyServer(t *testing.T) *flakyServer {
	s := &flakyServer{}
	s.status.Store(200)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.healthChecks.Add(1)
		s.lastHost.Store(r.Host)
		s.lastPath.Store(r.URL.Path)
		st := int(s.status.Load())
		if st == 200 {
			s.good.Add(1)
		} else {
			s.bad.Add(1)
		}
		w.WriteHeader(st)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *flakyServer) addr() string { return s.Listener.Addr().String() }

func TestActiveHTTPCheck(t *testing.T) {
	flaky, steady := newFlakyServer(t), newFlakyServer(t)
	r := newTestRouter(t)
	mustApply(t, r, poolOnly(Pool{
		Name:    "p",
		Members: members(flaky.addr(), steady.addr()),
		HealthCheck: &HealthCheck{
			Path: "/healthz", Host: "health.example", Interval: Duration(20 * time.Millisecond),
			UnhealthyThreshold: 2, HealthyThreshold: 3,
		},
	}))
	b := r.Table().Pool("p")
	m := b.Members()[0]
	eventually(t, 2*time.Second, "first checks", func() bool { return flaky.good.Load() >= 2 })
	if !m.Healthy() || !m.Up() {
		t.Fatal("member down while its checks pass")
	}
	if h, p := flaky.lastHost.Load(), flaky.lastPath.Load(); h != "health.example" || p != "/healthz" {
		t.Errorf("check sent Host %v path %v", h, p)
	}

	flaky.status.Store(500)
	eventually(t, 2*time.Second, "member down after failing checks", func() bool { return !seenUp(b, m) })
	if m.Healthy() {
		t.Error("Pick skips a healthy member")
	}
	if n := flaky.bad.Load(); n < 2 {
		t.Errorf("down after %d failed checks, want 2", n)
	}
	// Requests go to the other member only.
	for range 50 {
		p, err := r.Pick("p", testIP, nil, nil)
		if err != nil || p.Addr() != steady.addr() {
			t.Fatalf("Pick while members[0] is down: %v, %v", p, err)
		}
		p.Done(Success)
	}

	flaky.good.Store(0)
	flaky.status.Store(200)
	eventually(t, 2*time.Second, "member back after passing checks", func() bool { return seenUp(b, m) })
	if n := flaky.good.Load(); n < 3 {
		t.Errorf("back after %d passed checks, want 3", n)
	}
	counts := pickCounts(t, b, 100, nil)
	if counts[flaky.addr()] != 50 {
		t.Errorf("after coming back: %v", counts)
	}

	// A server that is gone fails too (connection refused).
	flaky.Close()
	eventually(t, 2*time.Second, "member down when its server is gone", func() bool { return !m.Healthy() })
}

func TestActiveHTTPCheckExpectStatus(t *testing.T) {
	s := newFlakyServer(t)
	s.status.Store(204)
	r := newTestRouter(t)
	mustApply(t, r, poolOnly(Pool{
		Name: "p", Members: members(s.addr()),
		HealthCheck: &HealthCheck{ExpectStatus: []int{200}, Interval: Duration(15 * time.Millisecond), UnhealthyThreshold: 1},
	}))
	m := r.Table().Pool("p").Members()[0]
	eventually(t, 2*time.Second, "204 fails a check expecting 200", func() bool {
		_, err := r.Pick("p", testIP, nil, nil)
		return err == ErrNoHealthyMember
	})
	if m.Healthy() {
		t.Error("Pick finds no member, but the member is healthy")
	}
}

func TestActiveTCPCheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var accepted atomic.Int32
	serve := func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}
	go serve(ln)
	r := newTestRouter(t)
	mustApply(t, r, poolOnly(Pool{
		Name: "p", Members: members(addr),
		HealthCheck: &HealthCheck{Type: CheckTCP, Interval: Duration(20 * time.Millisecond), UnhealthyThreshold: 2, HealthyThreshold: 2},
	}))
	m := r.Table().Pool("p").Members()[0]
	eventually(t, 2*time.Second, "first TCP checks", func() bool { return accepted.Load() >= 2 })
	if !m.Healthy() {
		t.Fatal("down while accepting")
	}
	_ = ln.Close()
	eventually(t, 2*time.Second, "down with the listener closed", func() bool { return !m.Healthy() })

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	defer ln.Close()
	go serve(ln)
	eventually(t, 2*time.Second, "up with the listener back", func() bool { return m.Healthy() })
}

func TestPassiveEjection(t *testing.T) {
	cfg := poolOnly(Pool{
		Name:    "p",
		Members: members("192.0.2.1:80", "192.0.2.2:80", "192.0.2.3:80", "192.0.2.4:80"),
		PassiveEjection: &Ejection{
			ConsecutiveFailures: 3, EjectionTime: Duration(150 * time.Millisecond), MaxEjectedPercent: 50,
		},
	})
	r := newTestRouter(t)
	mustApply(t, r, cfg)
	b := r.Table().Pool("p")
	ms := b.Members()
	// pick returns a pick of member m.
	pick := func(m *Member) *Member {
		t.Helper()
		got, err := b.Pick(testIP, nil, func(x *Member) bool { return x != m })
		if err != nil || got != m {
			t.Fatalf("Pick %s: %v, %v", m.Addr(), got, err)
		}
		return got
	}

	// Failures interrupted by a success do not eject.
	for _, o := range []Outcome{ConnectFailure, Failure, Success, ConnectFailure, Failure, Canceled} {
		pick(ms[0]).Done(o)
	}
	if ms[0].Ejected() {
		t.Fatal("ejected without 3 failures in a row")
	}
	pick(ms[0]).Done(ConnectFailure)
	if !ms[0].Ejected() || ms[0].Up() {
		t.Fatal("not ejected after 3 failures in a row")
	}
	if ms[0].Outstanding() != 0 {
		t.Errorf("outstanding %d", ms[0].Outstanding())
	}
	for range 30 {
		m, err := b.Pick(testIP, nil, nil)
		if err != nil || m == ms[0] {
			t.Fatalf("Pick while members[0] is ejected: %v, %v", m, err)
		}
		m.Done(Success)
	}

	// At most half the pool: a second member may go, a third may not.
	for range 3 {
		pick(ms[1]).Done(Failure)
	}
	for range 5 {
		pick(ms[2]).Done(ConnectFailure)
	}
	if !ms[1].Ejected() || ms[2].Ejected() {
		t.Errorf("ejected: members[1] %v, members[2] %v; want true, false (50%% cap)", ms[1].Ejected(), ms[2].Ejected())
	}

	eventually(t, 2*time.Second, "back after the ejection time", func() bool { return seenUp(b, ms[0]) && seenUp(b, ms[1]) })
	counts := pickCounts(t, b, 400, nil)
	for _, m := range ms {
		if counts[m.Addr()] != 100 {
			t.Errorf("after the ejections: %v", counts)
			break
		}
	}
	// The count starts again from zero after an ejection.
	pick(ms[0]).Done(ConnectFailure)
	pick(ms[0]).Done(ConnectFailure)
	if ms[0].Ejected() {
		t.Error("ejected again after 2 failures")
	}
}

func TestPassiveEjectionConnectOnly(t *testing.T) {
	b := mustCompile(t, poolOnly(Pool{
		Name: "p", Members: members("192.0.2.1:80", "192.0.2.2:80"),
		PassiveEjection: &Ejection{ConsecutiveFailures: 2, ConnectFailuresOnly: true, EjectionTime: Duration(time.Hour)},
	})).Pool("p")
	m := b.Members()[0]
	only := func(x *Member) bool { return x != m }
	for range 5 {
		p, _ := b.Pick(testIP, nil, only)
		p.Done(Failure)
	}
	if m.Ejected() {
		t.Fatal("Failure counted with connect_failures_only")
	}
	for range 2 {
		p, _ := b.Pick(testIP, nil, only)
		p.Done(ConnectFailure)
	}
	if !m.Ejected() {
		t.Fatal("not ejected after 2 connection failures")
	}
}
