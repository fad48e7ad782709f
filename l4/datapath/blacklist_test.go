package datapath

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// listOf is a list holding addrs.
func listOf(name string, addrs ...netip.Addr) *blacklist.List {
	var b blacklist.Builder
	for _, a := range addrs {
		b.AddAddr(a, time.Time{})
	}
	l := blacklist.NewList(name, blacklist.Options{})
	l.Replace(b.Build())
	return l
}

// noFrames checks that p sends nothing for a while.
func noFrames(t *testing.T, p interface{ Drain() [][]byte }, what string) {
	t.Helper()
	time.Sleep(30 * time.Millisecond)
	if got := p.Drain(); len(got) != 0 {
		t.Fatalf("%s: %d frames sent, want none", what, len(got))
	}
}

// waitSweep waits until the workers' sweeps completed exceed before.
func (r *rig) waitSweep(before uint64) {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for r.d.Status().Blacklist.Sweeps <= before {
		if time.Now().After(deadline) {
			r.t.Fatalf("no sweep of the connection table completed after the blacklist changed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBlacklistDropsSources: a listed client's SYN is dropped (in/blacklisted, a hit
// of the list that has it, no entry) while an unlisted one's is tunnelled; an
// established flow of a client listed afterwards is cut at its next packet and
// resumes once the client is taken off; with no lists nothing is checked.
func TestBlacklistDropsSources(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := startRig(t, testConfig(), Options{Registerer: reg})
	r.resolve()
	listed := netip.MustParseAddr("192.0.2.66")
	other := listOf("other", netip.MustParseAddr("198.51.100.9"))
	global := listOf(blacklist.GlobalName, listed)
	r.d.SetBlacklists(other, nil, global)
	if st := r.d.Status().Blacklist; !slices.Equal(st.Lists, []string{"other", "global"}) || !slices.Equal(st.Entries, []int{1, 1}) {
		t.Fatalf("status: lists %q of %v entries, want other and global of 1", st.Lists, st.Entries)
	}

	r.ext.Inject(tcp4(t, listed, 40000, vip, 443, true, false, nil))
	r.waitCount(dirIn, resBlacklisted, 1)
	noFrames(t, r.int, "a listed client's SYN")
	if n := global.Hits(blacklist.SourcePacket); n != 1 {
		t.Errorf("global list: %d packet hits, want 1", n)
	}
	if n := other.Hits(blacklist.SourcePacket); n != 0 {
		t.Errorf("other list: %d packet hits, want 0", n)
	}
	// An unlisted client is tunnelled; its flow is established.
	r.ext.Inject(tcp4(t, client, 40001, vip, 443, true, false, nil))
	tu := decodeTunnelled(t, waitSent(t, r.int, 1)[0])
	r.ext.Inject(tcp4(t, client, 40001, vip, 443, false, true, nil))
	if tu2 := decodeTunnelled(t, waitSent(t, r.int, 1)[0]); tu2.outerDst != tu.outerDst {
		t.Fatalf("the ACK went to %s, the SYN to %s", tu2.outerDst, tu.outerDst)
	}
	// UDP and fragments are checked too.
	r.ext.Inject(udp4(t, listed, 5000, vip, 443, []byte("quic?")))
	r.waitCount(dirIn, resBlacklisted, 2)

	// The established flow's client is listed: its next packet is dropped.
	var b blacklist.Builder
	b.AddAddr(listed, time.Time{})
	b.AddAddr(client, time.Time{})
	sweeps := r.d.Status().Blacklist.Sweeps
	global.Replace(b.Build())
	r.waitSweep(sweeps)
	if st := r.d.Status().Blacklist; st.FlowsRemoved != 1 {
		t.Fatalf("after the sweep: %+v, want 1 flow removed", st)
	}
	r.ext.Inject(tcp4(t, client, 40001, vip, 443, false, true, []byte("GET /")))
	r.waitCount(dirIn, resBlacklisted, 3)
	noFrames(t, r.int, "an established flow of a client listed since")

	// Taken off the list, the flow resumes with the same member.
	if err := global.Apply(&blacklist.Delta{Remove: []netip.Prefix{netip.PrefixFrom(client, 32)}}); err != nil {
		t.Fatal(err)
	}
	r.ext.Inject(tcp4(t, client, 40001, vip, 443, false, true, []byte("GET /")))
	if tu3 := decodeTunnelled(t, waitSent(t, r.int, 1)[0]); tu3.outerDst != tu.outerDst {
		t.Fatalf("after the client was taken off the list its flow went to %s, before to %s", tu3.outerDst, tu.outerDst)
	}

	// No lists: the listed client is tunnelled.
	r.d.SetBlacklists()
	if got := r.d.Blacklists(); len(got) != 0 {
		t.Fatalf("Blacklists() = %d lists after SetBlacklists(), want none", len(got))
	}
	r.ext.Inject(tcp4(t, listed, 40002, vip, 443, true, false, nil))
	waitSent(t, r.int, 1)

	waitMetrics(t, reg, map[string]float64{
		`tiergate_l4_packets_total{dir=in,result=blacklisted}`: 3,
		`tiergate_l4_blacklist_flows_removed_total`:            1,
	})
	if n := r.d.Status().Packets["in/blacklisted"]; n != 3 {
		t.Errorf("status: in/blacklisted = %d, want 3", n)
	}
}
