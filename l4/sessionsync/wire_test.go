package sessionsync

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/tiergate/tiergate/l4/conntrack"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func a16(s string) [16]byte { return netip.MustParseAddr(s).As16() }

func sampleEntries() []Entry {
	return []Entry{
		{Client: a16("192.0.2.10"), ClientPort: 40000, VIP: a16("198.51.100.1"), VIPPort: 443, Proto: 6,
			Member: a16("198.18.1.20"), State: conntrack.StateEstablished, Op: OpUpsert, Encap: EncapGRE, TTL: 899},
		{Client: a16("2001:db8::10"), ClientPort: 5353, VIP: a16("2001:db8:1::1"), VIPPort: 443, Proto: 17,
			Member: a16("198.18.1.21"), State: conntrack.StateUDP, Op: OpUpsert, Encap: EncapIPIP, TTL: 300},
		{Client: a16("192.0.2.11"), ClientPort: 40001, VIP: a16("198.51.100.1"), VIPPort: 443, Proto: 6,
			Member: a16("2001:db8:2::20"), State: conntrack.StateFin, Op: OpUpsert, Encap: EncapGREKey, TTL: 60},
		{Client: a16("192.0.2.12"), ClientPort: 40002, VIP: a16("198.51.100.1"), VIPPort: 443, Proto: 6,
			Member: [16]byte{10: 0xff, 11: 0xff}, Op: OpDelete, Encap: EncapGRE},
		{Client: a16("2001:db8::13"), ClientPort: 40003, VIP: a16("2001:db8:1::1"), VIPPort: 443, Proto: 6,
			Member: a16("2001:db8:2::20"), State: conntrack.StateEstablished, Op: OpUpsert, Encap: EncapGRE, TTL: 900,
			Proxied: true, Proxy: conntrack.Proxy{SeqDelta: 0x89abcdef, TSDelta: 0xfffff000, WShift: -3,
				Flags: conntrack.ProxyOn | conntrack.ProxyTS | conntrack.ProxyWScale | conntrack.ProxySACK}},
	}
}

func seal(t testing.TB, typ MsgType, cluster uint32, seq uint64, key []byte, es []Entry) []byte {
	b, err := NewBatch(1472)
	if err != nil {
		t.Fatal(err)
	}
	b.Reset(typ, cluster, seq)
	for i := range es {
		if !b.Add(&es[i]) {
			t.Fatalf("entry %d does not fit", i)
		}
	}
	return bytes.Clone(b.Seal(NewMAC(key)))
}

func TestRoundTrip(t *testing.T) {
	es := sampleEntries()
	msg := seal(t, MsgEntries, 7, 42, testKey, es)
	h, body, err := Open(msg, NewMAC(testKey), 7)
	if err != nil {
		t.Fatal(err)
	}
	if h.Type != MsgEntries || h.Cluster != 7 || h.Seq != 42 || h.Count != len(es) {
		t.Fatalf("header %+v", h)
	}
	got, err := Decode(nil, body, h.Count)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(es) {
		t.Fatalf("%d entries, want %d", len(got), len(es))
	}
	for i := range es {
		if got[i] != es[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], es[i])
		}
	}
	if want := HeaderLen + 24 + 48 + 36 + 24 + 60 + 10 + MACLen; len(msg) != want {
		t.Errorf("datagram is %d bytes, want %d", len(msg), want)
	}
}

func TestBatchFillsToSize(t *testing.T) {
	b, _ := NewBatch(1472)
	b.Reset(MsgEntries, 1, 1)
	e := sampleEntries()[0]
	n := 0
	for b.Add(&e) {
		n++
	}
	if want := (1472 - HeaderLen - MACLen) / 24; n != want {
		t.Fatalf("%d IPv4 entries in a 1472-byte datagram, want %d", n, want)
	}
	if msg := b.Seal(NewMAC(testKey)); len(msg) > 1472 {
		t.Fatalf("datagram of %d bytes exceeds 1472", len(msg))
	}
	if _, err := NewBatch(MinDatagram - 1); err == nil {
		t.Fatal("NewBatch accepted a size below MinDatagram")
	}
}

