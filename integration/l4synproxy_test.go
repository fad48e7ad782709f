package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/testkit/synflood"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The SYN proxy test's network is l4Single's with N = 90 (198.19.90.0/24 and
// 2001:db8:90::/64 outside, 198.19.91.0/24 inside, spoofed sources from
// 198.19.92.0/24, VIPs 203.0.113.90 and 2001:db8:cafe:90::10); its member,
// 198.19.91.11, is the tunnel endpoint and HTTP servers on the VIP (port 80 proxied,
// 81 not).
//
// The L7 node is the tunnel endpoint (in the test process) and plain kernel listeners,
// so what is measured is the LD and two Linux TCP stacks.
const (
	pxVIP      = "203.0.113.90"
	pxVIP6     = "2001:db8:cafe:90::10"
	pxClient   = "198.19.90.1"
	pxSpoofed  = "198.19.92.0/24"
	pxBigBytes = 32 << 20
)

// pxConns are the L7 node's accepted connections by the client's address and port.
var (
	pxConnsMu sync.Mutex
	pxConns   = map[string]net.Conn{}
)

// tcpInfo returns the TCP_INFO options of c (TCPI_OPT_*) and its window scales:
// the one it sends with (the peer's) and the one it receives with (its own).
func tcpInfo(t *testing.T, c net.Conn) (opts, snd, rcv uint8) {
	t.Helper()
	sc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	cerr := sc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if cerr != nil || err != nil {
		t.Fatalf("TCP_INFO: %v %v", cerr, err)
	}
	// tcpi_snd_wscale:4 and tcpi_rcv_wscale:4 share the byte after tcpi_options,
	// which the Go struct leaves as padding.
	ws := (*[8]byte)(unsafe.Pointer(info))[6]
	return info.Options, ws & 0x0f, ws >> 4
}

// pxPattern is the byte at offset i of a download.
func pxPattern(i int) byte { return byte(i*7 + i>>12) }

