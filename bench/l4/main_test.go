package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestMainInMemory runs the whole program without DPDK on small numbers: the in-memory
// phases must forward packets, every check must pass, and the last line must be the
// JSON summary.
func TestMainInMemory(t *testing.T) {
	var s struct {
		EstablishedInMem *float64 `json:"l4_mpps_per_core_established_inmem"`
		Established      *float64 `json:"l4_mpps_per_core_established"`
		NewFlows         *float64 `json:"l4_new_flows_mpps_per_core"`
		BytesPerConn     *float64 `json:"l4_bytes_per_conn"`
		Table10M         *float64 `json:"l4_table_10m_mib"`
		Failures         []string `json:"failures"`
		BlacklistRatio   *float64 `json:"l4_mpps_with_1m_blacklist_ratio"`
		BlacklistInMem   *float64 `json:"l4_blacklist_ratio_inmem"`
		BlacklistEntries int      `json:"l4_blacklist_entries"`
		InMem            struct {
			NewFlows    phaseResult       `json:"new_flows"`
			FirstACK    phaseResult       `json:"first_ack_pass"`
			Established phaseResult       `json:"established"`
			Blacklist   *blacklistResults `json:"blacklist"`
		} `json:"inmem"`
		Table tableResult `json:"table"`
	}
	out := runMain(t, &s, "-phases", "table,forward", "-flows", "10000", "-duration", "200ms", "-table", "10000", "-quiet-wait", "0",
		"-blacklist", "20000", "-blacklist-rounds", "2", "-blacklist-duration", "200ms")
	if len(s.Failures) != 0 {
		t.Errorf("failures: %q", s.Failures)
	}
	if s.EstablishedInMem == nil || *s.EstablishedInMem <= 0 || s.NewFlows == nil || *s.NewFlows <= 0 {
		t.Errorf("in-memory figures missing: established %v, new flows %v", s.EstablishedInMem, s.NewFlows)
	}
	if s.Established != nil || s.Table10M != nil {
		t.Errorf("figures that were not measured are not null: %v %v", s.Established, s.Table10M)
	}
	if s.InMem.NewFlows.Packets != 10000 || s.InMem.FirstACK.Packets != 10000 || s.InMem.Established.Packets == 0 {
		t.Errorf("forwarded: %d new flows, %d first ACKs, %d established", s.InMem.NewFlows.Packets,
			s.InMem.FirstACK.Packets, s.InMem.Established.Packets)
	}
	// The blacklist rows: two rounds of three, 100 of the 10,000 clients listed in the
	// third row, their flows cut by the sweep and their packets dropped.
	if s.BlacklistRatio != nil || s.BlacklistInMem == nil || *s.BlacklistInMem <= 0 || s.BlacklistEntries != 20000 {
		t.Errorf("blacklist figures: 1M ratio %v (want null for a 20,000-entry list), in-memory ratio %v, entries %d",
			s.BlacklistRatio, s.BlacklistInMem, s.BlacklistEntries)
	}
	if bl := s.InMem.Blacklist; bl == nil || len(bl.Rounds) != 2 || bl.Listed != 100 || bl.Dropped == 0 {
		t.Errorf("blacklist rows: %+v", bl)
	} else {
		for i, rd := range bl.Rounds {
			// Later rounds cut the flows the listed clients' packets made again,
			// which a slow source may not have sent every one of.
			if rd.Without == nil || rd.With == nil || rd.Listed == nil || i == 0 && rd.FlowsRemoved != 100 ||
				rd.FlowsRemoved > 100 || rd.Ratio <= 0 {
				t.Errorf("blacklist round %d: %+v", i+1, rd)
			}
		}
	}
	if s.Table.Entries != 10000 || s.Table.EntrySize == 0 || s.BytesPerConn == nil || *s.BytesPerConn < float64(s.Table.EntrySize) {
		t.Errorf("table: %+v, bytes per connection %v", s.Table, s.BytesPerConn)
	}
	for _, want := range []string{"in-memory: established (ACK)", "target (issue 5)", "DPVS", "stands for the NIC's DMA",
		"in-memory: 20,000 entries, 100 clients listed", "(issue 14)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-flows", "0"},
		{"-flows", "10000001"},
		{"-table", "0"},
		{"-duration", "0s"},
		{"-veth-frames", "0"},
		{"-quiet-wait", "-1s"},
		{"-blacklist", "-1"},
		{"-blacklist-rounds", "0"},
		{"-blacklist-listed", "1.5"},
		{"-phases", "bogus"},
		{"-phases", ""},
		{"-defence-rounds", "0"},
		{"-defence-duration", "0s"},
		{"-bogus"},
		{"extra"},
	} {
		if code := Main(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%v: exit status %d, want 2", args, code)
		}
	}
}

