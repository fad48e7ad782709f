package datapath

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// randomList is a list of n random IPv4 addresses, none in 10.0.0.0/8 (where the
// benchmarks' clients are).
func randomList(n int, seed uint64) *blacklist.List {
	rng := rand.New(rand.NewPCG(seed, 1))
	var bld blacklist.Builder
	for bld.Len() < n {
		v := rng.Uint32()
		if v>>24 == 10 {
			continue
		}
		bld.AddAddr(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), time.Time{})
	}
	l := blacklist.NewList(blacklist.GlobalName, blacklist.Options{})
	l.Replace(bld.Build())
	return l
}

// BenchmarkPollEstablishedBlacklist1M is BenchmarkPollEstablished with a 1M-entry
// IPv4 list in force that none of the sources is on: the flows were looked up when
// they were made, their packets are not (only the lists' versions, once a burst).
func BenchmarkPollEstablishedBlacklist1M(b *testing.B) {
	const flows = 1 << 20
	w, _ := benchWorker(b, 2*flows)
	w.d.SetBlacklists(randomList(1_000_000, 7))
	pollEstablished(b, w, flows)
}

// BenchmarkHandleNewFlowBlacklist1M is BenchmarkHandleNewFlow with a 1M-entry IPv4
// list in force that none of the sources is on: every SYN is looked up.
func BenchmarkHandleNewFlowBlacklist1M(b *testing.B) {
	const flows = 1 << 20
	w, s := benchWorker(b, 4*flows)
	w.d.SetBlacklists(randomList(1_000_000, 7))
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
