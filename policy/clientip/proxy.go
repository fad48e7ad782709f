package clientip

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/netip"
	"strconv"
)

// PROXY protocol errors. ReadProxyHeader wraps ErrMalformed with the detail; I/O
// errors (io.EOF before any byte, io.ErrUnexpectedEOF inside a header, timeouts)
// come back wrapped as they are.
var (
	// ErrNotProxy: the stream does not start with a PROXY header. Nothing was
	// consumed.
	ErrNotProxy = errors.New("clientip: not a PROXY protocol header")
	// ErrMalformed: the stream starts like a PROXY header but breaks the
	// specification, or announces more than ReadProxyHeader accepts.
	ErrMalformed = errors.New("clientip: malformed PROXY protocol header")
)

// Command is the command of a PROXY header.
type Command uint8

const (
	// CommandLocal: the proxy opened the connection itself (a health check); the
	// connection's own endpoints apply.
	CommandLocal Command = 0
	// CommandProxy: the connection is relayed on behalf of Src.
	CommandProxy Command = 1
)

// String returns "LOCAL" or "PROXY".
func (c Command) String() string {
	switch c {
	case CommandLocal:
		return "LOCAL"
	case CommandProxy:
		return "PROXY"
	}
	return "command(" + strconv.Itoa(int(c)) + ")"
}

// TLV types of PROXY protocol version 2 (section 2.2 of the specification).
const (
	TLVTypeALPN      = 0x01
	TLVTypeAuthority = 0x02
	TLVTypeCRC32C    = 0x03
	TLVTypeNoop      = 0x04
	TLVTypeUniqueID  = 0x05
	TLVTypeSSL       = 0x20
	TLVTypeNetNS     = 0x30
)

// Limits on what ReadProxyHeader accepts.
const (
	// MaxProxyV1Length is the longest version 1 line, CRLF included (the
	// specification's worst case).
	MaxProxyV1Length = 107
	// MaxProxyV2Length bounds the part of a version 2 header after its 16 fixed bytes:
	// the address block (at most 216 bytes) and the TLVs. The specification allows
	// 65535; real senders (HAProxy, AWS, GCP, Azure load balancers) stay far below.
	MaxProxyV2Length = 4096
)

// ProxyHeader is a PROXY protocol header, version 1 or 2.
type ProxyHeader struct {
	// Version is 1 (text) or 2 (binary).
	Version int
	// Command is CommandProxy, or CommandLocal (version 2 only).
	Command Command
	// Src and Dst are the relayed connection's source (the client) and destination.
	// Both are zero when the header carries no usable address: the LOCAL command,
	// "UNKNOWN" (version 1), the UNSPEC or UNIX families or the UNSPEC transport
	// (version 2); the connection's own endpoints apply then.
	Src, Dst netip.AddrPort
	// TLVs are the raw type-length-value vectors after the addresses (version 2),
	// checked to be well formed and, when a CRC32C TLV is present, the checksum
	// verified. At most MaxProxyV2Length bytes. Nil for version 1 and LOCAL.
	TLVs []byte
}

// TLV returns the value of the first TLV of type typ.
func (h *ProxyHeader) TLV(typ byte) ([]byte, bool) {
	for b := h.TLVs; len(b) >= 3; {
		n := 3 + int(binary.BigEndian.Uint16(b[1:3]))
		if n > len(b) {
			break
		}
		if b[0] == typ {
			return b[3:n], true
		}
		b = b[n:]
	}
	return nil, false
}

// v2Sig is the 12-byte signature that starts a version 2 header.
var v2Sig = []byte("\r\n\r\n\x00\r\nQUIT\n")

var v1Prefix = []byte("PROXY ")

// ReadProxyHeader reads a PROXY header, version 1 or 2, from the start of r and
// consumes exactly its bytes: what follows stays in r for the protocol it precedes.
// It waits for no byte it does not need: a stream that cannot be a PROXY header is
// refused with ErrNotProxy as soon as a byte differs from both signatures, with
// nothing consumed. Sizes the peer announces are checked against MaxProxyV1Length
// and MaxProxyV2Length before anything is read or allocated.
//
// Deadlines are the caller's: set one on the connection under r.
func ReadProxyHeader(r *bufio.Reader) (*ProxyHeader, error) {
	first, err := r.Peek(1)
	if err != nil {
		return nil, readErr(err, 0)
	}
	switch first[0] {
	case v1Prefix[0]:
		if err := peekPrefix(r, v1Prefix); err != nil {
			return nil, err
		}
		return readV1(r)
	case v2Sig[0]:
		if err := peekPrefix(r, v2Sig); err != nil {
			return nil, err
		}
		return readV2(r)
	}
	return nil, ErrNotProxy
}

// peekPrefix checks that r starts with prefix, peeking no further than the bytes
// already buffered or needed for the next comparison, so that a short non-PROXY
// first message (the stream being idle after it) is refused without waiting.
func peekPrefix(r *bufio.Reader, prefix []byte) error {
	for n := 1; n <= len(prefix); {
		m := max(n, min(r.Buffered(), len(prefix)))
		b, err := r.Peek(m)
		if !bytes.Equal(b, prefix[:len(b)]) {
			return ErrNotProxy
		}
		if err != nil {
			return readErr(err, len(b))
		}
		n = m + 1
	}
	return nil
}