// TestFrames checks every frame of small sets: it parses, its checksums verify, it is
// a SYN or a bare ACK from its own client to the VIP, and every flow appears once.
func TestFrames(t *testing.T) {
	dst, src := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2}
	const n = 70_000 // more than one /16 of clients: ports beyond the first
	for _, syn := range []bool{true, false} {
		set := buildFrames(n, syn, dst, src, 7)
		seen := make(map[netip.AddrPort]bool, n)
		for j := range set.n {
			f := set.frame(j)
			var p packet.Packet
			if err := packet.Parse(f, &p); err != nil {
				t.Fatalf("frame %d: %v", j, err)
			}
			if !packet.VerifyL4Checksum(f, &p) {
				t.Fatalf("frame %d: bad TCP checksum", j)
			}
			wantFlags := uint8(packet.TCPAck)
			if syn {
				wantFlags = packet.TCPSyn
			}
			if p.Proto != packet.ProtoTCP || p.Dst != vip || p.DstPort != vipPort || p.TCPFlags != wantFlags ||
				[6]byte(f[0:6]) != dst || [6]byte(f[6:12]) != src || p.End != len(f) {
				t.Fatalf("frame %d: %+v", j, p)
			}
			if !netip.MustParsePrefix("198.19.0.0/16").Contains(p.Src) {
				t.Fatalf("frame %d: client %v outside 198.19.0.0/16", j, p.Src)
			}
			k := netip.AddrPortFrom(p.Src, p.SrcPort)
			if seen[k] {
				t.Fatalf("frame %d: flow %v twice", j, k)
			}
			seen[k] = true
		}
		if len(f0(set)) != map[bool]int{true: synFrameLen, false: ackFrameLen}[syn] {
			t.Errorf("frame length %d", len(f0(set)))
		}
	}
	a, b := buildFrames(1000, false, dst, src, 1), buildFrames(1000, false, dst, src, 2)
	if bytes.Equal(a.data, b.data) {
		t.Error("two seeds gave the same order")
	}
}

func f0(s *frameSet) []byte { return s.frame(0) }

// TestGenPort checks the in-memory ports: frames are handed out in storage order,
// cycling, up to the count; buffers come back through the sink and through Free; the
// control goroutine's buffers never enter the pool.
func TestGenPort(t *testing.T) {
	set := buildFrames(5, false, extMAC, [6]byte(gwMAC), 1)
	pool := newGenPool(8)
	g := &genPort{name: "gen", pool: pool}
	sink := &sinkPort{name: "sink", pool: pool}
	bufs := make([]port.Buf, 4)
	if n := g.RxBurst(0, bufs); n != 0 {
		t.Fatalf("RxBurst before a feed: %d", n)
	}
	f := g.start(set, 7)
	var got [][]byte
	for range 3 {
		n := g.RxBurst(0, bufs)
		for _, b := range bufs[:n] {
			got = append(got, append([]byte(nil), b.Frame()...))
		}
		if sent := sink.TxBurst(0, bufs[:n]); sent != n {
			t.Fatalf("sink took %d of %d", sent, n)
		}
	}
	if len(got) != 7 {
		t.Fatalf("handed out %d frames, want 7", len(got))
	}
	for i, fr := range got {
		if !bytes.Equal(fr, set.frame(i%set.n)) {
			t.Errorf("frame %d is not frame %d of the set", i, i%set.n)
		}
	}
	if len(pool.free) != 8 {
		t.Errorf("%d buffers free after the sink recycled them, want 8", len(pool.free))
	}

	f.stop.Store(true)
	g.RxBurst(0, bufs)
	if !f.stopped.Load() || f.handed.Load() != 7 {
		t.Errorf("stopped %v, handed %d", f.stopped.Load(), f.handed.Load())
	}
	f = g.start(set, -1)
	if n := g.RxBurst(0, make([]port.Buf, 16)); n != 8 {
		t.Errorf("an unlimited feed handed out %d buffers of a pool of 8", n)
	}
	if n := g.RxBurst(0, bufs); n != 0 {
		t.Errorf("RxBurst with the pool empty: %d", n)
	}
	_ = f

	ctl := make([]port.Buf, 1)
	if g.Alloc(ctl) != 1 || ctl[0].Handle != 0 {
		t.Fatalf("control buffer: %+v", ctl[0])
	}
	ctl[0].Len = 60
	if sink.TxBurst(sink.TxQueues()-1, ctl) != 1 || sink.ctlTx.Load() != 1 {
		t.Error("the control queue did not take the frame")
	}
	g.Free(ctl)
	if len(pool.free) != 0 {
		t.Errorf("a control buffer entered the pool: %d free", len(pool.free))
	}
}

