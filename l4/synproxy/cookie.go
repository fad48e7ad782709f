package synproxy

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// MSSTable holds the MSS values a cookie can encode (3 bits), as Linux's msstab: a
// client's MSS is taken down to the largest entry at or below it. Besides Linux's
// values it holds the MSS of a 1500-byte tunnel (GRE with its key: 1432 for IPv4
// inside, 1412 for IPv6; 4 bytes less than without the key), so that the member is
// told nearly the MSS the LD clamps SYNs to.
var MSSTable = [8]uint16{536, 1220, 1300, 1400, 1412, 1432, 1460, 8960}

// MSSIndex returns the index in MSSTable of the largest value at or below mss (0 for
// anything below 536).
func MSSIndex(mss uint16) int {
	i := len(MSSTable) - 1
	for i > 0 && MSSTable[i] > mss {
		i--
	}
	return i
}

// Tuple is a connection as the client sends it: its address and port, and the VIP's.
// Addresses are 16 bytes (netip.Addr.As16: IPv4 in its IPv4-mapped form).
type Tuple struct {
	Src, Dst         [16]byte
	SrcPort, DstPort uint16
}

// MaxAge is how many minute counters a cookie lives: the minute it was made in and
// the one after, as Linux's MAX_SYNCOOKIE_AGE.
const MaxAge = 2

// key is one SipHash key.
type key struct{ k0, k1 uint64 }

// Keys are the cookie keys of one rotation epoch and the one before. The zero value
// holds no key; Update fills it. Keys belongs to one goroutine.
type Keys struct {
	secret    [32]byte
	rotate    int64 // seconds per epoch
	epoch     int64 // epoch of cur; -1 before the first Update
	cur, prev key
}

// NewKeys makes the keys derived from secret, a new one every rotate (at least a
// minute). An empty secret is replaced by 32 random bytes: only this process then
// accepts its cookies.
func NewKeys(secret []byte, rotate time.Duration) *Keys {
	k := &Keys{epoch: -1, rotate: int64(max(rotate, time.Minute) / time.Second)}
	if len(secret) == 0 {
		_, _ = rand.Read(k.secret[:])
	} else {
		k.secret = sha256.Sum256(secret)
	}
	return k
}

// derive returns the key of epoch e: the first 16 bytes of SHA-256(secret, e).
func (k *Keys) derive(e int64) key {
	var b [40]byte
	copy(b[:], k.secret[:])
	binary.BigEndian.PutUint64(b[32:], uint64(e))
	s := sha256.Sum256(b[:])
	return key{binary.LittleEndian.Uint64(s[0:]), binary.LittleEndian.Uint64(s[8:])}
}

// Update sets the keys for the Unix time unix (seconds): a rotation derives the new
// epoch's key and keeps the one before. It costs nothing while the epoch is the same.
func (k *Keys) Update(unix int64) {
	e := unix / k.rotate
	if e == k.epoch {
		return
	}
	switch e {
	case k.epoch + 1:
		k.prev = k.cur
	default:
		k.prev = k.derive(e - 1)
	}
	k.cur = k.derive(e)
	k.epoch = e
}

// Minute returns the cookie counter for Unix time unix (seconds).
func Minute(unix int64) uint32 { return uint32(unix / 60) }

// hash is SipHash over the tuple, with the counter and a domain byte that tell H1
// (no counter) from H2.
func (t *Tuple) hash(k key, count uint32, h2 bool) uint32 {
	var b [44]byte
	copy(b[0:16], t.Src[:])
	copy(b[16:32], t.Dst[:])
	binary.LittleEndian.PutUint16(b[32:], t.SrcPort)
	binary.LittleEndian.PutUint16(b[34:], t.DstPort)
	binary.LittleEndian.PutUint32(b[36:], count)
	if h2 {
		b[40] = 1
	}
	return uint32(sipHash(k.k0, k.k1, b[:]))
}

const (
	cookieBits = 24
	cookieMask = 1<<cookieBits - 1
)

