//go:build cgo

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/l4/dpdk"
	"github.com/tiergate/tiergate/l4/port"
)

// haveDPDK tells whether this build has the DPDK binding (it needs cgo).
const haveDPDK = true

// DPDK set-up: one pool for every port. The net_ring device's rings hold 1024 mbufs;
// the rest covers the bursts in flight, the per-lcore caches and net_af_packet's
// receive queues.
const (
	poolSize  = 16383
	poolCache = 256
)

// dpdkEnv is the EAL and the mbuf pool, set up once per process.
type dpdkEnv struct {
	pool *dpdk.Mempool
	args []string
	// ports are the devices opened, by name: each is opened once (closing one
	// detaches it) and closed by close.
	ports map[string]*dpdk.Port
}

// ealArgs are the EAL arguments: no PCI devices, no telemetry; a ring device and a
// null device, and when t is set one af_packet device on each of the LD's ends of the
// veth pairs. Memory is in huge pages when reserveHugepages got them (as a DPDK
// deployment has; packet buffers in 4 KiB pages cost a TLB miss per packet), else in
// ordinary pages (--no-huge, with --no-shconf: --in-memory does not go with --no-huge
// in DPDK 22.11). Each af_packet device has two queue pairs, so that the kernel's
// spreading of flows over them is exercised (the worker polls both).
func ealArgs(t *topo, logLevel string) []string {
	args := []string{"-l", "0", "--no-pci", "-m", "1024", "--no-telemetry",
		"--log-level=" + logLevel, "--file-prefix=" + ealPrefix()}
	if hugepagesReserved {
		args = append(args, "--in-memory")
	} else {
		args = append(args, "--no-huge", "--no-shconf")
	}
	args = append(args, "--vdev=net_ring0", "--vdev=net_null0,no-rx=1")
	if t != nil {
		args = append(args,
			"--vdev=net_af_packet0,iface="+t.ext+",qpairs=2",
			"--vdev=net_af_packet1,iface="+t.int+",qpairs=2")
	}
	return args
}

const nrHugepages = "/proc/sys/vm/nr_hugepages"

// hugepagesReserved tells whether reserveHugepages made 2 MiB pages available.
var hugepagesReserved bool

// reserveHugepages makes sure at least mib MiB of 2 MiB huge pages are free, raising
// nr_hugepages when needed, and returns a function that puts the old value back.
// It fails quietly (the EAL then runs in ordinary pages) when the kernel cannot
// find the memory.
func reserveHugepages(mib int) (restore func()) {
	restore = func() {}
	old, err := os.ReadFile(nrHugepages)
	if err != nil {
		return restore
	}
	oldN, err := strconv.Atoi(strings.TrimSpace(string(old)))
	if err != nil {
		return restore
	}
	want := oldN + mib/2
	if free := freeHugepages(); free >= mib/2 {
		hugepagesReserved = true
		return restore
	}
	if err := os.WriteFile(nrHugepages, []byte(strconv.Itoa(want)), 0o644); err != nil {
		return restore
	}
	restore = func() { _ = os.WriteFile(nrHugepages, old, 0o644) }
	hugepagesReserved = freeHugepages() >= mib/2
	return restore
}

// freeHugepages reads HugePages_Free from /proc/meminfo.
func freeHugepages() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "HugePages_Free:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// ealPrefix names this process's EAL run directory, /var/run/dpdk/<prefix>.
func ealPrefix() string { return fmt.Sprintf("%s%d", nsPrefix, os.Getpid()) }

// startDPDK initialises the EAL with args and makes the pool.
func startDPDK(args []string) (*dpdkEnv, error) {
	e := &dpdkEnv{args: args}
	err := dpdk.Init(e.args)
	if err != nil {
		_ = os.RemoveAll(ealRunDir())
		return nil, err
	}
	if e.pool, err = dpdk.NewMempool("bench_l4", poolSize, poolCache, 0, -1); err != nil {
		_ = dpdk.Cleanup()
		_ = os.RemoveAll(ealRunDir())
		return nil, err
	}
	return e, nil
}

// ealRunDir is the directory the EAL makes even without a shared configuration.
func ealRunDir() string { return filepath.Join(ealRunBase, ealPrefix()) }

// close closes the ports, frees the pool, cleans up the EAL and removes its run
// directory.
func (e *dpdkEnv) close() error {
	var perr error
	for _, p := range e.ports {
		closePort(p, &perr)
	}
	e.pool.Free()
	err := dpdk.Cleanup()
	if rerr := os.RemoveAll(ealRunDir()); err == nil {
		err = rerr
	}
	if err == nil {
		err = perr
	}
	return err
}