func TestMeter(t *testing.T) {
	pool := newGenPool(4)
	g := &genPort{name: "gen", pool: pool}
	m := newMeter(g)
	set := buildFrames(3, true, extMAC, [6]byte(gwMAC), 1)
	g.start(set, 3)
	m.arm(3)
	m.takeSample()
	bufs := make([]port.Buf, 4)
	n := m.RxBurst(0, bufs)
	if n != 3 || m.rx.Load() != 3 || m.firstRx.Load() == 0 {
		t.Fatalf("received %d, counted %d, first %d", n, m.rx.Load(), m.firstRx.Load())
	}
	if m.RxBurst(0, bufs) != 0 || m.polls.Load() != 2 || m.empty.Load() != 1 {
		t.Errorf("polls %d, empty %d", m.polls.Load(), m.empty.Load())
	}
	g.start(set, 1)
	time.Sleep(time.Millisecond)
	if m.RxBurst(0, make([]port.Buf, 4)) != 1 || m.idle.Load() < int64(time.Millisecond) {
		t.Errorf("idle %v after a millisecond without frames", time.Duration(m.idle.Load()))
	}
	m.TxBurst(0, bufs[:1])
	m.TxBurst(0, bufs[1:2])
	if m.doneAt.Load() != 0 {
		t.Error("done before the target")
	}
	m.TxBurst(0, bufs[2:3])
	if m.doneAt.Load() == 0 || m.tx.Load() != 3 {
		t.Errorf("done at %d with %d transmitted", m.doneAt.Load(), m.tx.Load())
	}
	if sp := m.sample.Load(); sp == nil || !bytes.Equal(*sp, set.frame(0)) {
		t.Error("the sample is not the first frame transmitted")
	}
}

