package clientip

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"net/netip"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// Version 2 frames are built by hand from the specification's layout: the 12-byte
// signature, ver/cmd, fam, a big-endian length, the address block, the TLVs.

const sig = "\r\n\r\n\x00\r\nQUIT\n"

func v2(verCmd, fam byte, parts ...[]byte) []byte {
	payload := bytes.Join(parts, nil)
	b := append([]byte(sig), verCmd, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	return append(b, payload...)
}

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func port(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

func tlv(typ byte, val string) []byte {
	b := []byte{typ}
	b = binary.BigEndian.AppendUint16(b, uint16(len(val)))
	return append(b, val...)
}

// withCRC fills the CRC32C TLV of frame (its value zero, found at off) as a sender
// does: the checksum of the whole header with the field zeroed.
func withCRC(frame []byte, off int) []byte {
	binary.BigEndian.PutUint32(frame[off:], crc32.Checksum(frame, crc32.MakeTable(crc32.Castagnoli)))
	return frame
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestReadProxyHeader(t *testing.T) {
	v4block := bytes.Join([][]byte{ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443)}, nil)
	v6block := bytes.Join([][]byte{ip("2001:db8::7"), ip("2001:db8::1"), port(51234), port(443)}, nil)
	unixBlock := make([]byte, 216)
	copy(unixBlock, "/run/haproxy.sock")
	tlvs := bytes.Join([][]byte{tlv(TLVTypeALPN, "h2"), tlv(TLVTypeAuthority, "example.com"), tlv(TLVTypeNoop, "")}, nil)
	crcFrame := withCRC(v2(0x21, 0x11, v4block, tlv(TLVTypeCRC32C, "\x00\x00\x00\x00"), tlv(TLVTypeUniqueID, "abc")), 16+12+3)
	badCRC := bytes.Clone(crcFrame)
	badCRC[len(badCRC)-1] ^= 1
	maxV6 := "PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"
	worstUnknown := "PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"
	if len(maxV6) != 104 || len(worstUnknown) != 107 {
		t.Fatalf("longest lines are %d and %d bytes, want 104 and 107", len(maxV6), len(worstUnknown))
	}

	type want struct {
		ver      int
		cmd      Command
		src, dst string // "" = zero
		tlvs     []byte
	}
	good := []struct {
		name string
		in   []byte
		want want
	}{
		{"v1 TCP4", []byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"), want{1, CommandProxy, "203.0.113.7:51234", "192.0.2.1:443", nil}},
		{"v1 TCP6", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n"), want{1, CommandProxy, "[2001:db8::7]:51234", "[2001:db8::1]:443", nil}},
		{"v1 TCP6 mapped", []byte("PROXY TCP6 ::ffff:203.0.113.7 ::ffff:192.0.2.1 1 2\r\n"), want{1, CommandProxy, "[::ffff:203.0.113.7]:1", "[::ffff:192.0.2.1]:2", nil}},
		{"v1 longest TCP6", []byte(maxV6), want{1, CommandProxy, "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", nil}},
		{"v1 ports 0", []byte("PROXY TCP4 0.0.0.0 0.0.0.0 0 0\r\n"), want{1, CommandProxy, "0.0.0.0:0", "0.0.0.0:0", nil}},
		{"v1 UNKNOWN", []byte("PROXY UNKNOWN\r\n"), want{1, CommandProxy, "", "", nil}},
		{"v1 UNKNOWN, worst case", []byte(worstUnknown), want{1, CommandProxy, "", "", nil}},
		{"v2 TCP4", v2(0x21, 0x11, v4block), want{2, CommandProxy, "203.0.113.7:51234", "192.0.2.1:443", nil}},
		{"v2 UDP4", v2(0x21, 0x12, v4block), want{2, CommandProxy, "203.0.113.7:51234", "192.0.2.1:443", nil}},
		{"v2 TCP6", v2(0x21, 0x21, v6block), want{2, CommandProxy, "[2001:db8::7]:51234", "[2001:db8::1]:443", nil}},
		{"v2 LOCAL", v2(0x20, 0x00), want{2, CommandLocal, "", "", nil}},
		{"v2 LOCAL with addresses and junk", v2(0x20, 0x11, v4block, []byte{9}), want{2, CommandLocal, "", "", nil}},
		{"v2 LOCAL, fam ignored", v2(0x20, 0xff, []byte("anything")), want{2, CommandLocal, "", "", nil}},
		{"v2 PROXY UNSPEC", v2(0x21, 0x00), want{2, CommandProxy, "", "", nil}},
		{"v2 PROXY INET, transport UNSPEC", v2(0x21, 0x10, v4block), want{2, CommandProxy, "", "", nil}},
		{"v2 UNIX stream", v2(0x21, 0x31, unixBlock), want{2, CommandProxy, "", "", nil}},
		{"v2 TLVs", v2(0x21, 0x11, v4block, tlvs), want{2, CommandProxy, "203.0.113.7:51234", "192.0.2.1:443", tlvs}},
		{"v2 TLVs on UNSPEC", v2(0x21, 0x00, tlvs), want{2, CommandProxy, "", "", tlvs}},
		{"v2 CRC32C", crcFrame, want{2, CommandProxy, "203.0.113.7:51234", "192.0.2.1:443", crcFrame[16+12:]}},
		{"v2 longest", v2(0x21, 0x11, v4block, tlv(TLVTypeNoop, strings.Repeat("x", MaxProxyV2Length-12-3))),
			want{2, CommandProxy, "203.0.113.7:51234", "192.0.2.1:443", tlv(TLVTypeNoop, strings.Repeat("x", MaxProxyV2Length-12-3))}},
	}
	const tail = "\x16\x03\x01 the TLS ClientHello that follows"
	readers := map[string]func([]byte) io.Reader{
		"whole":    func(b []byte) io.Reader { return bytes.NewReader(b) },
		"bytewise": func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
	}
	for _, tc := range good {
		for rname, mk := range readers {
			t.Run(tc.name+"/"+rname, func(t *testing.T) {
				br := bufio.NewReaderSize(mk(append(bytes.Clone(tc.in), tail...)), 16)
				h, err := ReadProxyHeader(br)
				if err != nil {
					t.Fatalf("ReadProxyHeader: %v", err)
				}
				w := tc.want
				if h.Version != w.ver || h.Command != w.cmd || !bytes.Equal(h.TLVs, w.tlvs) {
					t.Errorf("header %+v, want %+v", h, w)
				}
				for _, f := range []struct {
					got  netip.AddrPort
					want string
				}{{h.Src, w.src}, {h.Dst, w.dst}} {
					if (f.want == "" && f.got.IsValid()) || (f.want != "" && f.got != ap(f.want)) {
						t.Errorf("address %v, want %q", f.got, f.want)
					}
				}
				rest, _ := io.ReadAll(br)
				if string(rest) != tail {
					t.Errorf("after the header: %q, want %q", rest, tail)
				}
			})
		}
	}

	bad := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"HTTP", []byte("GET / HTTP/1.1\r\n"), ErrNotProxy},
		{"TLS", []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), ErrNotProxy},
		{"lowercase", []byte("proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrNotProxy},
		{"PROXZ", []byte("PROXZ TCP4"), ErrNotProxy},
		{"PROXY without space", []byte("PROXY\r\n"), ErrNotProxy},
		{"v2 signature broken late", []byte("\r\n\r\n\x00\r\nQUIX\n!\x11\x00\x0c"), ErrNotProxy},
		{"CRLF only", []byte("\r\n"), io.ErrUnexpectedEOF},
		{"v1 cut", []byte("PRO"), io.ErrUnexpectedEOF},
		{"v1 no CRLF yet", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2"), io.ErrUnexpectedEOF},
		{"v1 UDP4", []byte("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 empty protocol", []byte("PROXY \r\n"), ErrMalformed},
		{"v1 UNKNOWNX", []byte("PROXY UNKNOWNX\r\n"), ErrMalformed},
		{"v1 LF only", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"), ErrMalformed},
		{"v1 CR only", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r" + strings.Repeat("x", 100)), ErrMalformed},
		{"v1 108 bytes", []byte("PROXY UNKNOWN " + strings.Repeat("x", 92) + "\r\n"), ErrMalformed},
		{"v1 missing field", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n"), ErrMalformed},
		{"v1 extra field", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n"), ErrMalformed},
		{"v1 double space", []byte("PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 trailing space", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n"), ErrMalformed},
		{"v1 TCP4 with IPv6", []byte("PROXY TCP4 2001:db8::1 2001:db8::2 1 2\r\n"), ErrMalformed},
		{"v1 TCP6 with IPv4", []byte("PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 TCP6 zone", []byte("PROXY TCP6 fe80::1%eth0 fe80::2 1 2\r\n"), ErrMalformed},
		{"v1 leading zero address", []byte("PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v1 leading zero port", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n"), ErrMalformed},
		{"v1 port 65536", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n"), ErrMalformed},
		{"v1 port sign", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n"), ErrMalformed},
		{"v1 address with port", []byte("PROXY TCP4 1.2.3.4:80 5.6.7.8 1 2\r\n"), ErrMalformed},
		{"v2 cut in signature", []byte("\r\n\r\n\x00\r\nQU"), io.ErrUnexpectedEOF},
		{"v2 cut in fixed part", []byte(sig + "\x21\x11\x00"), io.ErrUnexpectedEOF},
		{"v2 cut in addresses", v2(0x21, 0x11, v4block)[:20], io.ErrUnexpectedEOF},
		{"v2 version 1", v2(0x11, 0x11, v4block), ErrMalformed},
		{"v2 version 3", v2(0x31, 0x11, v4block), ErrMalformed},
		{"v2 command 2", v2(0x22, 0x11, v4block), ErrMalformed},
		{"v2 family 4", v2(0x21, 0x41, v4block), ErrMalformed},
		{"v2 transport 3", v2(0x21, 0x13, v4block), ErrMalformed},
		{"v2 too long", append([]byte(sig), 0x21, 0x11, 0x10, 0x01), ErrMalformed}, // 4097: refused unread
		{"v2 65535", append([]byte(sig), 0x21, 0x11, 0xff, 0xff), ErrMalformed},
		{"v2 short IPv4 block", v2(0x21, 0x11, v4block[:8]), ErrMalformed},
		{"v2 short IPv6 block", v2(0x21, 0x21, v4block), ErrMalformed},
		{"v2 short UNIX block", v2(0x21, 0x31, unixBlock[:100]), ErrMalformed},
		{"v2 TLV overrun", v2(0x21, 0x11, v4block, []byte{TLVTypeALPN, 0, 5, 'h', '2'}), ErrMalformed},
		{"v2 stray bytes", v2(0x21, 0x11, v4block, tlv(TLVTypeALPN, "h2"), []byte{0, 0}), ErrMalformed},
		{"v2 CRC32C wrong", badCRC, ErrMalformed},
		{"v2 CRC32C short", v2(0x21, 0x11, v4block, tlv(TLVTypeCRC32C, "abc")), ErrMalformed},
	}
	for _, tc := range bad {
		for rname, mk := range readers {
			t.Run(tc.name+"/"+rname, func(t *testing.T) {
				br := bufio.NewReaderSize(mk(tc.in), 16)
				h, err := ReadProxyHeader(br)
				if !errors.Is(err, tc.want) {
					t.Fatalf("ReadProxyHeader = %+v, %v; want %v", h, err, tc.want)
				}
				if errors.Is(err, ErrNotProxy) {
					if rest, _ := io.ReadAll(br); !bytes.Equal(rest, tc.in) {
						t.Errorf("ErrNotProxy consumed bytes: %q left of %q", rest, tc.in)
					}
				}
			})
		}
	}
}

// TestReadProxyHeaderWaitsForNoMore: on a stream left open, the header is returned,
// or refused, without waiting for bytes it does not need.
func TestReadProxyHeaderWaitsForNoMore(t *testing.T) {
	for _, in := range []string{
		"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
		string(v2(0x21, 0x11, ip("1.2.3.4"), ip("5.6.7.8"), port(1), port(2))),
		string(v2(0x20, 0x00)),
		"G",
		"PROXZ",
		"\r\n\r\n\x00\r\nQUIX",
		"PROXY TCP4 1.2.3.4 " + strings.Repeat("9", 100), // over the length: refused at once
	} {
		pr, pw := io.Pipe()
		go func() { _, _ = pw.Write([]byte(in)) }() // and the stream stays open
		done := make(chan error, 1)
		go func() {
			_, err := ReadProxyHeader(bufio.NewReader(pr))
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, ErrNotProxy) && !errors.Is(err, ErrMalformed) {
				t.Errorf("%q: %v", in, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%q: ReadProxyHeader waits for more", in)
		}
		pw.Close()
	}
}

func TestProxyHeaderTLV(t *testing.T) {
	h := &ProxyHeader{TLVs: bytes.Join([][]byte{tlv(TLVTypeNoop, ""), tlv(TLVTypeALPN, "h2"), tlv(TLVTypeALPN, "http/1.1"), tlv(0xEA, "\x01vpce-0123")}, nil)}
	if v, ok := h.TLV(TLVTypeALPN); !ok || string(v) != "h2" {
		t.Errorf("ALPN %q, %v", v, ok)
	}
	if v, ok := h.TLV(0xEA); !ok || string(v) != "\x01vpce-0123" {
		t.Errorf("AWS %q, %v", v, ok)
	}
	if v, ok := h.TLV(TLVTypeNoop); !ok || len(v) != 0 {
		t.Errorf("NOOP %q, %v", v, ok)
	}
	if _, ok := h.TLV(TLVTypeAuthority); ok {
		t.Error("absent TLV found")
	}
}

func TestProxyHeaderAppendBinary(t *testing.T) {
	for _, tc := range []struct {
		h    ProxyHeader
		want string
	}{
		{ProxyHeader{Version: 1, Command: CommandProxy, Src: ap("203.0.113.7:51234"), Dst: ap("192.0.2.1:443")},
			"PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"},
		{ProxyHeader{Version: 1, Command: CommandProxy, Src: ap("[2001:db8::7]:1"), Dst: ap("[2001:db8::1]:2")},
			"PROXY TCP6 2001:db8::7 2001:db8::1 1 2\r\n"},
		{ProxyHeader{Version: 1, Command: CommandProxy}, "PROXY UNKNOWN\r\n"},
		{ProxyHeader{Version: 2, Command: CommandProxy, Src: ap("203.0.113.7:51234"), Dst: ap("192.0.2.1:443")},
			string(v2(0x21, 0x11, ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443)))},
		{ProxyHeader{Version: 2, Command: CommandProxy, Src: ap("[2001:db8::7]:1"), Dst: ap("[2001:db8::1]:2"), TLVs: tlv(TLVTypeALPN, "h2")},
			string(v2(0x21, 0x21, ip("2001:db8::7"), ip("2001:db8::1"), port(1), port(2), tlv(TLVTypeALPN, "h2")))},
		{ProxyHeader{Version: 2, Command: CommandLocal}, string(v2(0x20, 0x00))},
	} {
		got, err := tc.h.AppendBinary(nil)
		if err != nil || string(got) != tc.want {
			t.Errorf("%+v: %q, %v; want %q", tc.h, got, err, tc.want)
			continue
		}
		back, err := ReadProxyHeader(bufio.NewReader(bytes.NewReader(got)))
		if err != nil || back.Version != tc.h.Version || back.Command != tc.h.Command || back.Src != tc.h.Src || back.Dst != tc.h.Dst || !bytes.Equal(back.TLVs, tc.h.TLVs) {
			t.Errorf("%+v read back as %+v, %v", tc.h, back, err)
		}
	}
	for _, h := range []ProxyHeader{
		{Version: 3},
		{Version: 1, Command: CommandLocal},
		{Version: 1, Command: CommandProxy, Src: ap("1.2.3.4:1"), Dst: ap("[::1]:2")},
		{Version: 2, Command: CommandProxy, Src: ap("1.2.3.4:1"), Dst: ap("5.6.7.8:2"), TLVs: make([]byte, MaxProxyV2Length)},
		{Version: 2, Command: 7},
	} {
		if b, err := h.AppendBinary(nil); err == nil {
			t.Errorf("%+v encoded as %q", h, b)
		}
	}
	if CommandLocal.String() != "LOCAL" || CommandProxy.String() != "PROXY" || Command(5).String() != "command(5)" {
		t.Error("Command.String")
	}
}
