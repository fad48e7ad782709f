package clientip

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{
		"1.2.3.4", " 1.2.3.4:80 ", "2001:db8::1", "[2001:db8::1]:443", "[2001:db8::1]", "fe80::1%eth0",
		"[fe80::1%25eth0]:80", "::ffff:1.2.3.4", "1:2:3:4:5:6:1.2.3.4", "::", "unknown", "", "01.2.3.4",
		"1.2.3.4:65536", "[1.2.3.4]:80", "1::2::3", "fe80::1%", "\t[::1]\t",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		got, ok := ParseAddr(b)
		if !bytes.Equal(in, b) {
			t.Fatal("ParseAddr modified its input")
		}
		want, wantOK := refParseAddr(string(b))
		if ok != wantOK || got != want {
			t.Fatalf("ParseAddr(%q) = %v, %v; reference %v, %v", b, got, ok, want, wantOK)
		}
		if ok {
			if !got.IsValid() || got.Zone() != "" || got.Is4In6() {
				t.Fatalf("ParseAddr(%q) = %v: invalid, zoned or mapped", b, got)
			}
			if again, ok := ParseAddr([]byte(got.String())); !ok || again != got {
				t.Fatalf("%v does not parse back: %v, %v", got, again, ok)
			}
		}
	})
}

// fuzzTrusted is the trusted set of FuzzParseXFF: a few ranges the seeds hit.
var fuzzTrusted = isTrusted("10.0.0.0/8", "192.0.2.0/24", "2001:db8::/32", "::/128")

func FuzzParseXFF(f *testing.F) {
	for _, s := range []string{
		"203.0.113.7",
		"203.0.113.7, 10.0.0.1, 10.0.0.2",
		"1.1.1.1, 203.0.113.7\n10.0.0.1",
		"[2001:db8::1]:443, 2001:db9::1, fe80::1%eth0",
		"unknown, 10.0.0.1",
		"203.0.113.7,,10.0.0.1",
		"203.0.113.7, 10.0.0.1,",
		"\n\n10.0.0.1",
		strings.Repeat("10.0.0.1, ", 100) + "10.0.0.2",
	} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(2))
	}
	f.Fuzz(func(t *testing.T, s string, maxHops uint8) {
		lines := strings.Split(s, "\n")
		var values [][]byte
		for _, l := range lines {
			values = append(values, []byte(l))
		}
		got, ok := ParseXFF(values, fuzzTrusted, int(maxHops))
		want, wantOK := refXFF(lines, fuzzTrusted, int(maxHops))
		if got != want || ok != wantOK {
			t.Fatalf("ParseXFF(%q, %d) = %v, %v; reference %v, %v", s, maxHops, got, ok, want, wantOK)
		}
		if ok != got.IsValid() {
			t.Fatalf("ok %v with %v", ok, got)
		}
	})
}

func FuzzReadProxyHeader(f *testing.F) {
	v4 := bytes.Join([][]byte{ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443)}, nil)
	v6 := bytes.Join([][]byte{ip("2001:db8::7"), ip("2001:db8::1"), port(51234), port(443)}, nil)
	for _, seed := range [][]byte{
		[]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\nGET / HTTP/1.1\r\n"),
		[]byte("PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n"),
		[]byte("PROXY UNKNOWN\r\n"),
		[]byte("PROXY UNKNOWN ffff::1 ffff::2 65535 65535\r\n"),
		[]byte("PROXY TCP4 1.2.3.4 5.6.7.8 080 1\r\n"),
		[]byte("GET / HTTP/1.1\r\n"),
		v2(0x21, 0x11, v4),
		v2(0x21, 0x21, v6, tlv(TLVTypeALPN, "h2")),
		v2(0x20, 0x00),
		v2(0x21, 0x31, make([]byte, 216)),
		withCRC(v2(0x21, 0x11, v4, tlv(TLVTypeCRC32C, "\x00\x00\x00\x00")), 16+12+3),
		append([]byte(sig), 0x21, 0x11, 0xff, 0xff),
		[]byte(sig),
		nil,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(b), 16)
		h, err := ReadProxyHeader(br)
		rest, _ := io.ReadAll(br)

		// Whatever the segmentation, the same answer.
		h1, err1 := ReadProxyHeader(bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(b)), 16))
		if errClass(err) != errClass(err1) {
			t.Fatalf("whole: %v; byte by byte: %v", err, err1)
		}

		if err != nil {
			if h != nil {
				t.Fatal("a header with an error")
			}
			if errClass(err) == "other" {
				t.Fatalf("unexpected error %v", err)
			}
			if errors.Is(err, ErrNotProxy) && !bytes.Equal(rest, b) {
				t.Fatalf("ErrNotProxy after consuming %d bytes", len(b)-len(rest))
			}
			return
		}
		if !equalHeaders(h, h1) {
			t.Fatalf("whole: %+v; byte by byte: %+v", h, h1)
		}
		n := len(b) - len(rest)
		switch h.Version {
		case 1:
			if n > MaxProxyV1Length || !bytes.HasSuffix(b[:n], []byte("\r\n")) || bytes.IndexByte(b[:n], '\n') != n-1 {
				t.Fatalf("version 1 header of %d bytes: %q", n, b[:n])
			}
		case 2:
			if n != 16+int(binary.BigEndian.Uint16(b[14:16])) || n > 16+MaxProxyV2Length {
				t.Fatalf("version 2 header of %d bytes", n)
			}
		default:
			t.Fatalf("version %d", h.Version)
		}
		if h.Src.IsValid() != h.Dst.IsValid() || (h.Src.IsValid() && h.Src.Addr().Is4() != h.Dst.Addr().Is4()) {
			t.Fatalf("addresses %v %v", h.Src, h.Dst)
		}
		// What was read encodes and reads back the same, TLVs aside when a checksum
		// covers bytes the encoding changes.
		enc, err := h.AppendBinary(nil)
		if err != nil {
			t.Fatalf("AppendBinary(%+v): %v", h, err)
		}
		back, err := ReadProxyHeader(bufio.NewReader(bytes.NewReader(enc)))
		if _, crc := h.TLV(TLVTypeCRC32C); crc {
			return
		}
		if err != nil || !equalHeaders(h, back) {
			t.Fatalf("%+v encoded as %q, read back as %+v, %v", h, enc, back, err)
		}
	})
}

func equalHeaders(a, b *ProxyHeader) bool {
	return a.Version == b.Version && a.Command == b.Command && a.Src == b.Src && a.Dst == b.Dst && bytes.Equal(a.TLVs, b.TLVs)
}

func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, ErrNotProxy):
		return "not proxy"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated"
	case err == io.EOF:
		return "eof"
	}
	return "other"
}
