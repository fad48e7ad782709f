package sessionsync_test

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/sessionsync"
)

var (
	extMAC  = [6]byte{0x02, 0, 0, 0, 0xe0, 0x01}
	intMAC  = [6]byte{0x02, 0, 0, 0, 0x10, 0x01}
	gwMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0xe0, 0xfe}
	vip     = netip.MustParseAddr("203.0.113.10")
	memberA = netip.MustParseAddr("198.18.1.11")
	memberB = netip.MustParseAddr("198.18.1.12")
	key     = []byte("0123456789abcdef0123456789abcdef")
)

const cluster = 16

// ldConfig is an LD whose pool has members a and b; drainA drains a, so that this
// LD schedules every new flow to b.
func ldConfig(drainA bool) datapath.Config {
	return datapath.Config{
		External: datapath.Interface{Addr: netip.MustParsePrefix("198.18.0.2/24")},
		Internal: datapath.Interface{Addr: netip.MustParsePrefix("198.18.1.1/24")},
		Rules:    []datapath.RuleConfig{{Name: "web", VIP: vip, Protocol: "tcp", Port: 443, Pool: "l7"}},
		Pools: map[string]datapath.PoolConfig{"l7": {
			Members: []datapath.MemberConfig{
				{Name: "a", Address: memberA, MAC: packet.MAC{0x02, 0, 0, 0, 0x11, 0x11}, Drained: drainA},
				{Name: "b", Address: memberB, MAC: packet.MAC{0x02, 0, 0, 0, 0x11, 0x12}},
			},
			Health: datapath.HealthConfig{Type: "none"},
		}},
	}
}

// ld is a distributor with two workers over in-memory ports, with sync on.
type ld struct {
	d        *datapath.Distributor
	ext, int *port.Mem
}

func startLD(t *testing.T, cfg datapath.Config, after time.Duration) *ld {
	t.Helper()
	l, start := newLD(t, cfg, after)
	start()
	return l
}

