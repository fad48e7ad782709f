//go:build cgo && !nodpdk

package dpdk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/l4/port"
)

var seq atomic.Int64

// unique returns prefix followed by a number unique in the process.
func unique(prefix string) string { return fmt.Sprintf("%s%d", prefix, seq.Add(1)) }

func newPool(t testing.TB, n uint) *Mempool {
	t.Helper()
	mp, err := NewMempool(unique("tp"), n, 0, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if got := mp.InUse(); got != 0 {
			t.Errorf("mempool %s: %d mbufs still in use (leak)", mp.Name(), got)
		}
		mp.Free()
	})
	return mp
}

// attach attaches a fresh virtual device (driver "net_ring", "net_null",
// "net_af_packet"), opens it with cfg and closes it when t ends.
func attach(t testing.TB, driver, args string, cfg PortConfig, pool *Mempool) *Port {
	t.Helper()
	name := unique(driver + "_t")
	devargs := name
	if args != "" {
		devargs += "," + args
	}
	if err := AttachDevice(devargs); err != nil {
		t.Fatal(err)
	}
	id, err := PortByName(name)
	if err != nil {
		t.Fatal(err)
	}
	p, err := OpenPort(id, "", cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// testFrame builds an Ethernet frame of n bytes (at least 18) with a local
// experimental ethertype, a marker and the index i in the payload.
func testFrame(dst, src [6]byte, marker uint32, i, n int) []byte {
	f := make([]byte, n)
	copy(f[0:], dst[:])
	copy(f[6:], src[:])
	binary.BigEndian.PutUint16(f[12:], 0x88b5)
	binary.BigEndian.PutUint32(f[14:], marker)
	for j := 18; j < n; j++ {
		f[j] = byte(i + j)
	}
	if n >= 20 {
		binary.BigEndian.PutUint16(f[18:], uint16(i))
	}
	return f
}

var (
	bcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	srcA  = [6]byte{0x02, 0, 0, 0, 0, 0xa}
)

// fill allocates len(frames) mbufs from p and writes frames into them, starting
// prepend bytes into the headroom.
func fill(t testing.TB, p *Port, frames [][]byte, prepend int) []port.Buf {
	t.Helper()
	bufs := make([]port.Buf, len(frames))
	if n := p.Alloc(bufs); n != len(bufs) {
		p.Free(bufs[:n])
		t.Fatalf("Alloc = %d, want %d", n, len(bufs))
	}
	for i, f := range frames {
		b := &bufs[i]
		if b.Off != Headroom || b.Len != 0 || len(b.Data) != DefaultDataRoom || b.Handle == 0 {
			t.Fatalf("fresh mbuf: off %d len %d size %d handle %#x", b.Off, b.Len, len(b.Data), b.Handle)
		}
		b.Off -= prepend
		b.Len = copy(b.Data[b.Off:], f)
	}
	return bufs
}

// rxAll receives from queue until want buffers arrived or the deadline passed, keeping
// those whose frame passes keep and freeing the rest.
func rxAll(p *Port, queue, want int, deadline time.Duration, keep func([]byte) bool) []port.Buf {
	var out []port.Buf
	bufs := make([]port.Buf, 64)
	end := time.Now().Add(deadline)
	for len(out) < want && time.Now().Before(end) {
		n := p.RxBurst(queue, bufs)
		if n == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		for _, b := range bufs[:n] {
			if keep == nil || keep(b.Frame()) {
				out = append(out, b)
			} else {
				p.Free([]port.Buf{b})
			}
		}
	}
	return out
}

func TestMbufLayout(t *testing.T) {
	if err := checkLayout(); err != nil {
		t.Fatal(err)
	}
}

func TestInitOnce(t *testing.T) {
	requireEAL(t)
	if err := Init(nil); !errors.Is(err, ErrInitialized) {
		t.Fatalf("second Init: %v, want ErrInitialized", err)
	}
}

func TestLcores(t *testing.T) {
	requireEAL(t)
	ids := Lcores()
	if LcoreCount() != 1 || !slices.Equal(ids, []uint{0}) || MainLcore() != 0 {
		t.Fatalf("with -l 0: count %d, lcores %v, main %d", LcoreCount(), ids, MainLcore())
	}
}

func TestRegisterThread(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 1024)
	p := attach(t, "net_null", "", PortConfig{}, pool)
	const workers = 2
	ids := make([]uint, workers)
	errs := make([]error, workers)
	var registered, done sync.WaitGroup
	registered.Add(workers)
	done.Add(workers)
	hold := make(chan struct{})
	for w := range workers {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if before := LcoreID(); before != LcoreAny {
				errs[w] = fmt.Errorf("lcore %d before registering", before)
				registered.Done()
				return
			}
			id, err := RegisterThread()
			ids[w], errs[w] = id, err
			registered.Done()
			if err != nil {
				return
			}
			<-hold // both registered at once: distinct IDs
			if LcoreID() != id {
				errs[w] = fmt.Errorf("LcoreID %d, registered as %d", LcoreID(), id)
			}
			// The mempool cache of this lcore is usable.
			bufs := make([]port.Buf, 32)
			n := p.Alloc(bufs)
			p.Free(bufs[:n])
			if n != len(bufs) {
				errs[w] = fmt.Errorf("Alloc on lcore %d = %d", id, n)
			}
			UnregisterThread()
			if LcoreID() != LcoreAny {
				errs[w] = fmt.Errorf("lcore %d after unregistering", LcoreID())
			}
		}()
	}
	registered.Wait()
	close(hold)
	done.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", w, err)
		}
	}
	if ids[0] == ids[1] || ids[0] == MainLcore() || ids[1] == MainLcore() || ids[0] == LcoreAny {
		t.Fatalf("registered lcores %v (main %d)", ids, MainLcore())
	}
}

