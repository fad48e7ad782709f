package packet

import (
	"math"
	"math/bits"
	"net/netip"
	"testing"
)

func flow(src, dst netip.Addr, sp, dp uint16, proto uint8) *Packet {
	return &Packet{Src: src, Dst: dst, SrcPort: sp, DstPort: dp, Proto: proto}
}

func TestFlowHashInputs(t *testing.T) {
	base := flow(client4, vip4, 40000, 443, ProtoTCP)
	h := FlowHash(1, base)
	if FlowHash(1, flow(client4, vip4, 40000, 443, ProtoTCP)) != h {
		t.Fatal("not deterministic")
	}
	// Fields the Packet carries but the hash must ignore.
	q := *base
	q.TTL, q.L3, q.L4, q.End, q.TCPFlags, q.VLAN = 9, 1, 2, 3, TCPSyn, 7
	if FlowHash(1, &q) != h {
		t.Error("depends on fields outside the 5-tuple")
	}
	for name, p := range map[string]*Packet{
		"seed":     base,
		"src":      flow(netip.MustParseAddr("198.51.100.8"), vip4, 40000, 443, ProtoTCP),
		"dst":      flow(client4, netip.MustParseAddr("203.0.113.11"), 40000, 443, ProtoTCP),
		"sport":    flow(client4, vip4, 40001, 443, ProtoTCP),
		"dport":    flow(client4, vip4, 40000, 444, ProtoTCP),
		"proto":    flow(client4, vip4, 40000, 443, ProtoUDP),
		"swapped":  flow(vip4, client4, 443, 40000, ProtoTCP),
		"ports sw": flow(client4, vip4, 443, 40000, ProtoTCP),
		"mapped":   flow(netip.AddrFrom16(client4.As16()), netip.AddrFrom16(vip4.As16()), 40000, 443, ProtoTCP),
		"v4-compat": flow(netip.AddrFrom16([16]byte{12: 198, 13: 51, 14: 100, 15: 7}),
			netip.AddrFrom16([16]byte{12: 203, 13: 0, 14: 113, 15: 10}), 40000, 443, ProtoTCP),
	} {
		seed := uint64(1)
		if name == "seed" {
			seed = 2
		}
		if FlowHash(seed, p) == h {
			t.Errorf("%s: same hash", name)
		}
	}
	z := flow(client6.WithZone("eth0"), vip6, 1, 2, ProtoUDP)
	if FlowHash(1, z) != FlowHash(1, flow(client6, vip6, 1, 2, ProtoUDP)) {
		t.Error("zone changes the hash")
	}
	if n := testing.AllocsPerRun(10, func() { FlowHash(1, z) }); n != 0 {
		t.Errorf("zoned address: %v allocations", n)
	}
	ph := PairHash(1, client6, vip6)
	if PairHash(1, client6, vip6) != ph || PairHash(2, client6, vip6) == ph || PairHash(1, vip6, client6) == ph {
		t.Error("PairHash: not deterministic or ignores seed or order")
	}
}

// chiSquare buckets n hashes into k buckets and returns the normalised statistic
// (≈ 1 for a uniform hash).
func chiSquare(k int, n int, h func(i int) uint64) float64 {
	counts := make([]int, k)
	for i := range n {
		// The top bits and the low bits are both used by callers (Maglev takes a
		// modulus, sharding takes bits); test with the modulus of a prime.
		counts[h(i)%uint64(k)]++
	}
	exp := float64(n) / float64(k)
	var x float64
	for _, c := range counts {
		d := float64(c) - exp
		x += d * d / exp
	}
	return x / float64(k-1)
}

func TestFlowHashDistribution(t *testing.T) {
	const k, n = 1021, 65536
	cases := map[string]func(i int) uint64{
		"v4 source ports": func(i int) uint64 {
			return FlowHash(7, flow(client4, vip4, uint16(i), 443, ProtoTCP))
		},
		"v4 sequential clients": func(i int) uint64 {
			a := client4.As4()
			a[2], a[3] = byte(i>>8), byte(i)
			return FlowHash(7, flow(netip.AddrFrom4(a), vip4, 40000, 443, ProtoTCP))
		},
		"v6 sequential clients": func(i int) uint64 {
			a := client6.As16()
			a[13], a[14], a[15] = byte(i>>16), byte(i>>8), byte(i)
			return FlowHash(7, flow(netip.AddrFrom16(a), vip6, 40000, 443, ProtoUDP))
		},
		"pair sequential": func(i int) uint64 {
			a := client4.As4()
			a[1], a[2], a[3] = byte(i>>16), byte(i>>8), byte(i)
			return PairHash(7, netip.AddrFrom4(a), vip4)
		},
	}
	for name, h := range cases {
		if x := chiSquare(k, n, h); x > 1.2 || x < 0.8 {
			t.Errorf("%s: chi-square/df %.3f, want ≈ 1", name, x)
		}
		// High bits too.
		if x := chiSquare(k, n, func(i int) uint64 { return h(i) >> 40 }); x > 1.2 {
			t.Errorf("%s: top bits chi-square/df %.3f", name, x)
		}
	}
}

// TestFlowHashAvalanche flips each input bit of the source port and address and
// checks that about half the output bits change.
func TestFlowHashAvalanche(t *testing.T) {
	const trials = 2000
	var total, count float64
	for i := range trials {
		a := client4.As4()
		a[3] = byte(i)
		p := flow(netip.AddrFrom4(a), vip4, uint16(i*7919), 443, ProtoTCP)
		h := FlowHash(uint64(i), p)
		for bit := range 16 {
			q := *p
			q.SrcPort ^= 1 << bit
			total += float64(bits.OnesCount64(h ^ FlowHash(uint64(i), &q)))
			count++
		}
		for bit := range 32 {
			b := a
			b[bit/8] ^= 1 << (bit % 8)
			q := *p
			q.Src = netip.AddrFrom4(b)
			total += float64(bits.OnesCount64(h ^ FlowHash(uint64(i), &q)))
			count++
		}
	}
	if avg := total / count; math.Abs(avg-32) > 0.5 {
		t.Errorf("average output bits flipped %.2f, want ≈ 32", avg)
	}
}