// readErr describes an I/O error met after got bytes of a header.
func readErr(err error, got int) error {
	if err == io.EOF && got > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		return err
	}
	return fmt.Errorf("clientip: reading PROXY header: %w", err)
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// readV1 reads a version 1 line whose "PROXY " prefix has been peeked.
func readV1(r *bufio.Reader) (*ProxyHeader, error) {
	var buf [MaxProxyV1Length]byte
	n := 0
	if b, _ := r.Peek(min(r.Buffered(), len(buf))); bytes.IndexByte(b, '\n') >= 0 {
		// The common case: the whole line arrived in one segment.
		n = copy(buf[:], b[:bytes.IndexByte(b, '\n')+1])
		_, _ = r.Discard(n)
	}
	for n == 0 || buf[n-1] != '\n' {
		c, err := r.ReadByte()
		if err != nil {
			return nil, readErr(err, n+1)
		}
		buf[n] = c
		n++
		if c != '\n' && n == len(buf) {
			return nil, malformed("version 1: no CRLF in the first %d bytes", MaxProxyV1Length)
		}
	}
	if n < 2 || buf[n-2] != '\r' {
		return nil, malformed("version 1: line ends in LF without CR")
	}
	line := buf[len(v1Prefix) : n-2]
	h := &ProxyHeader{Version: 1, Command: CommandProxy}

	proto, rest, _ := bytes.Cut(line, []byte{' '})
	switch string(proto) {
	case "UNKNOWN":
		// Whatever follows "UNKNOWN " is to be ignored.
		return h, nil
	case "TCP4", "TCP6":
	default:
		return nil, malformed("version 1: protocol %q is not TCP4, TCP6 or UNKNOWN", string(proto))
	}
	var f [4][]byte
	for i := range f {
		if i < 3 {
			var ok bool
			if f[i], rest, ok = bytes.Cut(rest, []byte{' '}); !ok {
				return nil, malformed("version 1: %d fields after %s, want 4", i+1, string(proto))
			}
		} else {
			f[i] = rest
		}
	}
	v6 := proto[3] == '6'
	src, err := v1Addr(f[0], v6)
	if err != nil {
		return nil, err
	}
	dst, err := v1Addr(f[1], v6)
	if err != nil {
		return nil, err
	}
	sport, err := v1Port(f[2])
	if err != nil {
		return nil, err
	}
	dport, err := v1Port(f[3])
	if err != nil {
		return nil, err
	}
	h.Src = netip.AddrPortFrom(src, sport)
	h.Dst = netip.AddrPortFrom(dst, dport)
	return h, nil
}

func v1Addr(b []byte, v6 bool) (netip.Addr, error) {
	if !v6 {
		if a, ok := parseIPv4(b); ok {
			return a, nil
		}
		return netip.Addr{}, malformed("version 1: %q is not an IPv4 address", string(b))
	}
	// The address must be IPv6 text, so that "::ffff:1.2.3.4" stays IPv6 here; the
	// listener unmaps it later.
	a, err := netip.ParseAddr(string(b))
	if err != nil || !a.Is6() || a.Zone() != "" {
		return netip.Addr{}, malformed("version 1: %q is not an IPv6 address", string(b))
	}
	return a, nil
}

func v1Port(b []byte) (uint16, error) {
	if !validPort(b) || (len(b) > 1 && b[0] == '0') {
		return 0, malformed("version 1: %q is not a port", string(b))
	}
	n, _ := strconv.ParseUint(string(b), 10, 16)
	return uint16(n), nil
}

// readV2 reads a version 2 header whose 12-byte signature has been peeked.
func readV2(r *bufio.Reader) (*ProxyHeader, error) {
	fixed, err := r.Peek(16)
	if err != nil {
		return nil, readErr(err, len(fixed))
	}
	var hdr [16]byte
	copy(hdr[:], fixed)
	verCmd, fam := hdr[12], hdr[13]
	length := int(binary.BigEndian.Uint16(hdr[14:16]))
	if verCmd>>4 != 2 {
		return nil, malformed("version 2 signature with version %d", verCmd>>4)
	}
	cmd := Command(verCmd & 0xf)
	if cmd > CommandProxy {
		return nil, malformed("version 2: unknown command %#x", verCmd&0xf)
	}
	family, transport := fam>>4, fam&0xf
	if cmd == CommandProxy && (family > 3 || transport > 2) {
		// LOCAL discards the family with the rest of the block.
		return nil, malformed("version 2: unknown family/transport %#02x", fam)
	}
	if length > MaxProxyV2Length {
		return nil, malformed("version 2: length %d exceeds the %d accepted", length, MaxProxyV2Length)
	}
	if _, err := r.Discard(16); err != nil {
		return nil, readErr(err, 16)
	}
	payload := make([]byte, length)
	if n, err := io.ReadFull(r, payload); err != nil {
		return nil, readErr(err, 16+n)
	}

	h := &ProxyHeader{Version: 2, Command: cmd}
	if cmd == CommandLocal {
		// The specification: use the real endpoints and discard the whole block.
		return h, nil
	}
	addrLen := [...]int{0, 12, 36, 216}[family]
	if length < addrLen {
		return nil, malformed("version 2: length %d is short of the %d-byte address block", length, addrLen)
	}
	if transport != 0 {
		switch family {
		case 1:
			src := netip.AddrFrom4([4]byte(payload[0:4]))
			dst := netip.AddrFrom4([4]byte(payload[4:8]))
			h.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(payload[8:10]))
			h.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(payload[10:12]))
		case 2:
			src := netip.AddrFrom16([16]byte(payload[0:16]))
			dst := netip.AddrFrom16([16]byte(payload[16:32]))
			h.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(payload[32:34]))
			h.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(payload[34:36]))
		}
	}
	if tlvs := payload[addrLen:]; len(tlvs) > 0 {
		if err := checkTLVs(hdr[:], payload, addrLen); err != nil {
			return nil, err
		}
		h.TLVs = tlvs
	}
	return h, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checkTLVs checks that the TLVs after the address block tile it exactly, and the
