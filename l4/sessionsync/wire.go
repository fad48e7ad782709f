package sessionsync

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/netip"

	"github.com/tiergate/tiergate/l4/conntrack"
)

// The datagram (all integers big-endian):
//
//	magic    2  "TS"
//	version  1  1
//	type     1  MsgEntries, MsgFullSyncRequest, MsgFullSyncDone
//	cluster  4  the cluster ID
//	sequence 8  per sender, increasing; starts at the sender's start time in ns
//	count    2  entries that follow (0 for the other types)
//	entries     count × entry
//	mac     32  HMAC-SHA256 with the cluster's key over everything before it
//
// An entry:
//
//	flags    1  bits 0-1 op (1 upsert, 2 delete); bit 2 the flow is IPv6;
//	            bit 3 the member's address is IPv6; bit 4 the connection is
//	            proxied by the SYN proxy (an upsert only)
//	proto    1  6 (TCP) or 17 (UDP)
//	state    1  conntrack.State (established, fin, close, udp); 0 for a delete
//	encap    1  EncapGRE, EncapGREKey or EncapIPIP
//	ttl      4  seconds until the entry expires on the sender
//	cport    2  the client's port
//	vport    2  the VIP's port
//	client   4 or 16
//	vip      4 or 16
//	member   4 or 16  the L7 node the flow is tunnelled to
//
// and, when bit 4 is set, the SYN proxy's translation (conntrack.Proxy):
//
//	seqdelta 4  the member's ISN less the LD's cookie
//	tsdelta  4  the LD's TSval less the member's
//	wshift   1  the member's window scale less the LD's (signed)
//	pflags   1  conntrack.ProxyTS, ProxyWScale, ProxySACK
//
// An IPv4 flow to an IPv4 member is 24 bytes, so a 1,500-byte path carries 56 (a
// proxied one 34). The proxy's bit came in version 1 as it is: an LD that does not
// know it refuses the datagram (reserved flag bits) rather than install a proxied
// connection it could not translate.

const (
	magic0, magic1 = 'T', 'S'
	// Version is the wire format's version.
	Version = 1
	// HeaderLen is the fixed header's length and MACLen the trailer's.
	HeaderLen = 18
	MACLen    = sha256.Size
	// MinEntryLen and MaxEntryLen bound an entry's encoded length.
	MinEntryLen = 12 + 3*4
	MaxEntryLen = 12 + 3*16 + proxyLen
	// MinDatagram is the smallest datagram size a Batch accepts: one entry of each
	// family fits.
	MinDatagram = HeaderLen + MaxEntryLen + MACLen
	// MaxDatagram is the largest UDP payload.
	MaxDatagram = 65507
)

// MsgType is a datagram's type.
type MsgType uint8

// Datagram types.
const (
	// MsgEntries carries entries.
	MsgEntries MsgType = 1
	// MsgFullSyncRequest asks the receiver for a full sync (a starting LD's warm-up).
	MsgFullSyncRequest MsgType = 2
	// MsgFullSyncDone tells the receiver that a full sync it was sent is complete.
	MsgFullSyncDone MsgType = 3
)

// Op is what an entry asks of the receiver.
type Op uint8

// Entry operations.
const (
	// OpUpsert installs or updates the connection.
	OpUpsert Op = 1
	// OpDelete removes it (it was removed from the sender's table).
	OpDelete Op = 2
)

// Encap is the encapsulation the sender tunnels the flow's packets in.
type Encap uint8

// Encapsulations.
const (
	EncapGRE    Encap = 1
	EncapGREKey Encap = 2 // GRE with the tunnel key
	EncapIPIP   Encap = 3
)

// String returns the encapsulation's name.
func (e Encap) String() string {
	switch e {
	case EncapGRE:
		return "gre"
	case EncapGREKey:
		return "gre_key"
	case EncapIPIP:
		return "ipip"
	}
	return fmt.Sprintf("encap(%d)", uint8(e))
}

