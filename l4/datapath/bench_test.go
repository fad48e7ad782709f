package datapath

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
)

// benchWorker is a worker of a distributor that is not running, with static
// neighbours, so handle can be called directly.
func benchWorker(b testing.TB, capacity int) (*worker, *snapshot) {
	return benchWorkerKey(b, capacity, 0)
}

// benchWorkerKey is benchWorker with tunnel key key (0: none).
func benchWorkerKey(b testing.TB, capacity int, key uint32) (*worker, *snapshot) {
	return benchWorkerCfg(b, capacity, func(c *Config) { c.Tunnel.Key = key })
}

// benchWorkerCfg is benchWorker with the configuration changed by mod first.
func benchWorkerCfg(b testing.TB, capacity int, mod func(*Config)) (*worker, *snapshot) {
	cfg := testConfig()
	cfg.External.GatewayMAC = packet.MAC(gwMAC)
	p := cfg.Pools["l7"]
	for i := range p.Members {
		p.Members[i].MAC = packet.MAC(memberMAC[p.Members[i].Address.String()])
	}
	cfg.Pools["l7"] = p
	cfg.Conntrack.Capacity = capacity
	mod(&cfg)
	ext := port.NewMem("ext", extMAC, 2, 64, 2048)
	in := port.NewMem("int", intMAC, 2, 64, 2048)
	d, err := NewDistributor(cfg, Options{External: ext, Internal: in})
	if err != nil {
		b.Fatal(err)
	}
	w := d.workers[0]
	s := d.snap.Load()
	w.resync(s)
	return w, s
}

func benchFrames(b *testing.B, n int, syn bool) [][]byte {
	t := &testing.T{}
	frames := make([][]byte, n)
	for i := range n {
		src := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		frames[i] = tcp4(t, src, uint16(1024+i%50000), vip, 443, syn, !syn, nil)
	}
	return frames
}

// BenchmarkHandleEstablished is the per-packet cost of the decision and rewrite
// for packets of 1M established flows in random order (no port I/O).
func BenchmarkHandleEstablished(b *testing.B) { benchHandleEstablished(b, 0) }

// BenchmarkHandleEstablishedKey is BenchmarkHandleEstablished with a tunnel key: every
// packet leaves in GRE with the key (an 8-byte GRE header).
func BenchmarkHandleEstablishedKey(b *testing.B) { benchHandleEstablished(b, 0x7467_0001) }

func benchHandleEstablished(b *testing.B, key uint32) {
	const flows = 1 << 20
	w, s := benchWorkerKey(b, 2*flows, key)
	handleEstablished(b, w, s, flows)
}

// handleEstablished makes flows flows (a power of two) through w by their SYNs,
// then times b.N of their ACKs, in random order, through handleFrame.
func handleEstablished(b *testing.B, w *worker, s *snapshot, flows int) {
	syns := benchFrames(b, flows, true)
	buf := port.Buf{Data: make([]byte, 2048)}
	for _, f := range syns {
		buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
		if v := w.handleFrame(s, &buf, true); v != vInt {
			b.Fatalf("SYN verdict %d", v)
		}
	}
	acks := benchFrames(b, flows, false)
	rand.Shuffle(len(acks), func(i, j int) { acks[i], acks[j] = acks[j], acks[i] })
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f := acks[i&(flows-1)]
		buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
		if w.handleFrame(s, &buf, true) != vInt {
			b.Fatal("not forwarded")
		}
	}
	b.StopTimer()
}

// BenchmarkHandleNewFlow is the cost of scheduling and inserting a new flow.
func BenchmarkHandleNewFlow(b *testing.B) {
	const flows = 1 << 20
	w, s := benchWorker(b, 4*flows)
	syns := benchFrames(b, flows, true)
	buf := port.Buf{Data: make([]byte, 2048)}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f := syns[i&(flows-1)]
		buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
		w.handleFrame(s, &buf, true)
	}
}

// genPort receives bursts of one template frame, patched per packet to the next
// of n flows (source address), as a NIC would DMA them into reused buffers; its
// transmit side takes everything.
type genPort struct {
	tmpl []byte
	bufs [][]byte
	n    uint32
	next uint32
	sent uint64
}

func newGenPort(tmpl []byte, flows int, burst int) *genPort {
	g := &genPort{tmpl: tmpl, n: uint32(flows)}
	for range burst {
		g.bufs = append(g.bufs, make([]byte, 2048))
	}
	return g
}

func (g *genPort) Name() string         { return "gen" }
func (g *genPort) MAC() [6]byte         { return extMAC }
func (g *genPort) RxQueues() int        { return 2 }
func (g *genPort) TxQueues() int        { return 2 }
func (g *genPort) Headroom() int        { return 128 }
func (g *genPort) Alloc([]port.Buf) int { return 0 }
func (g *genPort) Free([]port.Buf)      {}
func (g *genPort) TxBurst(_ int, bufs []port.Buf) int {
	g.sent += uint64(len(bufs))
	return len(bufs)
}

func (g *genPort) RxBurst(_ int, bufs []port.Buf) int {
	for i := range bufs {
		d := g.bufs[i]
		f := d[128 : 128+len(g.tmpl)]
		copy(f, g.tmpl)
		// Source address 10.0.0.0 + flow, IPv4 checksum adjusted.
		ip := f[14:]
		v := 0x0a000000 + g.next
		g.next++
		if g.next == g.n {
			g.next = 0
		}
		old0, old1 := uint16(ip[12])<<8|uint16(ip[13]), uint16(ip[14])<<8|uint16(ip[15])
		ip[12], ip[13], ip[14], ip[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		sum := uint16(ip[10])<<8 | uint16(ip[11])
		sum = packet.ChecksumAdjust16(sum, old0, uint16(v>>16))
		sum = packet.ChecksumAdjust16(sum, old1, uint16(v))
		ip[10], ip[11] = byte(sum>>8), byte(sum)
		bufs[i] = port.Buf{Data: d, Off: 128, Len: len(g.tmpl)}
	}
	return len(bufs)
}

// BenchmarkPollEstablished is one worker's cost per packet, in bursts of 32, for
// 1M established flows visited in order (each flow's entry is cold by the time
// it comes round again), port I/O excluded.
func BenchmarkPollEstablished(b *testing.B) {
	const flows = 1 << 20
	w, _ := benchWorker(b, 2*flows)
	pollEstablished(b, w, flows)
}

// pollEstablished makes flows flows through w by polling bursts of 32 SYNs, then
// times b.N of their ACKs (in bursts of 32, the flows in order) through poll, port
// I/O excluded, and reports Mpps.
func pollEstablished(b *testing.B, w *worker, flows int) {
	t := &testing.T{}
	syn := newGenPort(tcp4(t, vip, 40000, vip, 443, true, false, nil), flows, 32)
	sink := newGenPort(nil, 0, 0)
	w.ext, w.int, w.onePort = syn, sink, false
	for range flows / 32 {
		w.poll(syn, vExt)
	}
	if got := w.table.Len(); got != flows {
		b.Fatalf("%d flows in the table, want %d", got, flows)
	}
	ack := newGenPort(tcp4(t, vip, 40000, vip, 443, false, true, nil), flows, 32)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N / 32 {
		w.poll(ack, vExt)
	}
	b.StopTimer()
	if sink.sent < uint64(b.N/32*32) {
		b.Fatalf("forwarded %d of %d", sink.sent, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mpps")
}