func TestPortsAndNames(t *testing.T) {
	requireEAL(t)
	ids := Ports()
	if len(ids) != PortCount() || len(ids) < 3 {
		t.Fatalf("Ports %v, PortCount %d", ids, PortCount())
	}
	for _, tc := range []struct {
		name    string
		wantErr error
	}{
		{"net_ring0", nil},
		{"net_null0", nil},
		{"net_af_packet0", nil},
		{"net_nosuch0", syscall.ENODEV},
		{"", syscall.ENODEV},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := PortByName(tc.name)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("PortByName(%q) = %d, %v; want %v", tc.name, id, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(ids, id) {
				t.Fatalf("port %d not among %v", id, ids)
			}
			if n, err := PortName(id); err != nil || n != tc.name {
				t.Fatalf("PortName(%d) = %q, %v", id, n, err)
			}
		})
	}
}

func TestRingLoopback(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 2048)
	p := attach(t, "net_ring", "", PortConfig{RxQueues: 2, TxQueues: 2}, pool)
	if p.RxQueues() != 2 || p.TxQueues() != 2 || p.Headroom() != 128 {
		t.Fatalf("queues %d/%d headroom %d", p.RxQueues(), p.TxQueues(), p.Headroom())
	}
	for _, tc := range []struct {
		name    string
		queue   int
		lens    []int
		prepend int
	}{
		{"one frame", 0, []int{60}, 0},
		{"mixed sizes", 1, []int{60, 61, 64, 128, 333, 1000, 1514, 2048}, 0},
		{"header prepended into the headroom", 0, []int{60, 1514}, 64},
		{"whole headroom", 1, []int{100}, Headroom},
		{"more than MaxBurst", 0, slices.Repeat([]int{64}, MaxBurst+44), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := uint32(seq.Add(1))
			var frames [][]byte
			for i, n := range tc.lens {
				frames = append(frames, testFrame(bcast, srcA, marker, i, n))
			}
			bufs := fill(t, p, frames, tc.prepend)
			if n := p.TxBurst(tc.queue, bufs); n != len(bufs) {
				p.Free(bufs[n:])
				t.Fatalf("TxBurst = %d, want %d", n, len(bufs))
			}
			other := make([]port.Buf, 4)
			if n := p.RxBurst(1-tc.queue, other); n != 0 {
				p.Free(other[:n])
				t.Fatalf("%d frames on the other queue", n)
			}
			got := rxAll(p, tc.queue, len(frames), time.Second, nil)
			defer p.Free(got)
			if len(got) != len(frames) {
				t.Fatalf("received %d frames, want %d", len(got), len(frames))
			}
			for i, b := range got {
				if b.Handle != bufs[i].Handle || b.Off != Headroom-tc.prepend {
					t.Fatalf("frame %d: handle %#x off %d, sent handle %#x off %d", i, b.Handle, b.Off, bufs[i].Handle, bufs[i].Off)
				}
				if !bytes.Equal(b.Frame(), frames[i]) {
					t.Fatalf("frame %d: received %d bytes, differs from the %d sent", i, b.Len, len(frames[i]))
				}
			}
		})
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(1 + 8 + 2 + 1 + MaxBurst + 44)
	if st.RxPackets != want || st.TxPackets != want || st.MultiSeg != 0 {
		t.Fatalf("stats %+v, want %d packets each way", st, want)
	}
}