// Entry is one connection as it travels between LDs: the flow by its addresses (rule
// and member IDs are each LD's own), the member it is tunnelled to, and its state.
// Addresses are 16 bytes, an IPv4 one in its IPv4-mapped form (netip.Addr.As16), so
// the type holds no pointers and queues of it cost the garbage collector nothing.
type Entry struct {
	Client     [16]byte
	VIP        [16]byte
	Member     [16]byte
	TTL        uint32 // seconds until it expires on the sender
	ClientPort uint16
	VIPPort    uint16
	Proto      uint8 // 6 or 17
	State      conntrack.State
	Op         Op
	Encap      Encap
	// Proxied says the SYN proxy translates the connection with Proxy (its Flags
	// other than ProxyOn and ProxyPending travel; an upsert only).
	Proxied bool
	Proxy   conntrack.Proxy
}

// proxyLen is the length of an entry's proxy fields.
const proxyLen = 10

// proxyFlags are the conntrack.Proxy flags that travel.
const proxyFlags = conntrack.ProxyTS | conntrack.ProxyWScale | conntrack.ProxySACK

// Typed errors of the parser, matched with errors.Is.
var (
	ErrShort   = errors.New("datagram too short")
	ErrMagic   = errors.New("not a session sync datagram")
	ErrVersion = errors.New("unsupported version")
	ErrCluster = errors.New("foreign cluster")
	ErrAuth    = errors.New("authentication failed")
	ErrReplay  = errors.New("replayed or too old")
	ErrEntry   = errors.New("malformed entry")
	ErrType    = errors.New("unknown datagram type")
)

// Header is a datagram's header.
type Header struct {
	Type    MsgType
	Cluster uint32
	Seq     uint64
	Count   int
}

func is4(a *[16]byte) bool {
	return a[0]|a[1]|a[2]|a[3]|a[4]|a[5]|a[6]|a[7]|a[8]|a[9] == 0 && a[10] == 0xff && a[11] == 0xff
}

// EncodedLen returns e's length on the wire.
func (e *Entry) EncodedLen() int {
	n := 12 + 2*4 + 4
	if !is4(&e.Client) {
		n += 2 * 12
	}
	if !is4(&e.Member) {
		n += 12
	}
	if e.Proxied {
		n += proxyLen
	}
	return n
}

// appendEntry appends e's encoding to b.
func appendEntry(b []byte, e *Entry) []byte {
	v6, m6 := !is4(&e.Client), !is4(&e.Member)
	f := byte(e.Op) & 3
	if v6 {
		f |= 1 << 2
	}
	if m6 {
		f |= 1 << 3
	}
	if e.Proxied {
		f |= 1 << 4
	}
	b = append(b, f, e.Proto, byte(e.State), byte(e.Encap))
	b = binary.BigEndian.AppendUint32(b, e.TTL)
	b = binary.BigEndian.AppendUint16(b, e.ClientPort)
	b = binary.BigEndian.AppendUint16(b, e.VIPPort)
	addr := func(a *[16]byte, six bool) {
		if six {
			b = append(b, a[:]...)
		} else {
			b = append(b, a[12:]...)
		}
	}
	addr(&e.Client, v6)
	addr(&e.VIP, v6)
	addr(&e.Member, m6)
	if e.Proxied {
		b = binary.BigEndian.AppendUint32(b, e.Proxy.SeqDelta)
		b = binary.BigEndian.AppendUint32(b, e.Proxy.TSDelta)
		b = append(b, byte(e.Proxy.WShift), e.Proxy.Flags&proxyFlags)
	}
	return b
}

