package l4d

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/sessionsync"
)

func TestSyncConfig(t *testing.T) {
	good := minimal + "sync: {cluster_id: 7, key_file: /etc/tiergate/sync.key, peers: [\"198.18.1.3\", \"198.18.1.4:9200\"]}\n"
	cfg, err := ParseConfig([]byte(good), "l4d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Sync
	if s.Listen != ":9187" || s.SyncAfter.D() != 3*time.Second || s.FlushInterval.D() != 100*time.Millisecond ||
		s.FullSyncEvery.D() != 4*time.Minute || s.WarmupTimeout.D() != 30*time.Second || s.MTU != 1500 || s.FullSyncRate != 250000 {
		t.Fatalf("defaults not filled in: %+v", s)
	}
	cases := []struct{ name, in, err string }{
		{"no cluster", "sync: {key_file: k}\n", "sync.cluster_id: is required (not 0)"},
		{"no key", "sync: {cluster_id: 1}\n", "sync.key_file: is required"},
		{"bad peer", "sync: {cluster_id: 1, key_file: k, peers: [ld-b]}\n", `sync.peers[0]: "ld-b": neither an address nor address:port`},
		{"bad listen", "sync: {cluster_id: 1, key_file: k, listen: \"eth1:9187\"}\n", `sync.listen: "eth1:9187"`},
		{"negative sync_after", "sync: {cluster_id: 1, key_file: k, sync_after: -1s}\n", "sync.sync_after: -1s is outside 0..24h"},
		{"mtu", "sync: {cluster_id: 1, key_file: k, mtu: 100}\n", "sync.mtu: 100 is outside 576..65535"},
		{"unknown field", "sync: {cluster_id: 1, key_file: k, every: 1m}\n", "field every not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(minimal+c.in), "l4d.yaml")
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("err %v, want it to contain %q", err, c.err)
			}
		})
	}
}

// TestSyncWiring: l4d with a sync section installs the entries its peer sends (in
// both workers, counted in /metrics), drops a forged datagram, and is warmed up
// once its peer's full sync is done.
func TestSyncWiring(t *testing.T) {
	peer, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	dir := t.TempDir()
	key := "0123456789abcdef0123456789abcdef"
	writeFile(t, filepath.Join(dir, "sync.key"), key+"\n")
	td := startWith(t, testConfig+fmt.Sprintf("sync: {cluster_id: 16, key_file: %s, listen: \"127.0.0.1:0\", peers: [%q], warmup_timeout: 1h}\n",
		filepath.Join(dir, "sync.key"), peer.LocalAddr().String()))
	if ok, why := td.sync.syncer.Ready(); ok || !strings.Contains(why, "full sync") {
		t.Fatalf("ready before the warm-up: %v %q", ok, why)
	}
	// The warm-up is the announce gate "warmup", closed for now.
	gate := func() AnnounceGate {
		td.bgp.mu.Lock()
		defer td.bgp.mu.Unlock()
		for _, g := range td.bgp.gates {
			if g.name == "warmup" {
				return g.gate
			}
		}
		return nil
	}()
	if gate == nil {
		t.Fatal("no warmup announce gate")
	}
	if ok, _ := gate(); ok {
		t.Fatal("the warmup gate is open before the peer's full sync")
	}
	to := net.UDPAddrFromAddrPort(td.sync.syncer.Addr())
	seq := uint64(time.Now().UnixNano())
	seal := func(typ sessionsync.MsgType, k string, es ...sessionsync.Entry) []byte {
		b, _ := sessionsync.NewBatch(1472)
		b.Reset(typ, 16, seq)
		seq++
		for i := range es {
			b.Add(&es[i])
		}
		return append([]byte(nil), b.Seal(sessionsync.NewMAC([]byte(k)))...)
	}
	e := sessionsync.Entry{Client: netip.MustParseAddr("192.0.2.9").As16(), ClientPort: 40000,
		VIP: netip.MustParseAddr("203.0.113.10").As16(), VIPPort: 443, Proto: 6,
		Member: netip.MustParseAddr("10.0.0.12").As16(), State: conntrack.StateEstablished, TTL: 900,
		Op: sessionsync.OpUpsert, Encap: sessionsync.EncapGRE}
	for _, msg := range [][]byte{
		seal(sessionsync.MsgEntries, "a forged key, also 32 bytes long.."+"!", e),
		seal(sessionsync.MsgEntries, key, e),
		seal(sessionsync.MsgFullSyncDone, key),
	} {
		if _, err := peer.WriteToUDP(msg, to); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := td.want("GET", "/metrics", "", 200)
		if strings.Contains(m, "\ntiergate_l4_sync_installed_total 2\n") &&
			strings.Contains(m, `tiergate_l4_sync_dropped_total{reason="forged"} 1`) &&
			strings.Contains(m, "\ntiergate_l4_sync_warmed_up 1\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sync not seen in the metrics:\n%s", brief(m))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ok, _ := gate(); !ok {
		t.Fatal("the warmup gate is closed after the peer's full sync")
	}
	if ok, why := td.sync.syncer.Ready(); !ok {
		t.Fatalf("not ready after the peer's full sync: %q\n%s", why, brief(td.want("GET", "/metrics", "", 200)))
	}
}