func TestRingMultiSegDropped(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 256)
	p := attach(t, "net_ring", "", PortConfig{}, pool)
	frames := [][]byte{testFrame(bcast, srcA, 1, 0, 100), testFrame(bcast, srcA, 1, 1, 100), testFrame(bcast, srcA, 1, 2, 100)}
	bufs := fill(t, p, frames, 0)
	// bufs[1] becomes the second segment of bufs[0]: the ring hands the chain back.
	if err := chain(bufs[0].Handle, bufs[1].Handle); err != nil {
		t.Fatal(err)
	}
	if n := p.TxBurst(0, []port.Buf{bufs[0], bufs[2]}); n != 2 {
		t.Fatalf("TxBurst = %d", n)
	}
	got := rxAll(p, 0, 1, 200*time.Millisecond, nil)
	defer p.Free(got)
	if len(got) != 1 || got[0].Handle != bufs[2].Handle {
		t.Fatalf("received %d buffers, want only the single-segment one", len(got))
	}
	if st, _ := p.Stats(); st.MultiSeg != 1 {
		t.Fatalf("MultiSeg = %d, want 1", st.MultiSeg)
	}
}

func TestNull(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 1024)
	p := attach(t, "net_null", "", PortConfig{Promiscuous: true}, pool)
	if up, _, err := p.Link(); err != nil || !up {
		t.Fatalf("link up %v, %v", up, err)
	}
	bufs := make([]port.Buf, 32)
	if n := p.RxBurst(0, bufs); n != 32 {
		t.Fatalf("RxBurst = %d", n)
	}
	for _, b := range bufs {
		if b.Len != 64 || len(b.Data) != DefaultDataRoom || b.Off != Headroom {
			t.Fatalf("null frame: len %d, %d-byte buffer, off %d", b.Len, len(b.Data), b.Off)
		}
	}
	if n := p.TxBurst(0, bufs); n != 32 {
		t.Fatalf("TxBurst = %d", n)
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// The null driver counts packets, not bytes.
	if st.RxPackets != 32 || st.TxPackets != 32 {
		t.Fatalf("stats %+v", st)
	}
	xs, err := p.XStats()
	if err != nil {
		t.Fatal(err)
	}
	if xs["rx_good_packets"] != 32 || xs["tx_good_packets"] != 32 || len(xs) < 10 {
		t.Fatalf("xstats %v", xs)
	}
}