// decodeEntry decodes the entry at the start of b and returns its length.
func decodeEntry(b []byte, e *Entry) (int, error) {
	if len(b) < MinEntryLen {
		return 0, ErrShort
	}
	f := b[0]
	v6, m6 := f&(1<<2) != 0, f&(1<<3) != 0
	*e = Entry{Op: Op(f & 3), Proto: b[1], State: conntrack.State(b[2]), Encap: Encap(b[3])}
	if f&^0x1f != 0 {
		return 0, fmt.Errorf("%w: reserved flag bits %#x", ErrEntry, f&^0x1f)
	}
	e.Proxied = f&(1<<4) != 0
	if e.Proto != 6 && e.Proto != 17 {
		return 0, fmt.Errorf("%w: protocol %d", ErrEntry, e.Proto)
	}
	switch e.Op {
	case OpUpsert:
		switch e.State {
		case conntrack.StateEstablished, conntrack.StateFin, conntrack.StateClose, conntrack.StateUDP:
		default:
			return 0, fmt.Errorf("%w: state %v", ErrEntry, e.State)
		}
	case OpDelete:
		if e.State != 0 {
			return 0, fmt.Errorf("%w: delete with state %v", ErrEntry, e.State)
		}
		if e.Proxied {
			return 0, fmt.Errorf("%w: delete with proxy state", ErrEntry)
		}
	default:
		return 0, fmt.Errorf("%w: op %d", ErrEntry, e.Op)
	}
	if e.Encap < EncapGRE || e.Encap > EncapIPIP {
		return 0, fmt.Errorf("%w: encapsulation %d", ErrEntry, e.Encap)
	}
	e.TTL = binary.BigEndian.Uint32(b[4:])
	e.ClientPort = binary.BigEndian.Uint16(b[8:])
	e.VIPPort = binary.BigEndian.Uint16(b[10:])
	n := 12
	addr := func(a *[16]byte, six bool) error {
		if six {
			if len(b) < n+16 {
				return ErrShort
			}
			copy(a[:], b[n:n+16])
			n += 16
			if is4(a) {
				return fmt.Errorf("%w: IPv4-mapped address in an IPv6 field", ErrEntry)
			}
			return nil
		}
		if len(b) < n+4 {
			return ErrShort
		}
		*a = [16]byte{10: 0xff, 11: 0xff}
		copy(a[12:], b[n:n+4])
		n += 4
		return nil
	}
	for _, a := range []struct {
		p   *[16]byte
		six bool
	}{{&e.Client, v6}, {&e.VIP, v6}, {&e.Member, m6}} {
		if err := addr(a.p, a.six); err != nil {
			return 0, err
		}
	}
	if e.Proxied {
		if len(b) < n+proxyLen {
			return 0, ErrShort
		}
		e.Proxy = conntrack.Proxy{SeqDelta: binary.BigEndian.Uint32(b[n:]), TSDelta: binary.BigEndian.Uint32(b[n+4:]),
			WShift: int8(b[n+8]), Flags: b[n+9] | conntrack.ProxyOn}
		if b[n+9]&^proxyFlags != 0 {
			return 0, fmt.Errorf("%w: proxy flags %#x", ErrEntry, b[n+9])
		}
		if e.Proxy.WShift < -conntrack.MaxWShift || e.Proxy.WShift > conntrack.MaxWShift {
			return 0, fmt.Errorf("%w: window shift %d", ErrEntry, e.Proxy.WShift)
		}
		n += proxyLen
	}
	return n, nil
}

// Batch builds datagrams of entries up to a size (the path MTU less the IP and UDP
// headers). Reuse one: Reset, Add until it is full, Seal.
type Batch struct {
	buf   []byte
	limit int
	count int
}

// NewBatch returns a batch whose datagrams are at most size bytes, which must be in
// MinDatagram..MaxDatagram.
func NewBatch(size int) (*Batch, error) {
	if size < MinDatagram || size > MaxDatagram {
		return nil, fmt.Errorf("session sync datagram size %d is outside %d..%d", size, MinDatagram, MaxDatagram)
	}
	return &Batch{buf: make([]byte, 0, size), limit: size}, nil
}

// Reset starts a datagram of type typ.
func (b *Batch) Reset(typ MsgType, cluster uint32, seq uint64) {
	b.buf = append(b.buf[:0], magic0, magic1, Version, byte(typ))
	b.buf = binary.BigEndian.AppendUint32(b.buf, cluster)
	b.buf = binary.BigEndian.AppendUint64(b.buf, seq)
	b.buf = append(b.buf, 0, 0)
	b.count = 0
}

// Add appends e and reports true, or reports false when e does not fit (Seal and
// start another).
func (b *Batch) Add(e *Entry) bool {
	if len(b.buf)+e.EncodedLen()+MACLen > b.limit || b.count == 0xffff {
		return false
	}
	b.buf = appendEntry(b.buf, e)
	b.count++
	return true
}

// Len returns how many entries the datagram holds.
func (b *Batch) Len() int { return b.count }

// SetSeq rewrites the datagram's sequence number (before Seal).
func (b *Batch) SetSeq(seq uint64) { binary.BigEndian.PutUint64(b.buf[8:], seq) }

