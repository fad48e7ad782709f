package integration

import (
	"context"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/synflood"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The overload test's network is l4Single's with N = 70 (198.19.70.0/24 outside,
// 198.19.71.0/24 inside, VIPs 203.0.113.70 and .71); its member, 198.19.71.11, is the
// tunnel endpoint and TCP listeners on the VIPs.
//
// The L7 node runs the tunnel endpoint in the test process and plain TCP listeners,
// so a connection costs a handshake in the kernels and nothing more.
const (
	ovVIPA   = "203.0.113.70"
	ovVIPB   = "203.0.113.71"
	ovClient = "198.19.70.1"
)

// TestL4OverloadProtection: a spoofed SYN flood against one VIP, bounded and at twice
// the LD's configured capacity (a low one: 1,000 packets per second), makes the LD
// protect itself: that VIP's new connections are held to a quota while a real
// client's connections to the other VIP all succeed at their rate; the quotas are
// lifted when the flood ends. Before it, a rule's static limit of 3 concurrent
// connections refuses a fourth.
func TestL4OverloadProtection(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)

	s := newL4Single(t, "ov", 70)
	cl, ld, l7 := s.cl, s.ld, s.m
	s.tunnel("tgov0", ovVIPA, ovVIPB)
	for _, a := range []string{ovVIPA + ":80", ovVIPA + ":81", ovVIPB + ":80"} {
		ln := l7.Listen(a)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(io.Discard, c); c.Close() }()
			}
		}()
	}

	l4d, ldHTTP := s.start(bin, `
overload:
  capacity_pps: 1000     # low, so that a small bounded flood passes the watermark
  signals: [pps]         # not the busy share: the machine running the test is shared
  interval: 200ms
  hold: 1s
  min_quota: 1
  share_window: 2s       # rule b's rate before the surge is learnt in the calm phase
  keep_share: 3          # and keeps three times it while protecting, whatever the budget
rules:
  - {name: a, vip: "`+ovVIPA+`", protocol: tcp, port: 80, pool: l7}
  - {name: b, vip: "`+ovVIPB+`", protocol: tcp, port: 80, pool: l7}
  - {name: capped, vip: "`+ovVIPA+`", protocol: tcp, port: 81, pool: l7, limits: {max_conns: 3}}
pools:
  l7:
    members: [{name: n1, address: "198.19.71.11"}]
    health: {type: none}
`)
	metric := func(name string, filters ...string) float64 {
		return scrapeWith(ldHTTP, "http://127.0.0.1:9180/metrics", name, filters...)
	}
	dial := func(addr string, timeout time.Duration) (net.Conn, error) {
		var c net.Conn
		err := cl.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", addr, timeout)
			return err
		})
		return c, err
	}
	waitFor(t, 20*time.Second, "a first connection through the LD", func() bool {
		c, err := dial(ovVIPB+":80", time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// 1. A static limit: three connections held open to rule capped, the fourth refused.
	var held []net.Conn
	for i := range 3 {
		c, err := dial(ovVIPA+":81", 3*time.Second)
		if err != nil {
			t.Fatalf("connection %d of 3 to the capped rule: %v\nl4d:\n%s", i+1, err, l4d.logTail())
		}
		held = append(held, c)
	}
	if c, err := dial(ovVIPA+":81", 1500*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("a fourth connection to a rule with max_conns 3 was made")
	}
	waitFor(t, 5*time.Second, "the capped rule's rule_limit drops", func() bool {
		return metric("tiergate_l4_rule_limited_total", `rule="capped"`, `reason="rule_limit"`) >= 1
	})
	for _, c := range held {
		c.Close()
	}

	// clientRun connects to rule b 20 times a second for d (each connection closed at
	// once; a dial may take up to 3 s, so a SYN lost on the way is sent again) and
	// returns the attempts and the failures.
	clientRun := func(d time.Duration) (tries, failed int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		start := time.Now()
		for i := 0; time.Since(start) < d; i++ {
			wg.Add(1)
			tries++
			go func() {
				defer wg.Done()
				c, err := dial(ovVIPB+":80", 3*time.Second)
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					return
				}
				c.Close()
			}()
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * 50 * time.Millisecond)))
		}
		wg.Wait()
		return tries, failed
	}

	// 2. Calm: rule b alone is far below the watermark; the LD learns its rate.
	if tries, failed := clientRun(4 * time.Second); failed != 0 {
		t.Fatalf("calm: %d of %d connections to rule b failed", failed, tries)
	}
	if s := metric("tiergate_l4_overload_state"); s != 0 {
		t.Fatalf("tiergate_l4_overload_state %v before any surge", s)
	}

	// 3. The surge: spoofed SYNs to rule a at 1,000/s (bounded: 15 s at most), which with
	// the L7 node's SYN-ACKs is twice the capacity.
	out := ld.MustRun("ip", "-br", "link", "show", "x0")
	mac, err := net.ParseMAC(strings.Fields(out)[2])
	if err != nil {
		t.Fatalf("x0's MAC from %q: %v", out, err)
	}
	floodCtx, stopFlood := context.WithCancel(context.Background())
	floodDone := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, err := synflood.Run(floodCtx, synflood.Config{Iface: "c0", Netns: cl.Path(), DstMAC: [6]byte(mac),
			Sources: netip.MustParsePrefix("198.19.72.0/24"), Dst: netip.MustParseAddrPort(ovVIPA + ":80"),
			Count: 15000, Rate: 1000, Duration: 15 * time.Second, Batch: 4})
		floodDone <- err
	}()
	t.Cleanup(func() { stopFlood(); <-floodDone })
	waitFor(t, 8*time.Second, "overload protection to start", func() bool {
		return metric("tiergate_l4_overload_state") == 1
	})
	// Let the quotas settle, then measure both rules over three seconds.
	time.Sleep(time.Second)
	newA0 := metric("tiergate_l4_rule_new_flows_total", `rule="a"`)
	quotaA0 := metric("tiergate_l4_rule_limited_total", `rule="a"`, `reason="overload_quota"`)
	tries, failed := clientRun(3 * time.Second)
	newA := metric("tiergate_l4_rule_new_flows_total", `rule="a"`) - newA0
	quotaA := metric("tiergate_l4_rule_limited_total", `rule="a"`, `reason="overload_quota"`) - quotaA0
	quotaB := metric("tiergate_l4_rule_limited_total", `rule="b"`, `reason="overload_quota"`)
	state := metric("tiergate_l4_overload_state")
	stopFlood()
	if err := <-floodDone; err != nil && err != context.Canceled {
		t.Fatalf("flood: %v", err)
	}
	floodDone <- nil // for the cleanup
	t.Logf("while protecting: rule a %v SYNs admitted, %v over quota; rule b %d of %d connections made; quotas a %v b %v",
		newA, quotaA, tries-failed, tries,
		metric("tiergate_l4_rule_quota", `rule="a"`, `kind="connections"`), metric("tiergate_l4_rule_quota", `rule="b"`, `kind="connections"`))
	if state != 1 {
		t.Fatalf("protection ended while the flood went on (state %v)", state)
	}
	// Every connection to rule b is made (a dial waits for the kernel's SYN
	// retransmissions); hardly any of its SYNs is over quota (a goroutine stall that
	// bunches the client's dials past its bucket's second's worth could make one).
	if failed != 0 || quotaB > 2 {
		t.Fatalf("rule b lost connections while rule a surged: %d of %d failed, %v SYNs over quota", failed, tries, quotaB)
	}
	if quotaA < 0.3*(newA+quotaA) {
		t.Fatalf("rule a's surge was not throttled: %v SYNs admitted, %v over quota", newA, quotaA)
	}

	// 4. The flood over, the quotas are lifted after the hold.
	waitFor(t, 10*time.Second, "overload protection to end", func() bool {
		return metric("tiergate_l4_overload_state") == 0
	})
	if tries, failed := clientRun(500 * time.Millisecond); failed != 0 {
		t.Fatalf("after the surge: %d of %d connections to rule b failed", failed, tries)
	}
	if p := metric("tiergate_l4_overload_protections_total"); p != 1 {
		t.Errorf("tiergate_l4_overload_protections_total %v, want 1", p)
	}
}