func TestCheckTunnelled(t *testing.T) {
	inner := buildFrames(1, true, extMAC, [6]byte(gwMAC), 1).frame(0)[packet.EthernetLen:]
	e := &packet.Encap{Src: ldInt.Addr(), Dst: memberAddr[0], SrcMAC: packet.MAC(intMAC), DstMAC: memberMACs()[0], TTL: 64}
	if err := e.Prepare(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	copy(buf[128:], inner)
	start, err := e.Write(buf, 128, len(inner), 1)
	if err != nil {
		t.Fatal(err)
	}
	frame := buf[start : 128+len(inner)]
	if err := checkTunnelled(frame, true); err != nil {
		t.Errorf("a good frame: %v", err)
	}
	if err := checkTunnelled(frame, false); err == nil {
		t.Error("a SYN passed as an ACK")
	}
	if err := checkTunnelled(buildFrames(1, true, extMAC, [6]byte(gwMAC), 1).frame(0), true); err == nil {
		t.Error("an untunnelled frame passed")
	}
}

func TestParseVmRSS(t *testing.T) {
	if n, err := parseVmRSS(strings.NewReader("Name:\tx\nVmRSS:\t  1234 kB\nVmData: 5 kB\n")); err != nil || n != 1234*1024 {
		t.Errorf("got %d, %v", n, err)
	}
	for _, bad := range []string{"", "VmRSS: 12\n", "VmRSS: x kB\n", "VmRSS: 1 MB\n"} {
		if _, err := parseVmRSS(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if n, err := vmRSS(); err != nil || n <= 0 {
		t.Errorf("this process: %d, %v", n, err)
	}
}

func TestThreadCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	before := threadCPU(tid)
	// Spin until the thread had 5ms of CPU, or 5s on a machine too loaded to give it.
	for start := time.Now(); time.Since(start) < 5*time.Second && threadCPU(tid)-before < int64(5*time.Millisecond); {
	}
	after, self := threadCPU(tid), selfThreadCPU()
	if before <= 0 || after-before < int64(5*time.Millisecond) || self < after {
		t.Errorf("thread CPU %d → %d (self %d) over up to 5s of spinning", before, after, self)
	}
	if threadCPU(0) != 0 {
		t.Error("a CPU time for thread 0")
	}
}

func TestCommas(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := commas(n); got != want {
			t.Errorf("commas(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestMainDefence runs only the defence rows on small numbers: the rows the datapath
// has are measured and reported in the table and the JSON, the others say "not
// available" (never a number), and the kernel's synproxy peer answers the flood.
func TestMainDefence(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "nft", "nftables")
	if runtime.NumCPU() < 2 {
		t.Skip("the kernel's synproxy is measured on a core apart from the flood's: needs 2 CPUs")
	}
	var s struct {
		Cookies     *float64         `json:"synproxy_cookies_mpps_per_core"`
		Kernel      *float64         `json:"kernel_synproxy_mpps_per_core"`
		VsKernel    *float64         `json:"synproxy_vs_kernel"`
		Established *float64         `json:"synproxy_established_ratio"`
		OverloadNs  *float64         `json:"overload_ns_per_packet"`
		TraceNs     *float64         `json:"trace_ns_per_packet"`
		Targets     map[string]*bool `json:"targets_met"`
		Failures    []string         `json:"failures"`
		Skipped     []string         `json:"skipped"`
		Defence     *defenceResults  `json:"defence"`
		InMem       *forwardResults  `json:"inmem"`
	}
	out := runMain(t, &s, "-phases", "defence", "-skip-dpdk", "-flows", "10000", "-quiet-wait", "0",
		"-defence-rounds", "2", "-defence-duration", "200ms")
	if len(s.Failures) != 0 || s.Defence == nil || s.InMem != nil {
		t.Fatalf("failures %q, defence %v, in-memory forwarding %v", s.Failures, s.Defence, s.InMem)
	}
	if !slices.ContainsFunc(s.Skipped, func(x string) bool { return strings.Contains(x, "table, forward, dpdk") }) {
		t.Errorf("skipped: %q", s.Skipped)
	}
	for _, k := range []string{"synproxy_vs_kernel", "synproxy_established"} {
		if _, ok := s.Targets[k]; !ok {
			t.Errorf("targets_met lacks %s", k)
		}
	}
	d := s.Defence
	// A figure is a positive number when its row ran, null when the datapath lacks
	// the feature; never both.
	check := func(row string, vs ...*float64) {
		_, na := d.NotAvailable[row]
		for i, v := range vs {
			switch {
			case na && v != nil:
				t.Errorf("%s is not available but figure %d is %v", row, i, *v)
			case !na && v == nil:
				t.Errorf("%s: figure %d is null", row, i)
			}
		}
	}
	// The kernel's synproxy is measured whether the LD's SYN proxy is there or not.
	sp := d.Synproxy
	if sp == nil || len(sp.Rounds) != 2 || s.Kernel == nil || *s.Kernel <= 0 {
		t.Fatalf("SYN proxy rows: %+v, kernel %v", sp, s.Kernel)
	}
	for i, rd := range sp.Rounds {
		if k := rd.Kernel; k == nil || k.MppsPerCore <= 0 || k.SynAcks == 0 || k.SynReceived == 0 || k.KernelCPU <= 0 {
			t.Errorf("kernel synproxy round %d: %+v", i+1, k)
		}
	}
	if !strings.Contains(out, "kernel nftables synproxy, CPU 1") {
		t.Error("the report lacks the kernel's synproxy")
	}
	if _, na := d.NotAvailable["synproxy"]; !na {
		if sp.Answered == 0 || sp.Answered > sp.Received || sp.ToMembers != 0 {
			t.Errorf("LD SYN proxy: %+v", sp)
		}
		for i, rd := range sp.Rounds {
			if rd.LD == nil || rd.LD.MppsPerCPU <= 0 || rd.Ratio <= 0 {
				t.Errorf("SYN proxy round %d: %+v", i+1, rd)
			}
		}
		if !strings.Contains(out, "LD, one worker, in-memory ports") {
			t.Error("the report lacks the LD's SYN proxy")
		}

	} else if s.Cookies != nil || s.VsKernel != nil {
		t.Errorf("the LD's SYN proxy is not available, yet figures %v %v", s.Cookies, s.VsKernel)
	}
	if !strings.Contains(out, "(issue 17)") {
		t.Error("the report lacks the targets of issue 17")
	}
	check("synproxy-established", s.Established)
	check("overload", s.OverloadNs)
	check("trace (DSCP)", s.TraceNs)
	for name, f := range map[string]*featureResults{"overload": d.Overload, "trace": d.Trace, "trace option": d.TraceOption, "overload protecting": d.Protecting,
		"synproxy established": d.Established} {
		if f == nil {
			continue
		}
		if len(f.Rounds) != 2 || f.Ratio <= 0 {
			t.Errorf("%s rows: %+v", name, f)
		}
		for i, rd := range f.Rounds {
			if rd.On == nil || rd.Off == nil || rd.On.Packets == 0 || rd.Off.Packets == 0 {
				t.Errorf("%s round %d: %+v", name, i+1, rd)
			}
		}
	}
}

// TestMainSynproxyDPDK runs the SYN proxy's cookie rows over DPDK net_ring too (the
// package's one test that starts DPDK's EAL, which a process can do once).
func TestMainSynproxyDPDK(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "nft", "nftables")
	if runtime.NumCPU() < 2 {
		t.Skip("the kernel's synproxy is measured on a core apart from the flood's: needs 2 CPUs")
	}
	var s struct {
		CookiesDPDK *float64        `json:"synproxy_cookies_mpps_per_core_dpdk"`
		Ring        []*phaseResult  `json:"synproxy_dpdk_net_ring"`
		Defence     *defenceResults `json:"defence"`
		Failures    []string        `json:"failures"`
	}
	out := runMain(t, &s, "-phases", "synproxy", "-flows", "10000", "-quiet-wait", "0",
		"-defence-rounds", "1", "-defence-duration", "200ms")
	if len(s.Failures) != 0 || s.Defence == nil {
		t.Fatalf("failures %q, defence %v", s.Failures, s.Defence)
	}
	if _, na := s.Defence.NotAvailable["synproxy"]; na {
		if s.CookiesDPDK != nil || len(s.Ring) != 0 {
			t.Errorf("the SYN proxy is not available, yet figures over net_ring: %v", s.CookiesDPDK)
		}
		return
	}
	if len(s.Ring) != 1 || s.Ring[0].Packets == 0 || s.CookiesDPDK == nil || *s.CookiesDPDK <= 0 ||
		!strings.Contains(out, "LD, one worker, DPDK net_ring") {
		t.Errorf("SYN proxy over DPDK net_ring: %v, rows %+v", s.CookiesDPDK, s.Ring)
	}
}

// runMain runs the program with args, which must succeed, decodes its last line (the
// JSON summary) into summary, and returns its standard output.
func runMain(t *testing.T, summary any, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := Main(args, &out, &errb); code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := strings.TrimRight(out.String(), "\n")
	last := text[strings.LastIndexByte(text, '\n')+1:]
	if err := json.Unmarshal([]byte(last), summary); err != nil {
		t.Fatalf("last line %q: %v", last, err)
	}
	return out.String()
}