// open opens the virtual device name with rxQueues receive queues and the two
// transmit queues one worker needs (its own and the control goroutine's), or returns
// it as it was opened before; close closes it.
func (e *dpdkEnv) open(name string, rxQueues int) (*dpdk.Port, error) {
	if p, ok := e.ports[name]; ok {
		if p.RxQueues() != rxQueues {
			return nil, fmt.Errorf("%s is open with %d receive queues, not %d", name, p.RxQueues(), rxQueues)
		}
		return p, nil
	}
	id, err := dpdk.PortByName(name)
	if err != nil {
		return nil, err
	}
	p, err := dpdk.OpenPort(id, name, dpdk.PortConfig{RxQueues: rxQueues, TxQueues: 2}, e.pool)
	if err != nil {
		return nil, err
	}
	if e.ports == nil {
		e.ports = map[string]*dpdk.Port{}
	}
	e.ports[name] = p
	return p, nil
}

// registerWorker makes a datapath worker's thread an lcore.
func registerWorker(int) (func(), error) {
	if _, err := dpdk.RegisterThread(); err != nil {
		return nil, err
	}
	return dpdk.UnregisterThread, nil
}

// ringSource feeds the net_ring device: frames transmitted on its queue 0 come back on
// its receive queue 0, which the worker polls.
type ringSource struct{ p *dpdk.Port }

func (s ringSource) feed(set *frameSet, count int64) feeding {
	f := &ringFeeding{done: make(chan struct{})}
	go f.run(s.p, set, count)
	return f
}

// ringFeeding is one run of the feeder: a goroutine on its own locked thread,
// registered as an lcore, that allocates mbufs, copies frames into them and transmits
// them in bursts of 32, retrying what a full ring does not take at once, after
// sched_yield: on a core of its own that is a spin, and on a shared machine it leaves
// the CPU to whatever else waits for it (a Go sleep would last up to a millisecond,
// longer than the worker takes to empty the ring).
type ringFeeding struct {
	halt atomic.Bool
	done chan struct{}
	st   feedStats
}

func (f *ringFeeding) stop() feedStats {
	f.halt.Store(true)
	<-f.done
	return f.st
}