// TestL4SynProxy: with synproxy on, a real Linux client (curl, Go's net/http)
// connects through l4d to a kernel listener, the LD answering the SYN, over IPv4 and
// IPv6; the proxied connection negotiates timestamps, SACK and window scaling end to
// end (the L7 node's scale differing from the LD's), a large
// download through it is intact and about as fast as through an unproxied rule; a
// bounded spoofed SYN flood is answered by the LD alone (no flood packet reaches the
// L7 node) while real clients still connect and an established connection goes on.
func TestL4SynProxy(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireCommand(t, "curl", "curl")
	testenv.RequireCommand(t, "nft", "nftables")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)

	s := newL4Single(t, "px", 90)
	cl, ld, l7 := s.cl, s.ld, s.m
	cl.MustRun("ip", "-6", "addr", "add", "2001:db8:90::1/64", "dev", "c0", "nodad")
	cl.MustRun("ip", "-6", "route", "add", "2001:db8:cafe:90::/64", "via", "2001:db8:90::2")
	s.External6 = `addr6: "2001:db8:90::2/64", gateway6: "2001:db8:90::1"`
	// The L7 node: the tunnel endpoint and HTTP servers on the VIP.
	s.tunnel("tgpx0", pxVIP, pxVIP6)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		buf := make([]byte, 64<<10)
		for off := 0; off < n; off += len(buf) {
			m := min(len(buf), n-off)
			for i := range m {
				buf[i] = pxPattern(off + i)
			}
			if _, err := w.Write(buf[:m]); err != nil {
				return
			}
		}
	})
	for _, addr := range []string{pxVIP + ":80", pxVIP + ":81", "[" + pxVIP6 + "]:80"} {
		ln := l7.Listen(addr)
		srv := &http.Server{Handler: handler, ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateNew {
				pxConnsMu.Lock()
				pxConns[c.RemoteAddr().String()] = c
				pxConnsMu.Unlock()
			}
		}}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	// What of the flood reaches the L7 node's stack.
	l7.MustRun("nft", "add table inet pxtest")
	l7.MustRun("nft", "add chain inet pxtest in { type filter hook input priority 0 ; }")
	l7.MustRun("nft", "add rule inet pxtest in ip saddr "+pxSpoofed+" counter")
	l7.MustRun("nft", "add rule inet pxtest in tcp flags & (syn|ack) == syn counter")

	l4d, ldHTTP := s.start(bin, `
synproxy: {secret: "integration test", wscale: 7}
rules:
  - {name: proxied, vip: "`+pxVIP+`", protocol: tcp, port: 80, pool: l7, synproxy: "on"}
  - {name: plain, vip: "`+pxVIP+`", protocol: tcp, port: 81, pool: l7}
  - {name: proxied6, vip: "`+pxVIP6+`", protocol: tcp, port: 80, pool: l7, synproxy: "on"}
pools:
  l7:
    members: [{name: n1, address: "198.19.91.11"}]
    health: {type: none}
`)
	metric := func(name string, filters ...string) float64 {
		return scrapeWith(ldHTTP, "http://127.0.0.1:9180/metrics", name, filters...)
	}
	nftCount := func(match string) int {
		out := l7.MustRun("nft", "list chain inet pxtest in")
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, match) {
				f := strings.Fields(line)
				for i := range f {
					if f[i] == "packets" && i+1 < len(f) {
						n, _ := strconv.Atoi(f[i+1])
						return n
					}
				}
			}
		}
		t.Fatalf("no counter %q in:\n%s", match, out)
		return 0
	}

	// 1. curl, a real Linux client, through both rules.
	for _, hp := range []string{pxVIP + ":81", pxVIP + ":80", "[" + pxVIP6 + "]:80"} {
		waitFor(t, 20*time.Second, "curl through "+hp, func() bool {
			out, err := cl.Run("curl", "-sS", "-g", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://"+hp+"/?n=10")
			return err == nil && out == "200"
		})
	}
	waitFor(t, 5*time.Second, "the proxy's counters (published every 100 ms)", func() bool {
		return metric("tiergate_l4_synproxy_cookies_total", `result="sent"`) >= 1 && metric("tiergate_l4_synproxy_connections_total") >= 1
	})
	// New connections, one request each: the request that follows the client's ACK
	// is held while the L7 node answers, not dropped.
	wait0 := metric("tiergate_l4_packets_total", `dir="in"`, `result="synproxy_wait"`)
	conns0 := metric("tiergate_l4_synproxy_connections_total")
	for _, port := range []string{"81", "80"} {
		var times []string
		for range 5 {
			out, err := cl.Run("curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{time_total}", "http://"+pxVIP+":"+port+"/?n=10")
			if err != nil {
				t.Fatalf("curl through port %s: %v: %s", port, err, out)
			}
			times = append(times, out)
		}
		t.Logf("curl through port %s, seconds per new connection and request: %v", port, times)
	}
	// The drops are published with the connections: wait for these.
	waitFor(t, 5*time.Second, "the five proxied connections counted", func() bool {
		return metric("tiergate_l4_synproxy_connections_total") >= conns0+5
	})
	if w := metric("tiergate_l4_packets_total", `dir="in"`, `result="synproxy_wait"`) - wait0; w != 0 {
		t.Errorf("%v packets of new proxied connections dropped while their L7 node answered", w)
	}

	// 2. Large downloads, intact, through each rule in turn; the best of each.
	hc := nsClient(cl, nil, true)
	hc.Timeout = 60 * time.Second
	download := func(hp string, size int) float64 {
		start := time.Now()
		resp, err := hc.Get("http://" + hp + "/?n=" + strconv.Itoa(size))
		if err != nil {
			t.Fatalf("download through %s: %v\nl4d:\n%s", hp, err, l4d.logTail())
		}
		defer resp.Body.Close()
		buf := make([]byte, 256<<10)
		off := 0
		for {
			n, err := resp.Body.Read(buf)
			for i := range n {
				if buf[i] != pxPattern(off+i) {
					t.Fatalf("download through %s: byte %d is %#x, want %#x", hp, off+i, buf[i], pxPattern(off+i))
				}
			}
			off += n
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("download through %s after %d bytes: %v", hp, off, err)
			}
		}
		if off != size {
			t.Fatalf("download through %s: %d bytes, want %d", hp, off, size)
		}
		return float64(off) / time.Since(start).Seconds() / 1e6
	}
	// Rounds go on (four at most) while the best figures are below the ratio
	// asserted: on a shared machine one round can be slowed by others' work.
	var best [2]float64
	var ratio float64
	rounds := 0
	for rounds < 2 || ratio < 0.5 && rounds < 4 {
		rounds++
		for i, port := range []string{"81", "80"} {
			best[i] = max(best[i], download(pxVIP+":"+port, pxBigBytes))
		}
		ratio = best[1] / best[0]
	}
	t.Logf("download of %d MB: unproxied %.0f MB/s, proxied %.0f MB/s, ratio %.2f (best of %d each, on a shared machine)",
		pxBigBytes>>20, best[0], best[1], ratio, rounds)
	if ratio < 0.5 {
		t.Errorf("a proxied download is %.2f times as fast as an unproxied one, want ≥ 0.5", ratio)
	}
	t.Logf("download of 8 MB over IPv6 through the proxy: %.0f MB/s", download("["+pxVIP6+"]:80", 8<<20))

	// 3. A proxied connection as each end's kernel sees it, over each family:
	// timestamps, SACK and window scaling on, with the scale each side advertised.
	for _, hp := range []string{pxVIP + ":80", "[" + pxVIP6 + "]:80"} {
		var c net.Conn
		cl.MustDo(func() error {
			var err error
			c, err = net.DialTimeout("tcp", hp, 5*time.Second)
			return err
		})
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /?n=%d HTTP/1.1\r\nHost: px\r\n\r\n", 4<<20); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("request on the proxied connection to %s: %v", hp, err)
		}
		if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != 4<<20 {
			t.Fatalf("response on the proxied connection to %s: %d bytes, %v", hp, n, err)
		}
		var server net.Conn
		waitFor(t, 5*time.Second, "the L7 node's side of the connection", func() bool {
			pxConnsMu.Lock()
			defer pxConnsMu.Unlock()
			server = pxConns[c.LocalAddr().String()]
			return server != nil
		})
		cOpts, cSnd, cRcv := tcpInfo(t, c)
		sOpts, sSnd, sRcv := tcpInfo(t, server)
		t.Logf("proxied connection to %s: client options %#x wscale snd %d rcv %d; L7 node options %#x wscale snd %d rcv %d", hp, cOpts, cSnd, cRcv, sOpts, sSnd, sRcv)
		const tsSACKWScale = 1 | 2 | 4 // TCPI_OPT_TIMESTAMPS, TCPI_OPT_SACK, TCPI_OPT_WSCALE
		if cOpts&tsSACKWScale != tsSACKWScale || sOpts&tsSACKWScale != tsSACKWScale {
			t.Errorf("%s: timestamps, SACK and window scaling not all on: client %#x, L7 node %#x", hp, cOpts, sOpts)
		}
		if cSnd != 7 || sSnd != cRcv {
			t.Errorf("%s: window scales: the client sends with %d (the LD advertised 7), the L7 node with %d (the client advertised %d)", hp, cSnd, sSnd, cRcv)
		}
	}

	// 4. A bounded spoofed SYN flood against the proxied rule. The established
	// connection goes on and real clients connect while it lasts; no flood packet
	// reaches the L7 node.
	synsBefore := nftCount("flags")
	sent0 := metric("tiergate_l4_synproxy_cookies_total", `result="sent"`)
	out := ld.MustRun("ip", "-br", "link", "show", "x0")
	mac, err := net.ParseMAC(strings.Fields(out)[2])
	if err != nil {
		t.Fatalf("x0's MAC from %q: %v", out, err)
	}
	const floodN = 20000
	floodCtx, stopFlood := context.WithCancel(context.Background())
	floodDone := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, err := synflood.Run(floodCtx, synflood.Config{Iface: "c0", Netns: cl.Path(), DstMAC: [6]byte(mac),
			Sources: netip.MustParsePrefix(pxSpoofed), Dst: netip.MustParseAddrPort(pxVIP + ":80"),
			Count: floodN, Rate: 5000, Duration: 10 * time.Second, Batch: 8})
		floodDone <- err
	}()
	t.Cleanup(func() { stopFlood(); <-floodDone })
	waitFor(t, 5*time.Second, "the flood to reach the LD", func() bool {
		return metric("tiergate_l4_synproxy_cookies_total", `result="sent"`)-sent0 > 500
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := nsClient(cl, nil, false)
			c.Timeout = 8 * time.Second
			resp, err := c.Get(fmt.Sprintf("http://%s:80/?n=%d", pxVIP, 1000+i))
			if err == nil {
				var b bytes.Buffer
				_, err = io.Copy(&b, resp.Body)
				resp.Body.Close()
				if err == nil && b.Len() != 1000+i {
					err = fmt.Errorf("%d bytes", b.Len())
				}
			}
			if err != nil {
				mu.Lock()
				failures = append(failures, err.Error())
				mu.Unlock()
			}
		}()
		time.Sleep(50 * time.Millisecond)
	}
	for range 5 {
		resp, err := hc.Get("http://" + pxVIP + ":80/?n=100000")
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil {
			mu.Lock()
			failures = append(failures, "established connection: "+err.Error())
			mu.Unlock()
		}
	}
	wg.Wait()
	if err := <-floodDone; err != nil && err != context.Canceled {
		t.Fatalf("flood: %v", err)
	}
	floodDone <- nil // for the cleanup
	var sent float64
	waitFor(t, 5*time.Second, "the LD's answers to half the flood at least", func() bool {
		sent = metric("tiergate_l4_synproxy_cookies_total", `result="sent"`) - sent0
		return sent >= floodN/2
	})
	spoofedAtL7 := nftCount(pxSpoofed)
	syns := nftCount("flags") - synsBefore
	t.Logf("flood of %d spoofed SYNs: the LD answered %v; the L7 node saw %d packets from the spoofed sources and %d SYNs (the real clients'); %d connections in the LD's table",
		floodN, sent, spoofedAtL7, syns, int(metric("tiergate_l4_connections")))
	if len(failures) > 0 {
		t.Errorf("%d requests failed during the flood: %v\nl4d:\n%s", len(failures), failures, l4d.logTail())
	}
	if spoofedAtL7 != 0 {
		t.Errorf("%d packets from the spoofed sources reached the L7 node", spoofedAtL7)
	}
	if syns > 40 {
		t.Errorf("the L7 node saw %d SYNs during the flood, want only the 20 real clients'", syns)
	}
}