// Seal writes the count and the MAC (mac is an HMAC-SHA256 with the cluster key,
// NewMAC) and returns the datagram, valid until the next Reset.
func (b *Batch) Seal(mac hash.Hash) []byte {
	binary.BigEndian.PutUint16(b.buf[16:], uint16(b.count))
	mac.Reset()
	mac.Write(b.buf)
	b.buf = mac.Sum(b.buf)
	return b.buf
}

// NewMAC returns the HMAC-SHA256 of key that seals and opens datagrams.
func NewMAC(key []byte) hash.Hash { return hmac.New(sha256.New, key) }

// Open checks a datagram (magic, version, cluster, MAC, type, length) and returns its
// header and its entries' bytes, for Decode. Errors wrap the typed errors above.
func Open(msg []byte, mac hash.Hash, cluster uint32) (Header, []byte, error) {
	var h Header
	if len(msg) < HeaderLen+MACLen {
		return h, nil, fmt.Errorf("opening sync datagram of %d bytes: %w", len(msg), ErrShort)
	}
	if msg[0] != magic0 || msg[1] != magic1 {
		return h, nil, fmt.Errorf("opening sync datagram: %w", ErrMagic)
	}
	if msg[2] != Version {
		return h, nil, fmt.Errorf("opening sync datagram: version %d: %w", msg[2], ErrVersion)
	}
	h.Type = MsgType(msg[3])
	h.Cluster = binary.BigEndian.Uint32(msg[4:])
	h.Seq = binary.BigEndian.Uint64(msg[8:])
	h.Count = int(binary.BigEndian.Uint16(msg[16:]))
	if h.Cluster != cluster {
		return h, nil, fmt.Errorf("opening sync datagram: cluster %d, not %d: %w", h.Cluster, cluster, ErrCluster)
	}
	body := msg[:len(msg)-MACLen]
	mac.Reset()
	mac.Write(body)
	var sum [MACLen]byte
	if !hmac.Equal(mac.Sum(sum[:0]), msg[len(body):]) {
		return h, nil, fmt.Errorf("opening sync datagram: %w", ErrAuth)
	}
	switch h.Type {
	case MsgEntries:
	case MsgFullSyncRequest, MsgFullSyncDone:
		if h.Count != 0 || len(body) != HeaderLen {
			return h, nil, fmt.Errorf("opening sync datagram: type %d with a body: %w", h.Type, ErrEntry)
		}
	default:
		return h, nil, fmt.Errorf("opening sync datagram: type %d: %w", h.Type, ErrType)
	}
	return h, body[HeaderLen:], nil
}

// Decode decodes count entries from body (what Open returned), appending them to dst.
// Trailing bytes or fewer entries than count are an error; on error dst holds the
// entries decoded before it.
func Decode(dst []Entry, body []byte, count int) ([]Entry, error) {
	off := 0
	for i := range count {
		var e Entry
		n, err := decodeEntry(body[off:], &e)
		if err != nil {
			return dst, fmt.Errorf("decoding sync entry %d at byte %d: %w", i, HeaderLen+off, err)
		}
		dst = append(dst, e)
		off += n
	}
	if off != len(body) {
		return dst, fmt.Errorf("decoding sync entries: %d bytes after %d entries: %w", len(body)-off, count, ErrEntry)
	}
	return dst, nil
}

// Window is the replay window of one peer: the highest sequence accepted and which
// of the 64 below it were. Sequences more than 64 below the highest are refused.
type Window struct {
	max  uint64
	seen uint64 // bit i: max-i accepted
}

// Accept reports whether seq is new, and records it. Call it only for a datagram
// whose MAC was checked.
func (w *Window) Accept(seq uint64) bool {
	switch {
	case seq > w.max:
		if d := seq - w.max; d >= 64 {
			w.seen = 1
		} else {
			w.seen = w.seen<<d | 1
		}
		w.max = seq
		return true
	case w.max-seq >= 64:
		return false
	default:
		bit := uint64(1) << (w.max - seq)
		if w.seen&bit != 0 {
			return false
		}
		w.seen |= bit
		return true
	}
}

// Addr returns a's netip form: an IPv4 address as IPv4.
func Addr(a [16]byte) netip.Addr { return netip.AddrFrom16(a).Unmap() }