func makeCookie(k key, t *Tuple, isn, count uint32, data uint32) uint32 {
	return t.hash(k, 0, false) + isn + count<<cookieBits +
		(t.hash(k, count, true)+data)&cookieMask
}

func checkCookie(k key, t *Tuple, isn, count, cookie uint32) (uint32, bool) {
	c := cookie - t.hash(k, 0, false) - isn
	diff := (count - c>>cookieBits) & (1<<(32-cookieBits) - 1)
	if diff >= MaxAge {
		return 0, false
	}
	data := (c - t.hash(k, count-diff, true)) & cookieMask
	if data >= uint32(len(MSSTable)) {
		return 0, false
	}
	return data, true
}

// Cookie returns the initial sequence number of the LD's SYN-ACK to the client of t,
// whose SYN had sequence number isn, encoding MSSTable[mssIndex], for minute count
// (Minute). Update must have been called.
func (k *Keys) Cookie(t *Tuple, isn, count uint32, mssIndex int) uint32 {
	return makeCookie(k.cur, t, isn, count, uint32(mssIndex)&7)
}

// Check checks the ACK of a handshake the LD answered with a cookie: ack is its
// acknowledgment number (cookie+1) and seq its sequence number (the client's ISN+1).
// It reports the MSS the cookie encodes, under the current key or the previous
// epoch's, made this minute or the one before.
func (k *Keys) Check(t *Tuple, seq, ack, count uint32) (mss uint16, ok bool) {
	isn, cookie := seq-1, ack-1
	if d, ok := checkCookie(k.cur, t, isn, count, cookie); ok {
		return MSSTable[d], true
	}
	if d, ok := checkCookie(k.prev, t, isn, count, cookie); ok {
		return MSSTable[d], true
	}
	return 0, false
}

// Timestamp option bits in the low bits of the LD's TSval (Linux's TS_OPT_*).
const (
	tsWScaleMask = 0x0f // the client's window scale, 0xf: none
	tsSACK       = 1 << 4
	tsECN        = 1 << 5
	tsMask       = 0x3f
)

// Negotiated is what a client's SYN offered that the cookie keeps.
type Negotiated struct {
	// WScale is the client's window scale, valid when HasWScale.
	WScale    uint8
	HasWScale bool
	// SACK says the client sent SACK-permitted.
	SACK bool
	// ECN says the client asked for ECN.
	ECN bool
}

// CookieTSval returns the LD's TSval for a SYN-ACK at TS clock now (milliseconds),
// carrying n in its low 6 bits, and never ahead of now, as Linux's
// cookie_init_timestamp.
func CookieTSval(now uint32, n Negotiated) uint32 {
	opt := uint32(tsWScaleMask)
	if n.HasWScale {
		opt = uint32(n.WScale) & tsWScaleMask
	}
	if n.SACK {
		opt |= tsSACK
	}
	if n.ECN {
		opt |= tsECN
	}
	ts := now&^tsMask | opt
	if int32(ts-now) > 0 {
		ts -= tsMask + 1
	}
	return ts
}

// maxTSAge is how old, in TS clock milliseconds, the TSecr of a cookie ACK may be.
const maxTSAge = MaxAge * 60 * 1000

// DecodeTSecr returns what a cookie ACK's TSecr carries (the LD's TSval echoed) at TS
// clock now, and false when it cannot be one of the LD's: from the future, or older
// than a cookie lives.
func DecodeTSecr(now, tsecr uint32) (Negotiated, bool) {
	var n Negotiated
	if age := int32(now - tsecr); age < -(tsMask+1) || age > maxTSAge {
		return n, false
	}
	opt := tsecr & tsMask
	if ws := opt & tsWScaleMask; ws != tsWScaleMask {
		n.WScale, n.HasWScale = uint8(min(ws, MaxWScale)), true
	}
	n.SACK = opt&tsSACK != 0
	n.ECN = opt&tsECN != 0
	return n, true
}