// newLD makes an LD whose workers run only once start is called.
func newLD(t *testing.T, cfg datapath.Config, after time.Duration) (l *ld, start func()) {
	t.Helper()
	ext := port.NewMem("ext", extMAC, 2, 1024, 2048)
	in := port.NewMem("int", intMAC, 2, 1024, 2048)
	d, err := datapath.NewDistributor(cfg, datapath.Options{External: ext, Internal: in, Workers: 2, IdleSleep: 20 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.EnableSync(datapath.SyncOptions{After: after, Queue: 1024}); err != nil {
		t.Fatal(err)
	}
	start = func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	return &ld{d: d, ext: ext, int: in}, start
}

// startSyncer runs a syncer for l on loopback; peers are set with SetPeers before
// run is called.
func newSyncer(t *testing.T, l *ld, cfg sessionsync.Config) *sessionsync.Syncer {
	t.Helper()
	cfg.ClusterID, cfg.Key, cfg.Listen = cluster, key, "127.0.0.1:0"
	s, err := sessionsync.New(cfg, l.d, sessionsync.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// run runs s until the test ends or stop is called.
func run(t *testing.T, s *sessionsync.Syncer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("syncer Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func tcp4(t *testing.T, src netip.Addr, sport uint16, syn, ack bool) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: vip.AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: 443, SYN: syn, ACK: ack, Seq: 1000, Window: 64240}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}, ip, tcp)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// send injects frame on the external port's queue q and returns the member (outer
// destination) the LD tunnelled it to.
func (l *ld) send(t *testing.T, q int, frame []byte) netip.Addr {
	t.Helper()
	if l.ext.InjectQueue(q, frame) != 1 {
		t.Fatal("inject failed")
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range l.int.Drain() {
			if len(f) >= 34 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && f[23] == 47 {
				return netip.AddrFrom4([4]byte(f[30:34]))
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("nothing tunnelled")
	return netip.Addr{}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClusterSync: a connection established on LD A, older than sync_after, is
// in LD B's tables with A's member, so its packets reaching B (on another worker
// than on A) go to A's member although B's own scheduler would pick another; a
// flow A never had goes where B schedules it.
func TestClusterSync(t *testing.T) {
	a := startLD(t, ldConfig(false), 200*time.Millisecond)
	b := startLD(t, ldConfig(true), 200*time.Millisecond)
	sa := newSyncer(t, a, sessionsync.Config{FlushInterval: config.Duration(20 * time.Millisecond)})
	sb := newSyncer(t, b, sessionsync.Config{FlushInterval: config.Duration(20 * time.Millisecond)})
	if err := sa.SetPeers([]string{sb.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	if err := sb.SetPeers([]string{sa.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	run(t, sa)
	run(t, sb)

	// Find a client port A schedules to a (A's pool has both members).
	client := netip.MustParseAddr("192.0.2.50")
	var cport uint16
	for p := uint16(40000); p < 40100; p++ {
		if a.send(t, 0, tcp4(t, client, p, true, false)) == memberA {
			cport = p
			break
		}
	}
	if cport == 0 {
		t.Fatal("A scheduled no flow to member a")
	}
	if got := a.send(t, 0, tcp4(t, client, cport, false, true)); got != memberA {
		t.Fatalf("A sent the ACK to %v", got)
	}
	// Both of B's workers install it (the port, not B, chooses the worker).
	waitFor(t, "B to install the entry", func() bool { return b.d.SyncStats().Installed >= 2 })
	if st := sa.Stats(); st.TxEntries == 0 || st.TxDatagrams == 0 {
		t.Fatalf("A's syncer sent nothing: %+v", st)
	}
	for q := range 2 {
		if got := b.send(t, q, tcp4(t, client, cport, false, true)); got != memberA {
			t.Fatalf("B (queue %d) sent the synced flow to %v, want A's member %v", q, got, memberA)
		}
	}
	if got := b.send(t, 1, tcp4(t, client, 50000, false, true)); got != memberB {
		t.Fatalf("B sent a flow it never had to %v, want %v (a is drained on B)", got, memberB)
	}

	// A reset on A: the state change reaches B, whose entries go to close.
	installed := b.d.SyncStats().Installed
	a.send(t, 0, func() []byte {
		f := tcp4(t, client, cport, false, false)
		f[14+20+13] = 0x04 // RST
		return f
	}())
	waitFor(t, "B to apply the state change", func() bool { return b.d.SyncStats().Installed >= installed+2 })
	if st := sb.Stats(); st.Dropped[sessionsync.DropForged]+st.Dropped[sessionsync.DropReplayed] != 0 {
		t.Fatalf("B dropped datagrams of its peer: %v", st.Dropped)
	}
}

// longConns opens on a, from client, three connections that a gives memberA, from
// port from on, and waits until a has marked them sent: long connections its peers
// must learn of. It returns their ports.
func longConns(t *testing.T, a *ld, client netip.Addr, from uint16) []uint16 {
	t.Helper()
	var ports []uint16
	for p := from; len(ports) < 3; p++ {
		if a.send(t, 0, tcp4(t, client, p, true, false)) == memberA {
			a.send(t, 0, tcp4(t, client, p, false, true))
			ports = append(ports, p)
		}
	}
	waitFor(t, "A to mark its connections sent", func() bool { return a.d.SyncStats().Emitted >= 3 })
	return ports
}

// TestWarmUp: a starting LD is not ready until its peer's full sync has arrived,
// and then holds the peer's long connections; with no answer it is ready after the
// warm-up timeout.
func TestWarmUp(t *testing.T) {
	a := startLD(t, ldConfig(false), 50*time.Millisecond)
	sa := newSyncer(t, a, sessionsync.Config{})
	stopA := run(t, sa) // no peers yet: A keeps its connections to itself
	client := netip.MustParseAddr("192.0.2.60")
	ports := longConns(t, a, client, 41000)

	b := startLD(t, ldConfig(true), 50*time.Millisecond)
	sb := newSyncer(t, b, sessionsync.Config{})
	// A learns of B only now: A's peers are fixed while it runs, so A's syncer is
	// replaced by one that knows B (the datapath and its table stay).
	stopA()
	sa2 := newSyncer(t, a, sessionsync.Config{})
	_ = sa2.SetPeers([]string{sb.Addr().String()})
	_ = sb.SetPeers([]string{sa2.Addr().String()})
	if ok, why := sb.Ready(); ok || why == "" {
		t.Fatalf("B ready before its warm-up: %v %q", ok, why)
	}
	run(t, sa2)
	run(t, sb)
	waitFor(t, "B's warm-up", sb.WarmedUp)
	if ok, why := sb.Ready(); !ok || why != "" {
		t.Fatalf("B warmed up but Ready = %v %q", ok, why)
	}
	for _, p := range ports {
		if got := b.send(t, 1, tcp4(t, client, p, false, true)); got != memberA {
			t.Fatalf("after warm-up B sent flow %d to %v, want %v", p, got, memberA)
		}
	}

	// A peer that never answers: ready after the timeout.
	c := startLD(t, ldConfig(true), 50*time.Millisecond)
	sc := newSyncer(t, c, sessionsync.Config{WarmupTimeout: config.Duration(300 * time.Millisecond)})
	_ = sc.SetPeers([]string{"127.0.0.1:9"})
	if sc.WarmedUp() {
		t.Fatal("C warmed up before running")
	}
	run(t, sc)
	waitFor(t, "C's warm-up timeout", sc.WarmedUp)
}

// TestWarmUpWaitsForInstall: the warm-up is over once the peer's full sync is in
// the workers' tables, not when its end marker arrives: B's workers start only after
// A's whole full sync reached B, and B stays not ready until they have installed it,
// then sends A's connections to A's member from its first packet.
func TestWarmUpWaitsForInstall(t *testing.T) {
	a := startLD(t, ldConfig(false), 50*time.Millisecond)
	sa := newSyncer(t, a, sessionsync.Config{})
	client := netip.MustParseAddr("192.0.2.61")
	ports := longConns(t, a, client, 42000)

	b, startB := newLD(t, ldConfig(true), 50*time.Millisecond)
	if !b.d.SyncInstalled()() {
		t.Fatal("nothing queued yet, but SyncInstalled says the workers are behind")
	}
	sb := newSyncer(t, b, sessionsync.Config{})
	_ = sa.SetPeers([]string{sb.Addr().String()})
	_ = sb.SetPeers([]string{sa.Addr().String()})
	run(t, sa)
	run(t, sb)
	const installing = "session sync: installing the peers' full sync"
	waitFor(t, "A's full sync to reach B", func() bool { _, why := sb.Ready(); return why == installing })
	// Every datagram of it has been read (SyncInstall returned before the end
	// marker was seen), and it sits on the rings of workers that do not run.
	barrier := b.d.SyncInstalled()
	time.Sleep(100 * time.Millisecond) // 50 send-loop ticks
	if ok, why := sb.Ready(); ok || sb.WarmedUp() || why != installing {
		t.Fatalf("B's workers have not run, but Ready = %v %q, WarmedUp = %v", ok, why, sb.WarmedUp())
	}
	if barrier() || b.d.SyncStats().Installed != 0 {
		t.Fatalf("workers stopped, but SyncInstalled = %v with %d installed", barrier(), b.d.SyncStats().Installed)
	}

	startB()
	waitFor(t, "B's warm-up", sb.WarmedUp)
	if !barrier() {
		t.Fatal("B warmed up before its workers applied the entries queued before the barrier")
	}
	// Two workers each hold a copy of A's three connections.
	if got := b.d.SyncStats().Installed; got < 6 {
		t.Fatalf("B warmed up with %d entries installed, want A's 3 in each of 2 workers", got)
	}
	for _, p := range ports {
		if got := b.send(t, 1, tcp4(t, client, p, false, true)); got != memberA {
			t.Fatalf("after warm-up B sent flow %d to %v, want %v", p, got, memberA)
		}
	}
}

// TestForgedChangesNothing: datagrams with the wrong key, of another cluster,
// replayed, or from an address that is not a peer are dropped and counted, and
// change nothing in the tables; the same entry, properly sealed, is installed.
func TestForgedChangesNothing(t *testing.T) {
	b := startLD(t, ldConfig(true), time.Second)
	sb := newSyncer(t, b, sessionsync.Config{})
	peer, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	_ = sb.SetPeers([]string{peer.LocalAddr().String()})
	run(t, sb)

	client := netip.MustParseAddr("192.0.2.70")
	entry := func(port uint16, op sessionsync.Op) sessionsync.Entry {
		e := sessionsync.Entry{Client: client.As16(), ClientPort: port, VIP: vip.As16(), VIPPort: 443, Proto: 6,
			Member: memberA.As16(), State: conntrack.StateEstablished, TTL: 900, Op: op, Encap: sessionsync.EncapGRE}
		if op == sessionsync.OpDelete {
			e.State = 0
		}
		return e
	}
	seal := func(cl uint32, k []byte, seq uint64, es ...sessionsync.Entry) []byte {
		bt, _ := sessionsync.NewBatch(1472)
		bt.Reset(sessionsync.MsgEntries, cl, seq)
		for i := range es {
			bt.Add(&es[i])
		}
		return append([]byte(nil), bt.Seal(sessionsync.NewMAC(k))...)
	}
	to := net.UDPAddrFromAddrPort(sb.Addr())
	send := func(c *net.UDPConn, msg []byte) {
		if _, err := c.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
	}
	dropped := func(reason string) func() bool {
		return func() bool { return sb.Stats().Dropped[reason] >= 1 }
	}
	seq := uint64(time.Now().UnixNano())
	send(peer, seal(cluster, []byte("not the cluster key, but 32 bytes long"), seq, entry(1001, sessionsync.OpUpsert)))
	waitFor(t, "the forged datagram to be dropped", dropped(sessionsync.DropForged))
	send(peer, seal(cluster+1, key, seq+1, entry(1002, sessionsync.OpUpsert)))
	waitFor(t, "the foreign datagram to be dropped", dropped(sessionsync.DropForeign))
	send(stranger, seal(cluster, key, seq+2, entry(1003, sessionsync.OpUpsert)))
	waitFor(t, "the stranger's datagram to be dropped", dropped(sessionsync.DropUnknownPeer))
	send(peer, []byte("TS\x01\x01 too short"))
	waitFor(t, "the malformed datagram to be dropped", dropped(sessionsync.DropMalformed))

	// A good datagram installs its entry (in both workers); a later deletion
	// removes it; the good datagram replayed is dropped and does not bring it back.
	good := seal(cluster, key, seq+10, entry(1004, sessionsync.OpUpsert))
	send(peer, good)
	waitFor(t, "the good entry to be installed", func() bool { return b.d.SyncStats().Installed >= 2 })
	send(peer, seal(cluster, key, seq+11, entry(1004, sessionsync.OpDelete)))
	waitFor(t, "the deletion", func() bool { return b.d.SyncStats().Installed >= 4 })
	send(peer, good)
	waitFor(t, "the replay to be dropped", dropped(sessionsync.DropReplayed))

	st := b.d.SyncStats()
	if st.Installed != 4 {
		t.Fatalf("installed %d entries, want 4 (one upsert and one delete, in two workers): %+v", st.Installed, st)
	}
	for _, p := range []uint16{1001, 1002, 1003, 1004} {
		for q := range 2 {
			if got := b.send(t, q, tcp4(t, client, p, false, true)); got != memberB {
				t.Fatalf("flow %d (queue %d) went to %v, want %v: a dropped datagram changed the table", p, q, got, memberB)
			}
		}
	}
	if st := sb.Stats(); st.RxDatagrams != 2 {
		t.Fatalf("accepted %d datagrams, want 2: %+v", st.RxDatagrams, st)
	}
}

// TestFullSyncSendsCopiesOnce: an entry received from a peer sits in each of the
// two workers' tables, but a full sync sends it once (from worker 0), and the peer
// that made the flow keeps its own entry (kept).
func TestFullSyncSendsCopiesOnce(t *testing.T) {
	a := startLD(t, ldConfig(false), 50*time.Millisecond)
	b := startLD(t, ldConfig(true), 50*time.Millisecond)
	sa := newSyncer(t, a, sessionsync.Config{FlushInterval: config.Duration(10 * time.Millisecond)})
	sb := newSyncer(t, b, sessionsync.Config{FlushInterval: config.Duration(10 * time.Millisecond)})
	_ = sa.SetPeers([]string{sb.Addr().String()})
	_ = sb.SetPeers([]string{sa.Addr().String()})
	run(t, sa)
	run(t, sb)
	waitFor(t, "the warm-ups", func() bool {
		return sa.WarmedUp() && sb.WarmedUp() && sa.Stats().FullSyncs > 0 && sb.Stats().FullSyncs > 0
	})
	client := netip.MustParseAddr("192.0.2.80")
	a.send(t, 0, tcp4(t, client, 42000, true, false))
	a.send(t, 0, tcp4(t, client, 42000, false, true))
	waitFor(t, "B to install the entry in both workers", func() bool { return b.d.SyncStats().Installed >= 2 })

	before := sb.Stats()
	sb.FullSync()
	waitFor(t, "B's full sync", func() bool { return sb.Stats().FullSyncs > before.FullSyncs })
	if n := sb.Stats().TxEntries - before.TxEntries; n != 1 {
		t.Fatalf("B's full sync sent %d entries, want 1 (one flow, held by two workers)", n)
	}
	waitFor(t, "A to keep its own entry", func() bool { return a.d.SyncStats().Kept >= 1 })
}
