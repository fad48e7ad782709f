package blacklist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

var textSeeds = []string{
	"",
	"203.0.113.7\n",
	"# comment only\n\n   \n",
	"198.51.100.0/24 # range\r\n2001:db8::/32\n",
	"2001:db8::1 expires=2026-12-01T00:00:00Z\n10.0.0.1 ttl=3600s\n10.0.0.2 ttl=90\n10.0.0.3 expires=1800000000\n",
	"::ffff:192.0.2.1\n::ffff:192.0.2.0/120\nfe80::1%eth0\n::/0\n0.0.0.0/0\n",
	"10.0.0.0/33\nbad\n1.2.3.4 ttl=-1s\n",
	"1.2.3.4 expires=2001-01-01T00:00:00Z\n",
	"\xef\xbb\xbf10.0.0.1",
}

// fuzzLimits are upload limits small enough that fuzz inputs pass them.
var fuzzLimits = limits{body: 2048, binary: 1024, text: 1024, entries: 16, named: true}

// bombSeeds are gzip streams that inflate far more than fuzzLimits allow.
func bombSeeds(f *testing.F) [][]byte {
	return [][]byte{
		gzipBomb(f, nil, "\n", 4<<20),
		gzipBomb(f, nil, "10.0.0.1\n", 4<<20),
		gzipBomb(f, nil, commentLine, 4<<20),
		gzipBomb(f, binaryBombHead(1<<40), "\x00", 4<<20),
		gzipBomb(f, binaryBombHead(0), "\x00", 4<<20),
		gzipBomb(f, binaryBombHead(1<<20), "\x01", 4<<20),
	}
}

// checkLimited reads data as an upload within fuzzLimits: it is refused, or what it
// gives holds no more entries than allowed; and a body over the limit is refused.
func checkLimited(t *testing.T, data []byte) {
	s, err := read(bytes.NewReader(data), t0, fuzzLimits)
	if err != nil {
		if s != nil {
			t.Fatalf("set %v with err %v", s, err)
		}
		return
	}
	if len(data) > int(fuzzLimits.body) {
		t.Fatalf("a %d-byte body over max_body_bytes %d was taken", len(data), fuzzLimits.body)
	}
	if s.Len() > fuzzLimits.entries {
		t.Fatalf("%d entries taken, over max_entries %d", s.Len(), fuzzLimits.entries)
	}
}

func FuzzParseText(f *testing.F) {
	for _, s := range textSeeds {
		f.Add([]byte(s))
	}
	for _, b := range bombSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkLimited(t, data)
		s, err := parseText(bytes.NewReader(data), t0, fileLimits)
		if err != nil {
			var pes *ParseErrors
			if s != nil || !errors.As(err, &pes) && !errors.Is(err, ErrTooManyEntries) {
				t.Fatalf("set %v, err %v", s, err)
			}
			if pes != nil && (pes.Count == 0 || len(pes.Errors) == 0 || pes.Errors[0].Line < 1) {
				t.Fatalf("empty ParseErrors: %+v", pes)
			}
			return
		}
		var text bytes.Buffer
		if err := WriteText(&text, s); err != nil {
			t.Fatal(err)
		}
		back, err := parseText(&text, t0, fileLimits)
		if err != nil {
			t.Fatalf("reading back our own text: %v\n%s", err, text.String())
		}
		assertSameSet(t, s, back)
		back, err = decodeBinary(encode(t, s), t0)
		if err != nil {
			t.Fatalf("reading back our own binary: %v", err)
		}
		assertSameSet(t, s, back)
	})
}

func FuzzReadBinary(f *testing.F) {
	f.Add(encode(f, emptySet))
	f.Add(encode(f, sampleSet()))
	f.Add(gz(encode(f, sampleSet())))
	f.Add(frame(0, 2, 5, 7, 0, 0, 0, 0, 0, 0, 0))
	f.Add(frame(0, 0, 1, 0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0))
	f.Add([]byte("\x89TGBL\r\n\x1a\x00\x01\x00\x00"))
	f.Add(frame(binary.AppendUvarint(nil, 1<<40)...))
	for _, b := range bombSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkLimited(t, data)
		check := func(data []byte) {
			s, err := decodeBinary(data, t0)
			if err != nil {
				var be *BinaryError
				if s != nil || !errors.As(err, &be) {
					t.Fatalf("set %v, err %v", s, err)
				}
				return
			}
			back, err := decodeBinary(encode(t, s), t0)
			if err != nil {
				t.Fatalf("reading back our own binary: %v", err)
			}
			assertSameSet(t, s, back)
		}
		check(data)
		// Read in pieces of one byte, the stream gives the same answer.
		whole, werr := decodeBinary(data, t0)
		piece, perr := readBinary(&oneByte{bytes.NewReader(data)}, t0, fileLimits)
		if (werr == nil) != (perr == nil) || werr != nil && werr.Error() != perr.Error() {
			t.Fatalf("whole: %v; a byte at a time: %v", werr, perr)
		}
		if werr == nil {
			assertSameSet(t, whole, piece)
		}
		// With the checksum made right, the sections themselves are explored.
		if len(data) >= headerLen+trailerLen {
			check(withCRC(data))
		}
		read(bytes.NewReader(data), t0, fileLimits)
	})
}

func FuzzParseTextDelta(f *testing.F) {
	for _, s := range []string{
		"",
		"+203.0.113.1\n-198.51.100.0/24\n",
		"+ 2001:db8::/64 ttl=60s # comment\n- ::ffff:10.0.0.1\n",
		"+10.0.0.1 expires=2026-12-01T00:00:00Z\n+10.0.0.0/8\n-10.1.0.0/16\n",
		"10.0.0.1\n-10.0.0.1 ttl=5\n",
	} {
		f.Add([]byte(s))
	}
	for _, b := range bombSeeds(f) {
		f.Add(b)
	}
	base := sampleSet()
	f.Fuzz(func(t *testing.T, data []byte) {
		if d, err := readDelta(bytes.NewReader(data), t0, fuzzLimits); err == nil && len(d.Add)+len(d.Remove) > fuzzLimits.entries {
			t.Fatalf("a delta of %d entries over max_entries %d was taken", len(d.Add)+len(d.Remove), fuzzLimits.entries)
		}
		d, err := parseTextDelta(bytes.NewReader(data), t0, fileLimits)
		if err != nil {
			var pes *ParseErrors
			if d != nil || !errors.As(err, &pes) && !errors.Is(err, ErrTooManyEntries) {
				t.Fatalf("delta %v, err %v", d, err)
			}
			return
		}
		s, err := base.apply(d, nowSeconds(t0))
		if err != nil {
			t.Fatalf("applying a parsed delta: %v", err)
		}
		var added Builder
		for _, e := range d.Add {
			added.Add(e.Prefix, e.Expires)
		}
		again := added.BuildAt(t0)
		for _, p := range d.Remove {
			for _, a := range []netip.Addr{p.Addr(), lastAddr(p)} {
				if s.ContainsAt(a, t0) && !again.ContainsAt(a, t0) {
					t.Fatalf("%s still contained after removing %s", a, p)
				}
			}
		}
		var text bytes.Buffer
		if err := WriteTextDelta(&text, d); err != nil {
			t.Fatal(err)
		}
		d2, err := parseTextDelta(&text, t0, fileLimits)
		if err != nil || len(d2.Add) != len(d.Add) || len(d2.Remove) != len(d.Remove) {
			t.Fatalf("delta did not round trip: %v", err)
		}
	})
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