func TestPortLifecycle(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 64)
	p := attach(t, "net_null", "", PortConfig{}, pool)
	if _, err := OpenPort(p.ID(), "", PortConfig{}, pool); !errors.Is(err, ErrPortOpen) {
		t.Fatalf("second OpenPort: %v", err)
	}
	if err := p.Start(); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start of a started port: %v", err)
	}
	for range 2 {
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if up, _, _ := p.Link(); up {
		t.Fatal("link up after Stop")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	// Pool exhaustion: 64 mbufs, no cache.
	bufs := make([]port.Buf, 100)
	n := p.Alloc(bufs)
	func() {
		defer p.Free(bufs[:n])
		if n != 64 {
			t.Fatalf("Alloc from a 64-mbuf pool = %d", n)
		}
		if k := p.Alloc(make([]port.Buf, 1)); k != 0 {
			t.Fatalf("Alloc from an empty pool = %d", k)
		}
		if k := p.RxBurst(0, bufs[64:]); k != 0 {
			t.Fatalf("null RxBurst with no mbufs = %d", k)
		}
	}()
	if pool.Avail() != 64 || pool.InUse() != 0 {
		t.Fatalf("avail %d in use %d", pool.Avail(), pool.InUse())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

func TestOpenPortErrors(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 64)
	ring, err := PortByName("net_ring0")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		id      uint16
		cfg     PortConfig
		pool    *Mempool
		wantErr error
		wantMsg string
	}{
		{"no such port", 31, PortConfig{}, pool, syscall.ENODEV, ""},
		{"no pool", ring, PortConfig{}, nil, nil, "no mempool"},
		{"too many RX queues", ring, PortConfig{RxQueues: 1000}, pool, nil, "the device supports"},
		{"negative TX queues", ring, PortConfig{TxQueues: -1}, pool, nil, "the device supports"},
		{"MTU out of range", ring, PortConfig{MTU: 70000}, pool, nil, "MTU 70000 out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := OpenPort(tc.id, "", tc.cfg, tc.pool)
			if err == nil {
				p.Close()
				t.Fatal("OpenPort succeeded")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if tc.wantMsg != "" && !bytes.Contains([]byte(err.Error()), []byte(tc.wantMsg)) {
				t.Fatalf("error %q, want it to contain %q", err, tc.wantMsg)
			}
		})
	}
}

func TestMempoolErrors(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 64)
	if _, err := NewMempool(pool.Name(), 64, 0, 0, -1); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("duplicate name: %v", err)
	}
	for _, room := range []uint{Headroom, 70000} {
		if _, err := NewMempool(unique("tp"), 64, 0, room, -1); err == nil {
			t.Fatalf("data room %d accepted", room)
		}
	}
	if _, err := NewMempool(unique("tp"), 64, 1000, 0, -1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("cache larger than the pool: %v", err)
	}
	if err := AttachDevice("net_nosuchdriver0"); err == nil {
		t.Fatal("AttachDevice of an unknown driver succeeded")
	}
}

func TestBurstsDoNotAllocate(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 1024)
	p := attach(t, "net_ring", "", PortConfig{}, pool)
	bufs := make([]port.Buf, 32)
	if n := p.Alloc(bufs); n != 32 {
		t.Fatalf("Alloc = %d", n)
	}
	for i := range bufs {
		bufs[i].Len = 64
	}
	if n := p.TxBurst(0, bufs); n != 32 {
		t.Fatalf("TxBurst = %d", n)
	}
	allocs := testing.AllocsPerRun(100, func() {
		n := p.RxBurst(0, bufs)
		if p.TxBurst(0, bufs[:n]) != n {
			panic("short TxBurst on a ring")
		}
		k := p.Alloc(bufs[n:])
		p.Free(bufs[n : n+k])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per burst", allocs)
	}
	n := p.RxBurst(0, bufs)
	p.Free(bufs[:n])
}

func TestTxBurstPanicsOnFrameOutsideBuffer(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 64)
	p := attach(t, "net_null", "", PortConfig{}, pool)
	bufs := make([]port.Buf, 1)
	p.Alloc(bufs)
	defer p.Free(bufs)
	bufs[0].Len = len(bufs[0].Data)
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("no panic")
		}
	}()
	p.TxBurst(0, bufs)
}

