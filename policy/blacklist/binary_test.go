package blacklist

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// sampleSet has something in each of the eight tables.
func sampleSet() *Set {
	return buildAt(t0,
		entrySpec{p: "0.0.0.0"}, entrySpec{p: "203.0.113.7"}, entrySpec{p: "255.255.255.255"},
		entrySpec{p: "198.51.100.0/24"}, entrySpec{p: "10.0.0.0/8"}, entrySpec{p: "255.255.255.0/31"},
		entrySpec{p: "192.0.2.1", ttl: time.Hour}, entrySpec{p: "192.0.2.128/25", ttl: 2 * time.Hour},
		entrySpec{p: "2001:db8::1"}, entrySpec{p: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		entrySpec{p: "2001:db8:1::/48"}, entrySpec{p: "::/100"},
		entrySpec{p: "2001:db8::9", ttl: time.Hour}, entrySpec{p: "2001:db8:2::/64", ttl: time.Minute},
	)
}

func encode(t testing.TB, s *Set) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteBinary(&buf, s); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// withCRC returns b with its trailer recomputed.
func withCRC(b []byte) []byte {
	b = bytes.Clone(b)
	if len(b) >= 4 {
		binary.BigEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	}
	return b
}

func TestBinaryRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	var b Builder
	for range 5000 {
		b.AddAddr(randV4(r), time.Time{})
		b.AddAddr(randV6(r), t0.Add(time.Duration(r.IntN(100))*time.Hour))
		b.Add(netip.PrefixFrom(randV4(r), 8+r.IntN(25)), time.Time{})
	}
	for name, s := range map[string]*Set{"empty": emptySet, "sample": sampleSet(), "random": b.BuildAt(t0)} {
		t.Run(name, func(t *testing.T) {
			data := encode(t, s)
			for _, form := range []struct {
				name string
				data []byte
				read func([]byte) (*Set, error)
			}{
				{"decode", data, func(d []byte) (*Set, error) { return decodeBinary(d, t0) }},
				{"read", data, func(d []byte) (*Set, error) { return read(bytes.NewReader(d), t0, fileLimits) }},
				{"read gzip", gz(data), func(d []byte) (*Set, error) { return read(bytes.NewReader(d), t0, fileLimits) }},
				{"ReadBinary gzip", gz(data), func(d []byte) (*Set, error) { return ReadBinary(bytes.NewReader(d)) }},
			} {
				got, err := form.read(form.data)
				if err != nil {
					t.Fatalf("%s: %v", form.name, err)
				}
				if form.name == "ReadBinary gzip" {
					// judged by the wall clock: compare what does not expire
					if got.Stats().V4Addrs < s.Stats().V4Addrs-s.Stats().Expiring {
						t.Errorf("%s: lost entries", form.name)
					}
					continue
				}
				assertSameSet(t, s, got)
			}
		})
	}
}

func TestBinaryExpiredDropped(t *testing.T) {
	data := encode(t, sampleSet())
	s, err := decodeBinary(data, t0.Add(90*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if s.Stats().Expiring != 1 {
		t.Errorf("%d expiring entries after 90 minutes, want 1 (192.0.2.128/25)", s.Stats().Expiring)
	}
}

// frame wraps a body of sections in a version 1 header and a checksum.
func frame(body ...byte) []byte {
	b := append(bytes.Clone(binaryMagic), 0, 1, 0, 0)
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func TestBinaryErrors(t *testing.T) {
	good := encode(t, sampleSet())
	body := good[headerLen : len(good)-trailerLen]
	uv := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	zeros := make([]byte, 100)
	six := func(last byte) []byte { b := make([]byte, 16); b[15] = last; return b }
	tests := []struct {
		name string
		data []byte
		is   error
	}{
		{"empty", nil, ErrNotBinary},
		{"text", []byte("10.0.0.1\n"), ErrNotBinary},
		{"header only", good[:headerLen], ErrTruncated},
		{"version 2", withCRC(cat(good[:8], []byte{0, 2}, good[10:])), ErrVersion},
		{"flags", withCRC(cat(good[:10], []byte{0, 1}, good[12:])), ErrCorrupt},
		{"checksum", cat(good[:len(good)-1], []byte{good[len(good)-1] ^ 1}), ErrChecksum},
		{"flipped bit", func() []byte { b := bytes.Clone(good); b[20] ^= 4; return b }(), ErrChecksum},
		{"cut short", frame(body[:len(body)-6]...), ErrTruncated},
		{"no sections", frame(), ErrTruncated},
		{"trailing bytes", frame(cat(body, []byte{0})...), ErrCorrupt},
		{"count over the bytes present", frame(cat(uv(1_000_000), zeros)...), ErrTruncated},
		{"count over MaxEntries", frame(cat(uv(MaxEntries+1), zeros)...), ErrTooManyEntries},
		{"huge count", frame(cat(uv(1<<62), zeros)...), ErrTooManyEntries},
		{"varint overflow", frame(bytes.Repeat([]byte{0xff}, 11)...), ErrCorrupt},
		{"IPv4 past the end", frame(cat(uv(2), uv(0xffff_fffe), uv(5), zeros)...), ErrCorrupt},
		{"IPv4 value too big", frame(cat(uv(1), uv(1<<32), zeros)...), ErrCorrupt},
		{"IPv4 range too long", frame(cat(uv(0), uv(1), uv(5), uv(1<<32), zeros)...), ErrCorrupt},
		{"IPv6 range backwards", frame(cat(uv(0), uv(0), uv(0), uv(1), six(2), six(1), zeros)...), ErrCorrupt},
		{"expiring that never expires", frame(cat(uv(0), uv(0), uv(0), uv(0), uv(1), uv(7), []byte{0xff, 0xff, 0xff, 0xff}, zeros)...), ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := decodeBinary(tt.data, t0)
			if s != nil || !errors.Is(err, tt.is) {
				t.Fatalf("err = %v, want %v", err, tt.is)
			}
			var be *BinaryError
			if !errors.As(err, &be) {
				t.Errorf("err %T is not a *BinaryError", err)
			}
		})
	}
	if _, err := decodeBinary(frame(make([]byte, 8)...), t0); err != nil {
		t.Errorf("eight empty sections: %v", err)
	}
}

func TestReadDetects(t *testing.T) {
	text := []byte("203.0.113.7\n198.51.100.0/24\n")
	want, err := parseText(bytes.NewReader(text), t0, fileLimits)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"text": text, "gzip text": gz(text), "binary": encode(t, want), "gzip binary": gz(encode(t, want)),
	} {
		got, err := read(bytes.NewReader(data), t0, fileLimits)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		assertSameSet(t, want, got)
	}
	if _, err := read(bytes.NewReader([]byte{0x1f, 0x8b, 1, 2, 3}), t0, fileLimits); err == nil {
		t.Error("a broken gzip stream was read")
	}
	d, err := ReadDelta(bytes.NewReader(gz([]byte("+10.0.0.1\n-10.0.0.2\n"))))
	if err != nil || len(d.Add) != 1 || len(d.Remove) != 1 {
		t.Errorf("ReadDelta(gzip) = %+v, %v", d, err)
	}
}

func TestBinarySize(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 12))
	var b Builder
	const n = 100_000
	for range n {
		b.AddAddr(randV4(r), time.Time{})
	}
	data := encode(t, b.BuildAt(t0))
	if per := float64(len(data)) / n; per > 3.5 {
		t.Errorf("%.2f bytes per random IPv4 address, want at most 3.5", per)
	}
}
