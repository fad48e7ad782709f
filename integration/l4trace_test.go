package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The trace test's network is l4Single's with N = 40 (198.19.40.0/23; the probe
// is the client, 198.19.40.1; l4d traces DSCP 46).
//
// The member is only an address: what the LD tunnels to it is not answered, which is
// all the test needs to see the LD's trace and drop points.
const (
	trVIP     = "203.0.113.40"
	trDSCP    = 46
	trLD      = "ld-trace-1"
	trProbe   = "198.19.40.1"
	trMember  = "198.19.41.11"
	trNoRule  = 4444
	trUDPPort = 7
)

// setTOS is a net.Dialer Control that marks a socket's packets with DSCP trDSCP.
func setTOS(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, trDSCP<<2)
	})
	if err != nil {
		return err
	}
	return serr
}

// TestL4Trace: a probe marked with the configured DSCP passes the LD: GET /trace
// reports its trace point with the LD's ID and the member it was tunnelled to; a
// marked SYN to a port with no rule is reported as a drop point (no_rule) with a
// sample of the packet; unmarked packets are not recorded; the metrics count both.
func TestL4Trace(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)

	s := newL4Single(t, "tr", 40)
	cl := s.cl

	l4d, ldHTTP := s.start(bin, fmt.Sprintf(`
rules:
  - {name: probe-udp, vip: "%s", protocol: udp, port: %d, pool: l7}
  - {name: probe-tcp, vip: "%s", protocol: tcp, port: 443, pool: l7}
pools:
  l7:
    members: [{name: m1, address: "%s"}]
    health: {type: none}
trace: {ld: %s, dscp: %d, records: 256}
`, trVIP, trUDPPort, trVIP, trMember, trLD, trDSCP))
	token := s.token()
	getTrace := func(query string) datapath.TraceReport {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://127.0.0.1:9180/trace"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := ldHTTP.Do(req)
		if err != nil {
			t.Fatalf("GET /trace%s: %v", query, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var rep datapath.TraceReport
		if resp.StatusCode != 200 || json.Unmarshal(b, &rep) != nil {
			t.Fatalf("GET /trace%s: %s: %s", query, resp.Status, b)
		}
		return rep
	}
	send := func(marked bool, network, addr string, payload string) {
		t.Helper()
		d := net.Dialer{Timeout: 300 * time.Millisecond}
		if marked {
			d.Control = setTOS
		}
		err := cl.Do(func() error {
			c, err := d.Dial(network, addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(payload))
			return err
		})
		if err != nil && network == "udp" {
			t.Fatalf("sending to %s: %v", addr, err)
		}
	}
	udpAddr := net.JoinHostPort(trVIP, fmt.Sprint(trUDPPort))

	// Unmarked datagrams first: forwarded (once the member is resolved), never recorded.
	waitFor(t, 20*time.Second, "an unmarked datagram forwarded to the member", func() bool {
		send(false, "udp", udpAddr, "unmarked")
		return scrapeWith(ldHTTP, "http://127.0.0.1:9180/metrics", "tiergate_l4_packets_total", `dir="in"`, `result="forwarded"`) > 0
	})
	if rep := getTrace(""); !rep.Enabled || rep.LD != trLD || len(rep.Points) != 0 {
		t.Fatalf("before any probe: enabled %v, ld %q, %d points: %+v", rep.Enabled, rep.LD, len(rep.Points), rep.Points)
	}

	// 1. The marked probe's path: the LD's trace point, tunnelled to m1.
	var tunnel datapath.TraceReport
	waitFor(t, 10*time.Second, "the probe's trace point", func() bool {
		send(true, "udp", udpAddr, "probe")
		tunnel = getTrace("?kind=trace&src=" + trProbe)
		return len(tunnel.Points) > 0
	})
	p := tunnel.Points[0]
	if p.LD != trLD || p.Action != "tunnel" || p.Direction != "in" || p.Member != "l7/m1" || p.MemberAddress != trMember ||
		p.Src != trProbe || p.Dst != trVIP || p.DstPort != trUDPPort || p.Protocol != "udp" {
		t.Errorf("the probe's trace point: %+v", p)
	}

	// 2. A marked SYN to a port with no rule: its drop point, with the reason and a
	// sample of the packet (IPv4 with TOS 0xb8).
	send(true, "tcp", net.JoinHostPort(trVIP, fmt.Sprint(trNoRule)), "")
	var drops datapath.TraceReport
	waitFor(t, 10*time.Second, "the drop point of the SYN to a port with no rule", func() bool {
		drops = getTrace("?reason=no_rule")
		return len(drops.Points) > 0
	})
	d := drops.Points[0]
	if d.Kind != "drop" || d.LD != trLD || d.Src != trProbe || d.DstPort != trNoRule || d.Protocol != "tcp" ||
		!strings.HasPrefix(d.Sample, fmt.Sprintf("45%02x", trDSCP<<2)) {
		t.Errorf("the drop point: %+v", d)
	}

	// Nothing unmarked was recorded.
	for _, p := range getTrace("?limit=1000").Points {
		if !strings.HasPrefix(p.Sample, fmt.Sprintf("45%02x", trDSCP<<2)) {
			t.Errorf("a point of an unmarked packet: %+v", p)
		}
	}
	metric := func(name string, filters ...string) float64 {
		return scrapeWith(ldHTTP, "http://127.0.0.1:9180/metrics", name, filters...)
	}
	waitFor(t, 5*time.Second, "the trace metrics", func() bool {
		return metric("tiergate_l4_trace_points_total", `ld="`+trLD+`"`, `direction="in"`) >= 1 &&
			metric("tiergate_l4_trace_drops_total", `reason="no_rule"`) >= 1
	})
	if t.Failed() {
		t.Logf("l4d:\n%s", l4d.logTail())
	}
}