// TestAFPacket exchanges frames between the DPDK port on one end of a veth pair and a
// raw socket on the other. The pair is its own: on net_af_packet0's interface the
// device would be refused (TestAFPacketSharedInterface).
func TestAFPacket(t *testing.T) {
	requireEAL(t)
	pool := newPool(t, 1024)
	p := attach(t, "net_af_packet", "iface="+env.vethAF, PortConfig{Promiscuous: true, MTU: 1500}, pool)
	ifc, err := net.InterfaceByName(env.vethAF)
	if err != nil {
		t.Fatal(err)
	}
	if mac := p.MAC(); !bytes.Equal(mac[:], ifc.HardwareAddr) {
		t.Fatalf("MAC %x, interface has %s", p.MAC(), ifc.HardwareAddr)
	}
	if up, speed, err := p.Link(); err != nil || !up {
		t.Fatalf("link up %v speed %d: %v", up, speed, err)
	}
	// The driver sets the MTU on the interface.
	if err := p.SetMTU(1400); err != nil {
		t.Fatal(err)
	}
	if ifc, _ := net.InterfaceByName(env.vethAF); ifc.MTU != 1400 {
		t.Fatalf("interface MTU %d after SetMTU(1400)", ifc.MTU)
	}
	if err := p.SetMTU(1500); err != nil {
		t.Fatal(err)
	}
	if err := p.SetMTU(0); err == nil {
		t.Fatal("SetMTU(0) accepted")
	}
	sock := rawSocket(t, env.vethAFP)

	marker := uint32(seq.Add(1))
	ours := func(f []byte) bool {
		return len(f) >= 18 && binary.BigEndian.Uint16(f[12:]) == 0x88b5 && binary.BigEndian.Uint32(f[14:]) == marker
	}

	// Peer → DPDK.
	in := [][]byte{testFrame(p.MAC(), srcA, marker, 0, 60), testFrame(bcast, srcA, marker, 1, 1514)}
	for _, f := range in {
		if _, err := syscall.Write(sock, f); err != nil {
			t.Fatalf("raw send: %v", err)
		}
	}
	got := rxAll(p, 0, len(in), 2*time.Second, ours)
	defer p.Free(got)
	if len(got) != len(in) {
		t.Fatalf("DPDK received %d of our frames, want %d", len(got), len(in))
	}
	for i, b := range got {
		if !bytes.Equal(b.Frame(), in[i]) {
			t.Fatalf("frame %d differs: %d bytes, sent %d", i, b.Len, len(in[i]))
		}
	}

	// DPDK → peer.
	marker = uint32(seq.Add(1))
	out := [][]byte{testFrame(bcast, p.MAC(), marker, 0, 60), testFrame(bcast, p.MAC(), marker, 1, 1000)}
	bufs := fill(t, p, out, 0)
	if n := p.TxBurst(0, bufs); n != len(bufs) {
		p.Free(bufs[n:])
		t.Fatalf("TxBurst = %d", n)
	}
	buf := make([]byte, 2048)
	var seen [][]byte
	deadline := time.Now().Add(2 * time.Second)
	for len(seen) < len(out) && time.Now().Before(deadline) {
		n, err := syscall.Read(sock, buf)
		if err != nil {
			if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
				continue
			}
			t.Fatal(err)
		}
		if ours(buf[:n]) {
			seen = append(seen, bytes.Clone(buf[:n]))
		}
	}
	if len(seen) != len(out) {
		t.Fatalf("peer received %d of the frames DPDK sent, want %d", len(seen), len(out))
	}
	for i := range out {
		if !bytes.Equal(seen[i], out[i]) {
			t.Fatalf("frame %d differs on the wire", i)
		}
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.TxPackets != 2 || st.TxBytes != 60+1000 || st.RxPackets < 2 || st.RxBytes < 60+1514 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAFPacketSharedInterface checks that a second af_packet device on an interface
// that one already binds is refused (it would split the interface's frames with the
// first by a per-boot hash), and that the interface is free again once the device that
// bound it is closed.
func TestAFPacketSharedInterface(t *testing.T) {
	requireEAL(t)
	name := unique("net_af_packet_t")
	err := AttachDevice(name + ",iface=" + env.vethDPDK)
	if !errors.Is(err, ErrSharedInterface) {
		t.Fatalf("second device on net_af_packet0's interface: %v, want ErrSharedInterface", err)
	}
	if _, err := PortByName(name); err == nil {
		t.Fatalf("refused device %s exists", name)
	}

	pool := newPool(t, 256)
	ifc := "tgdz" + env.vethAF[4:]
	if out, err := exec.Command("ip", "link", "add", ifc, "type", "veth", "peer", "name", ifc+"p").CombinedOutput(); err != nil {
		t.Fatalf("creating veth %s: %v: %s", ifc, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", ifc).Run() })
	first := unique("net_af_packet_t")
	if err := AttachDevice(first + ",iface=" + ifc); err != nil {
		t.Fatal(err)
	}
	id, err := PortByName(first)
	if err != nil {
		t.Fatal(err)
	}
	p, err := OpenPort(id, "renamed", PortConfig{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := AttachDevice(unique("net_af_packet_t") + ",iface=" + ifc); !errors.Is(err, ErrSharedInterface) {
		t.Fatalf("second device on %s: %v, want ErrSharedInterface", ifc, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	again := unique("net_af_packet_t")
	if err := AttachDevice(again + ",iface=" + ifc); err != nil {
		t.Fatalf("after closing %s: %v", first, err)
	}
	id, err = PortByName(again)
	if err != nil {
		t.Fatal(err)
	}
	p, err = OpenPort(id, "", PortConfig{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// rawSocket opens an AF_PACKET socket bound to ifname, with a 100 ms read timeout.
func rawSocket(t *testing.T, ifname string) int {
	t.Helper()
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	proto := int(htons(syscall.ETH_P_ALL))
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, proto)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(syscall.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		t.Fatalf("binding the raw socket to %s: %v", ifname, err)
	}
	tv := syscall.Timeval{Usec: 100_000}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// BenchmarkRingLoopback measures the binding's own cost per packet: bursts of 32
// received from a ring device and transmitted back to it, with no processing, on one
// registered lcore.
func BenchmarkRingLoopback(b *testing.B) {
	requireEAL(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, err := RegisterThread(); err != nil {
		b.Fatal(err)
	}
	defer UnregisterThread()
	pool := newPool(b, 2048)
	p := attach(b, "net_ring", "", PortConfig{}, pool)
	bufs := make([]port.Buf, 512)
	n := p.Alloc(bufs)
	for i := range n {
		bufs[i].Len = 64
	}
	if p.TxBurst(0, bufs[:n]) != n {
		b.Fatal("priming the ring")
	}
	burst := bufs[:32]
	pkts := 0
	b.ReportAllocs()
	for b.Loop() {
		k := p.RxBurst(0, burst)
		pkts += p.TxBurst(0, burst[:k])
	}
	b.ReportMetric(float64(pkts)/b.Elapsed().Seconds()/1e6, "Mpps")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(pkts, 1)), "ns/pkt")
	for {
		k := p.RxBurst(0, bufs)
		if k == 0 {
			break
		}
		p.Free(bufs[:k])
	}
}

// BenchmarkNullRxTx adds mbuf allocation and freeing: the null device allocates an
// mbuf per received packet and frees each transmitted one.
func BenchmarkNullRxTx(b *testing.B) {
	requireEAL(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, err := RegisterThread(); err != nil {
		b.Fatal(err)
	}
	defer UnregisterThread()
	pool, err := NewMempool(unique("tp"), 4096, 256, 0, -1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Free) // after the port closes: cleanups run last-in first-out
	p := attach(b, "net_null", "", PortConfig{}, pool)
	bufs := make([]port.Buf, 32)
	pkts := 0
	b.ReportAllocs()
	for b.Loop() {
		k := p.RxBurst(0, bufs)
		pkts += p.TxBurst(0, bufs[:k])
	}
	b.ReportMetric(float64(pkts)/b.Elapsed().Seconds()/1e6, "Mpps")
}