func (f *ringFeeding) run(p *dpdk.Port, set *frameSet, count int64) {
	defer close(f.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, err := dpdk.RegisterThread(); err != nil {
		f.st.err = fmt.Errorf("feeder: %w", err)
		return
	}
	defer dpdk.UnregisterThread()
	var bufs [32]port.Buf
	var st feedStats
	pending, off, pos := 0, 0, 0
	for !f.halt.Load() {
		if pending == 0 {
			want := len(bufs)
			if count >= 0 {
				want = int(min(int64(want), count-int64(st.sent)))
				if want == 0 {
					break
				}
			}
			n := p.Alloc(bufs[:want])
			if n == 0 {
				st.noBuf++
				continue
			}
			for i := range n {
				b := &bufs[i]
				o := pos * set.stride
				b.Len = copy(b.Data[b.Off:], set.data[o:o+set.length])
				if pos++; pos == set.n {
					pos = 0
				}
			}
			pending, off = n, 0
		}
		k := p.TxBurst(0, bufs[off:off+pending])
		st.calls++
		st.sent += uint64(k)
		off += k
		pending -= k
		if pending > 0 {
			st.full++
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
	if pending > 0 {
		p.Free(bufs[off : off+pending])
	}
	f.st = st
}

// runRing measures the datapath over DPDK: net_ring0 as the external port (fed by the
// feeder), net_null0 as the internal one (it frees what it is given, like a NIC
// whose receiver never answers).
func (e *dpdkEnv) runRing(ctx context.Context, o *options, syn, ack *frameSet, log *slog.Logger) (res *forwardResults, err error) {
	ring, err := e.open("net_ring0", 1)
	if err != nil {
		return nil, err
	}
	null, err := e.open("net_null0", 1)
	if err != nil {
		return nil, err
	}
	mac := ring.MAC()
	setDstMAC(syn, mac)
	setDstMAC(ack, mac)
	cfg := ldConfig(ldSetup{ext: ldExt, gw: ldExtGW, gwMAC: gwMAC, memberMACs: memberMACs(), capacity: tableCapacity(o.flows)})
	r, err := startRig("DPDK net_ring", cfg, ring, null, ringSource{ring}, o.flows, registerWorker, log)
	if err != nil {
		return nil, err
	}
	res, err = runForward(ctx, r, syn, ack, o.duration, o.blPlan)
	if serr := r.stop(); err == nil {
		err = serr
	}
	return res, err
}

// splitPort receives from one DPDK port and transmits on another: the cookie rows'
// external port takes the flood from net_ring0 and sends the SYN-ACKs to net_null0,
// so that they do not loop back into the ring the feeder fills. Both draw on the one
// pool; only the worker's thread uses it.
type splitPort struct {
	*dpdk.Port            // receive, allocation, MAC
	tx         *dpdk.Port // transmission
}

func (s splitPort) TxQueues() int                          { return s.tx.TxQueues() }
func (s splitPort) TxBurst(queue int, bufs []port.Buf) int { return s.tx.TxBurst(queue, bufs) }

// runRingCookies measures the SYN proxy's cookie answers over DPDK: the feeder
// transmits the spoofed SYNs on net_ring0, the worker receives them there and sends
// its SYN-ACKs (and anything else) to net_null0, in rounds of -defence-duration.
func (e *dpdkEnv) runRingCookies(ctx context.Context, o *options, log *slog.Logger) (res []*phaseResult, err error) {
	cfg := ldConfig(ldSetup{ext: ldExt, gw: ldExtGW, gwMAC: gwMAC, memberMACs: memberMACs(), capacity: synproxyCapacity})
	if err := setRules(&cfg, "synproxy", `"on"`); err != nil {
		return nil, err
	}
	ring, err := e.open("net_ring0", 1)
	if err != nil {
		return nil, err
	}
	null, err := e.open("net_null0", 1)
	if err != nil {
		return nil, err
	}
	set, err := buildSynFlood(min(o.flows, 1_000_000))
	if err != nil {
		return nil, err
	}
	setDstMAC(set, ring.MAC())
	r, err := startRig("DPDK net_ring SYN proxy", cfg, splitPort{ring, null}, null, ringSource{ring}, 0, registerWorker, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := r.stop(); err == nil {
			err = serr
		}
	}()
	for range o.defRounds {
		members0, rx0, tx0 := r.int.tx.Load(), r.ext.rx.Load(), r.ext.tx.Load()
		p, err := r.timedCount(ctx, set, o.defDuration, &r.ext.tx, r.ext, false, nil)
		if err != nil {
			return res, err
		}
		if err := checkAnswered(r, rx0, tx0); err != nil {
			return res, err
		}
		if err := checkSynAck(r.ext, set); err != nil {
			return res, fmt.Errorf("%s: the first SYN-ACK: %w", r.name, err)
		}
		if n := r.int.tx.Load() - members0; n != 0 {
			return res, fmt.Errorf("%s: %d frames of the spoofed SYN flood reached the members", r.name, n)
		}
		res = append(res, p)
	}
	if st := r.d.Status(); st.Conns != 0 {
		return res, fmt.Errorf("%s: the spoofed SYNs left %d entries in the table", r.name, st.Conns)
	}
	return res, nil
}

func closePort(p *dpdk.Port, err *error) {
	if cerr := p.Close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// setDstMAC rewrites the destination MAC of every frame of set.
func setDstMAC(set *frameSet, mac [6]byte) {
	for j := range set.n {
		copy(set.data[j*set.stride:], mac[:])
	}
}

// bothQueues presents receive queues 0 and 1 of a net_af_packet port as queue 0. The
// device's two queue pairs are two AF_PACKET sockets in one fanout group, which the
// kernel feeds by flow hash; the datapath's one worker polls queue 0 only, so without
// this half the flows would wait on queue 1 for good. Only the worker calls RxBurst.
type bothQueues struct{ *dpdk.Port }

func (b bothQueues) RxQueues() int { return 1 }

func (b bothQueues) RxBurst(queue int, bufs []port.Buf) int {
	n := b.Port.RxBurst(0, bufs)
	if n < len(bufs) {
		n += b.Port.RxBurst(1, bufs[n:])
	}
	return n
}

// runVeth opens the two net_af_packet devices and measures forwarding end to end
// through them (measureVeth).
func (e *dpdkEnv) runVeth(ctx context.Context, o *options, t *topo, log *slog.Logger) (res *vethResult, err error) {
	ext, err := e.open("net_af_packet0", 2)
	if err != nil {
		return nil, err
	}
	in, err := e.open("net_af_packet1", 2)
	if err != nil {
		return nil, err
	}
	missed := func() uint64 {
		st, err := ext.Stats()
		if err != nil {
			return 0
		}
		return st.RxMissed
	}
	return measureVeth(ctx, o, t, bothQueues{ext}, bothQueues{in}, missed, registerWorker, log)
}