func TestOpenRejects(t *testing.T) {
	msg := seal(t, MsgEntries, 7, 1, testKey, sampleEntries())
	flip := func(i int) []byte { m := bytes.Clone(msg); m[i] ^= 1; return m }
	cases := []struct {
		name string
		msg  []byte
		want error
	}{
		{"short", msg[:HeaderLen+MACLen-1], ErrShort},
		{"magic", flip(0), ErrMagic},
		{"version", flip(2), ErrVersion},
		{"cluster", seal(t, MsgEntries, 8, 1, testKey, nil), ErrCluster},
		{"tampered entry", flip(HeaderLen + 14), ErrAuth},
		{"tampered sequence", flip(12), ErrAuth},
		{"tampered mac", flip(len(msg) - 1), ErrAuth},
		{"other key", seal(t, MsgEntries, 7, 1, []byte("another key of at least 32 bytes!!"), sampleEntries()), ErrAuth},
		{"truncated", msg[:len(msg)-1], ErrAuth},
		{"type", seal(t, 9, 7, 1, testKey, nil), ErrType},
		{"request with body", seal(t, MsgFullSyncRequest, 7, 1, testKey, sampleEntries()[:1]), ErrEntry},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Open(c.msg, NewMAC(testKey), 7)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := sampleEntries()[0]
	enc := appendEntry(nil, &good)
	cases := []struct {
		name string
		mod  func(b []byte) []byte
	}{
		{"reserved flags", func(b []byte) []byte { b[0] |= 0x80; return b }},
		{"op", func(b []byte) []byte { b[0] = b[0]&^3 | 3; return b }},
		{"proto", func(b []byte) []byte { b[1] = 1; return b }},
		{"state", func(b []byte) []byte { b[2] = byte(conntrack.StateSynRecv); return b }},
		{"encap", func(b []byte) []byte { b[3] = 0; return b }},
		{"short", func(b []byte) []byte { return b[:len(b)-1] }},
		{"trailing", func(b []byte) []byte { return append(b, 0) }},
		{"delete with state", func(b []byte) []byte { b[0] = b[0]&^3 | byte(OpDelete); return b }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.mod(bytes.Clone(enc))
			if _, err := Decode(nil, b, 1); err == nil {
				t.Fatal("decoded a bad entry")
			} else if !errors.Is(err, ErrEntry) && !errors.Is(err, ErrShort) {
				t.Fatalf("err %v is neither ErrEntry nor ErrShort", err)
			}
		})
	}
	// A mapped IPv4 address in an IPv6 field.
	e := sampleEntries()[1]
	b := appendEntry(nil, &e)
	copy(b[12:28], netip.MustParseAddr("::ffff:192.0.2.1").AsSlice())
	if _, err := Decode(nil, b, 1); !errors.Is(err, ErrEntry) {
		t.Fatalf("mapped address: err %v", err)
	}
}

func TestWindow(t *testing.T) {
	var w Window
	steps := []struct {
		seq uint64
		ok  bool
	}{
		{1000, true}, {1000, false}, {999, true}, {999, false}, {1001, true}, {950, true}, {950, false},
		{1100, true}, {1001, false}, {1037, true}, {1036, false}, {1037, false}, {5000, true}, {4937, true}, {4936, false},
	}
	for i, s := range steps {
		if got := w.Accept(s.seq); got != s.ok {
			t.Fatalf("step %d: Accept(%d) = %v, want %v", i, s.seq, got, s.ok)
		}
	}
}

// FuzzOpen feeds arbitrary datagrams to the parser: it must never panic, and what it
// accepts must re-encode to the same bytes.
func FuzzOpen(f *testing.F) {
	f.Add(seal(f, MsgEntries, 7, 1, testKey, sampleEntries()))
	f.Add(seal(f, MsgFullSyncRequest, 7, 2, testKey, nil))
	f.Add(seal(f, MsgFullSyncDone, 7, 3, testKey, nil))
	f.Add([]byte("TS\x01\x01"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		mac := NewMAC(testKey)
		h, body, err := Open(msg, mac, 7)
		if err != nil {
			// Without the key the fuzzer cannot forge a MAC: decode the body on
			// its own, so the entry parser is explored too.
			if len(msg) > HeaderLen {
				_, _ = Decode(nil, msg[HeaderLen:], int(msg[HeaderLen-1]))
			}
			return
		}
		es, err := Decode(nil, body, h.Count)
		if err != nil {
			return
		}
		b, _ := NewBatch(MaxDatagram)
		b.Reset(h.Type, h.Cluster, h.Seq)
		for i := range es {
			b.Add(&es[i])
		}
		if out := b.Seal(mac); !bytes.Equal(out, msg) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", msg, out)
		}
	})
}

// FuzzDecode explores the entry parser directly: entries it accepts re-encode to
// the same bytes.
func FuzzDecode(f *testing.F) {
	for _, e := range sampleEntries() {
		f.Add(appendEntry(nil, &e), 1)
	}
	f.Add(appendEntry(appendEntry(nil, &sampleEntries()[0]), &sampleEntries()[1]), 2)
	f.Fuzz(func(t *testing.T, body []byte, count int) {
		if count < 0 || count > 64 {
			return
		}
		es, err := Decode(nil, body, count)
		if err != nil {
			return
		}
		var out []byte
		for i := range es {
			out = appendEntry(out, &es[i])
		}
		if !bytes.Equal(out, body) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", body, out)
		}
	})
}