// CRC32C checksum when one is present.
func checkTLVs(fixed, payload []byte, addrLen int) error {
	crcAt := -1
	for off := addrLen; off < len(payload); {
		if len(payload)-off < 3 {
			return malformed("version 2: %d stray bytes after the TLVs", len(payload)-off)
		}
		n := int(binary.BigEndian.Uint16(payload[off+1 : off+3]))
		if off+3+n > len(payload) {
			return malformed("version 2: TLV type %#02x of %d bytes overruns the header", payload[off], n)
		}
		if payload[off] == TLVTypeCRC32C {
			if n != 4 || crcAt >= 0 {
				return malformed("version 2: bad CRC32C TLV")
			}
			crcAt = off + 3
		}
		off += 3 + n
	}
	if crcAt < 0 {
		return nil
	}
	want := binary.BigEndian.Uint32(payload[crcAt:])
	var zero [4]byte
	c := crc32.Update(0, castagnoli, fixed)
	c = crc32.Update(c, castagnoli, payload[:crcAt])
	c = crc32.Update(c, castagnoli, zero[:])
	c = crc32.Update(c, castagnoli, payload[crcAt+4:])
	if c != want {
		return malformed("version 2: CRC32C mismatch")
	}
	return nil
}

// AppendBinary appends h in its wire form: a version 1 line ("PROXY UNKNOWN" when Src
// is not set) or a version 2 header with h.TLVs after the addresses. Src and Dst must
// be of one family. It is what a load balancer in front would send: tests and tools
// use it to speak to a PROXY listener.
func (h *ProxyHeader) AppendBinary(b []byte) ([]byte, error) {
	src, dst := h.Src, h.Dst
	hasAddr := src.IsValid() && dst.IsValid()
	if hasAddr && src.Addr().Is4() != dst.Addr().Is4() {
		return b, errors.New("clientip: PROXY header with source and destination of different families")
	}
	if hasAddr && (src.Addr().Zone() != "" || dst.Addr().Zone() != "") {
		return b, errors.New("clientip: PROXY header addresses cannot have zones")
	}
	switch h.Version {
	case 1:
		if h.Command != CommandProxy || len(h.TLVs) > 0 {
			return b, errors.New("clientip: PROXY version 1 has neither LOCAL nor TLVs")
		}
		b = append(b, v1Prefix...)
		if !hasAddr {
			return append(b, "UNKNOWN\r\n"...), nil
		}
		if src.Addr().Is4() {
			b = append(b, "TCP4 "...)
		} else {
			b = append(b, "TCP6 "...)
		}
		b = src.Addr().AppendTo(b)
		b = append(b, ' ')
		b = dst.Addr().AppendTo(b)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(src.Port()), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(dst.Port()), 10)
		return append(b, "\r\n"...), nil
	case 2:
		if h.Command > CommandProxy {
			return b, fmt.Errorf("clientip: unknown PROXY command %d", h.Command)
		}
		fam, addrLen := byte(0x00), 0
		if hasAddr && h.Command == CommandProxy {
			fam, addrLen = 0x11, 12
			if src.Addr().Is6() {
				fam, addrLen = 0x21, 36
			}
		}
		n := addrLen + len(h.TLVs)
		if n > MaxProxyV2Length {
			return b, fmt.Errorf("clientip: PROXY header of %d bytes exceeds %d", n, MaxProxyV2Length)
		}
		b = append(b, v2Sig...)
		b = append(b, 0x20|byte(h.Command), fam)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
		if addrLen > 0 {
			b = append(b, src.Addr().AsSlice()...)
			b = append(b, dst.Addr().AsSlice()...)
			b = binary.BigEndian.AppendUint16(b, src.Port())
			b = binary.BigEndian.AppendUint16(b, dst.Port())
		}
		return append(b, h.TLVs...), nil
	}
	return b, fmt.Errorf("clientip: unknown PROXY version %d", h.Version)
}
