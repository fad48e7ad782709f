// Package synflood sends a bounded flood of spoofed TCP SYNs from a network namespace,
// for the tests and benchmarks of SYN-flood defences (the LD's SYN proxy, the kernel's
// nftables synproxy). Every SYN comes from a random address of a configured prefix
// and a random port, with a random initial sequence number and the options a Linux
// client sends (MSS, SACK permitted, timestamps, window scale), so a receiver takes
// its SYN-cookie path as it would for a real client. IPv4 and IPv6.
//
// The frames are written on an AF_PACKET socket bound to one interface, in batches
// (sendmmsg), bypassing the qdisc. A flood is always bounded: a frame count is
// required, and a duration bounds it too. Addresses must come from the ranges set
// aside for tests (198.18.0.0/15, 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
// 2001:db8::/32); anything else is refused, so nothing here can flood a real network.
package synflood

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/internal/nsenter"
)

// Limits of a flood.
const (
	// MaxCount is the most frames one Run sends.
	MaxCount = 1_000_000_000
	// DefaultDuration bounds a Run whose Config.Duration is 0.
	DefaultDuration = 30 * time.Second
	// MaxDuration is the longest Config.Duration accepted.
	MaxDuration = 10 * time.Minute
	// DefaultBatch is the frames per sendmmsg call when Config.Batch is 0.
	DefaultBatch = 64
	maxBatch     = 1024
)

// Frame lengths: Ethernet, IP and a TCP header of 40 bytes (20 of options).
const (
	FrameLen4 = 14 + 20 + 40 // 74
	FrameLen6 = 14 + 40 + 40 // 94
)

// Window scale and window of the SYNs, as a Linux client (tcp_rmem defaults) sends them.
const (
	WScale = 7
	Window = 64240
)

// testRanges are the only addresses a flood may use, as source or destination.
var testRanges = []netip.Prefix{
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// Config is one flood.
type Config struct {
	// Iface is the interface the frames are written on, in the network namespace of
	// Netns (or of the calling thread when Netns is empty). Required.
	Iface string
	// Netns is the path of the network namespace Iface is in (like
	// /run/netns/NAME); the socket is opened there. Default: the calling thread's.
	Netns string
	// SrcMAC and DstMAC are the frames' Ethernet addresses. DstMAC is required (the
	// receiver's MAC); SrcMAC defaults to Iface's own.
	SrcMAC, DstMAC [6]byte
	// Sources is the prefix the spoofed source addresses are drawn from, uniformly.
	// Required; it must lie inside one of the test ranges (see the package doc) and
	// be of Dst's family.
	Sources netip.Prefix
	// Dst is the address and port the SYNs go to. Required, inside a test range.
	Dst netip.AddrPort
	// Count is how many frames are sent. Required: 1 to MaxCount.
	Count int
	// Rate is the frames per second to send at most; 0 means as fast as the socket
	// takes them.
	Rate int
	// Duration bounds the flood in time: it stops when Duration has passed even if
	// Count frames have not been sent. 0 means DefaultDuration; at most MaxDuration.
	Duration time.Duration
	// Batch is the frames per sendmmsg call; 0 means DefaultBatch; at most 1024.
	Batch int
	// MSS is the MSS option's value; 0 means 1460 for IPv4, 1440 for IPv6.
	MSS uint16
	// Seed seeds the random sources, ports, sequence numbers and timestamps, so a
	// flood can be repeated; 0 means a random seed.
	Seed uint64
}

// Stats is what a Run did.
type Stats struct {
	// Sent is the frames the kernel took; Refused those it refused for want of
	// buffers (ENOBUFS, EAGAIN). Sent + Refused frames were built.
	Sent, Refused uint64
	// Calls is the sendmmsg calls made.
	Calls uint64
	// Elapsed is the time from the first frame to the last.
	Elapsed time.Duration
}

// Rate is Sent frames per second over Elapsed.
func (s Stats) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Sent) / s.Elapsed.Seconds()
}

// InTestRange reports whether every address of p lies in a range set aside for tests.
func InTestRange(p netip.Prefix) bool {
	for _, r := range testRanges {
		if r.Addr().Is4() == p.Addr().Is4() && p.Bits() >= r.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// check validates the fields a Builder needs.
func (c *Config) checkFrames() error {
	switch {
	case !c.Sources.IsValid():
		return errors.New("synflood: Sources is required")
	case !c.Dst.IsValid() || c.Dst.Port() == 0:
		return errors.New("synflood: Dst (address and a port) is required")
	case c.Sources.Addr().Is4() != c.Dst.Addr().Is4() || c.Dst.Addr().Is4In6():
		return fmt.Errorf("synflood: Sources %v and Dst %v are of different families", c.Sources, c.Dst)
	case !InTestRange(c.Sources.Masked()):
		return fmt.Errorf("synflood: Sources %v is not inside a test range (198.18.0.0/15, 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32)", c.Sources)
	case !InTestRange(netip.PrefixFrom(c.Dst.Addr(), c.Dst.Addr().BitLen())):
		return fmt.Errorf("synflood: Dst %v is not inside a test range", c.Dst)
	}
	return nil
}

// check validates the whole config for Run.
func (c *Config) check() error {
	if err := c.checkFrames(); err != nil {
		return err
	}
	switch {
	case c.Iface == "":
		return errors.New("synflood: Iface is required")
	case c.DstMAC == [6]byte{}:
		return errors.New("synflood: DstMAC is required")
	case c.Count < 1 || c.Count > MaxCount:
		return fmt.Errorf("synflood: Count %d: want 1 to %d", c.Count, MaxCount)
	case c.Rate < 0:
		return fmt.Errorf("synflood: Rate %d is negative", c.Rate)
	case c.Duration < 0 || c.Duration > MaxDuration:
		return fmt.Errorf("synflood: Duration %v: want 0 to %v", c.Duration, MaxDuration)
	case c.Batch < 0 || c.Batch > maxBatch:
		return fmt.Errorf("synflood: Batch %d: want 0 to %d", c.Batch, maxBatch)
	}
	return nil
}

// Builder writes the frames of a flood.
type Builder struct {
	cfg    Config
	rng    *rand.Rand
	v6     bool
	base   [16]byte // Sources' address
	bits   int      // Sources' prefix length
	tmpl   []byte   // the frame with everything fixed filled in
	ipSum  uint32   // IPv4: the header's sum without the ID
	tcpSum uint32   // the TCP checksum's fixed part: pseudo-header's destination, protocol, length, Dst port, flags, window, options' fixed bytes
}

// NewBuilder checks cfg's addresses and returns a Builder for them. Only Sources,
// Dst, SrcMAC, DstMAC, MSS and Seed are used.
func NewBuilder(cfg Config) (*Builder, error) {
	if err := cfg.checkFrames(); err != nil {
		return nil, err
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	b := &Builder{cfg: cfg, rng: rand.New(rand.NewPCG(seed, 0x5f1d)), v6: cfg.Dst.Addr().Is6()}
	src := cfg.Sources.Masked()
	b.base, b.bits = src.Addr().As16(), src.Bits()
	if !b.v6 {
		b.bits += 96
	}
	mss := cfg.MSS
	if mss == 0 {
		mss = 1460
		if b.v6 {
			mss = 1440
		}
	}
	b.tmpl = make([]byte, b.FrameLen())
	t := b.tmpl
	copy(t[0:6], cfg.DstMAC[:])
	copy(t[6:12], cfg.SrcMAC[:])
	var tcp []byte
	if b.v6 {
		binary.BigEndian.PutUint16(t[12:], 0x86dd)
		ip := t[14:54]
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], 40)
		ip[6], ip[7] = unix.IPPROTO_TCP, 64
		d := cfg.Dst.Addr().As16()
		copy(ip[24:40], d[:])
		tcp = t[54:]
		b.tcpSum = sum16(d[:], 0)
	} else {
		binary.BigEndian.PutUint16(t[12:], 0x0800)
		ip := t[14:34]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], 60)
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8], ip[9] = 64, unix.IPPROTO_TCP
		d := cfg.Dst.Addr().As4()
		copy(ip[16:20], d[:])
		b.ipSum = sum16(ip, 0) // source and ID are zero in the template
		tcp = t[34:]
		b.tcpSum = sum16(d[:], 0)
	}
	b.tcpSum += unix.IPPROTO_TCP + 40
	binary.BigEndian.PutUint16(tcp[2:], cfg.Dst.Port())
	tcp[12] = 10 << 4 // 40 bytes
	tcp[13] = 0x02    // SYN
	binary.BigEndian.PutUint16(tcp[14:], Window)
	// Options as Linux orders them: MSS, SACK permitted, timestamps, NOP, window scale.
	o := tcp[20:40]
	o[0], o[1] = 2, 4
	binary.BigEndian.PutUint16(o[2:], mss)
	o[4], o[5] = 4, 2
	o[6], o[7] = 8, 10
	o[16] = 1
	o[17], o[18], o[19] = 3, 3, WScale
	b.tcpSum = sum16(tcp, b.tcpSum) // source port, sequence number, timestamp are zero here
	return b, nil
}

// FrameLen is the length of every frame: FrameLen4 or FrameLen6.
func (b *Builder) FrameLen() int {
	if b.v6 {
		return FrameLen6
	}
	return FrameLen4
}

// Next writes the next SYN into frame (FrameLen bytes at least) and returns its
// length.
func (b *Builder) Next(frame []byte) int {
	n := b.FrameLen()
	f := frame[:n]
	copy(f, b.tmpl)
	r1, r2 := b.rng.Uint64(), b.rng.Uint64()
	// The source: Sources' address with random host bits.
	src := b.base
	var rnd [16]byte
	binary.BigEndian.PutUint64(rnd[8:], b.rng.Uint64())
	if b.bits < 64 {
		binary.BigEndian.PutUint64(rnd[0:], b.rng.Uint64())
	}
	for i := range src {
		if host := min(max((i+1)*8-b.bits, 0), 8); host > 0 { // host bits in byte i
			m := byte(1<<host - 1)
			src[i] = src[i]&^m | rnd[i]&m
		}
	}
	sport := uint16(1024 + (r2&0xffffffff)%(65536-1024))
	seq, tsval, id := uint32(r1), uint32(r1>>32), uint16(r2>>32)
	var tcp []byte
	var sum uint32
	if b.v6 {
		copy(f[22:38], src[:])
		tcp = f[54:]
		sum = sum16(src[:], b.tcpSum)
	} else {
		ip := f[14:34]
		copy(ip[12:16], src[12:16])
		binary.BigEndian.PutUint16(ip[4:], id)
		isum := b.ipSum + uint32(id) + uint32(binary.BigEndian.Uint16(src[12:])) + uint32(binary.BigEndian.Uint16(src[14:]))
		binary.BigEndian.PutUint16(ip[10:], fold(isum))
		tcp = f[34:]
		sum = sum16(src[12:16], b.tcpSum)
	}
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[20+8:], tsval)
	sum += uint32(sport) + seq>>16 + seq&0xffff + tsval>>16 + tsval&0xffff
	binary.BigEndian.PutUint16(tcp[16:], fold(sum))
	return n
}

// sum16 adds b as big-endian 16-bit words (b of even length) to s.
func sum16(b []byte, s uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	return s
}

// fold folds s to 16 bits and complements it: the Internet checksum.
func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// Run sends cfg.Count SYNs (or as many as cfg.Duration allows) on cfg.Iface and
// returns what it did. It sends from the calling goroutine: lock it to its thread
// and set the thread's CPU affinity to pin the flood to a core. It stops early, with
// ctx's error, when ctx is done.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	if err := cfg.check(); err != nil {
		return Stats{}, err
	}
	fd, srcMAC, err := openSocket(cfg.Netns, cfg.Iface)
	if err != nil {
		return Stats{}, err
	}
	defer unix.Close(fd)
	if cfg.SrcMAC == [6]byte{} {
		cfg.SrcMAC = srcMAC
	}
	b, err := NewBuilder(cfg)
	if err != nil {
		return Stats{}, err
	}
	dur := cfg.Duration
	if dur == 0 {
		dur = DefaultDuration
	}
	batch := cfg.Batch
	if batch == 0 {
		batch = DefaultBatch
	}
	if cfg.Rate > 0 {
		// Pace in steps of about a millisecond.
		batch = max(1, min(batch, cfg.Rate/1000))
	}
	fl := b.FrameLen()
	bufs := make([]byte, batch*fl)
	iovs := make([]unix.Iovec, batch)
	msgs := make([]unix.Mmsghdr, batch)
	for i := range batch {
		iovs[i].Base = &bufs[i*fl]
		iovs[i].SetLen(fl)
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}
	var st Stats
	start := time.Now()
	deadline := start.Add(dur)
	done := uint64(0) // frames built: sent or refused
	for done < uint64(cfg.Count) {
		if err := ctx.Err(); err != nil {
			st.Elapsed = time.Since(start)
			return st, err
		}
		now := time.Now()
		if now.After(deadline) {
			break
		}
		if cfg.Rate > 0 {
			due := start.Add(time.Duration(float64(done) / float64(cfg.Rate) * float64(time.Second)))
			if d := due.Sub(now); d > 0 {
				time.Sleep(min(d, deadline.Sub(now)))
				continue
			}
		}
		n := min(batch, cfg.Count-int(done))
		for i := range n {
			b.Next(bufs[i*fl:])
		}
		for off := 0; off < n; {
			k, err := sendmmsg(fd, msgs[off:n])
			st.Calls++
			switch {
			case err == nil:
				st.Sent += uint64(k)
				off += k
			case errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN):
				st.Refused++
				off++
				runtime.Gosched()
			case errors.Is(err, unix.EINTR):
			default:
				st.Elapsed = time.Since(start)
				return st, fmt.Errorf("synflood: sending on %s: %w", cfg.Iface, err)
			}
		}
		done += uint64(n)
	}
	st.Elapsed = time.Since(start)
	return st, nil
}

// openSocket opens an AF_PACKET socket bound to iface (in the namespace at netns when
// set), for sending only, and returns it with iface's MAC.
func openSocket(netns, iface string) (fd int, mac [6]byte, err error) {
	open := func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return fmt.Errorf("synflood: finding interface %s: %w", iface, err)
		}
		copy(mac[:], ifi.HardwareAddr)
		// Protocol 0: the socket receives nothing.
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("synflood: opening a packet socket: %w", err)
		}
		if err := unix.Bind(s, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
			unix.Close(s)
			return fmt.Errorf("synflood: binding a packet socket to %s: %w", iface, err)
		}
		// Straight to the driver: no qdisc in the way of a flood (best effort).
		_ = unix.SetsockoptInt(s, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
		_ = unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		fd = s
		return nil
	}
	if netns != "" {
		err = nsenter.Do(netns, open)
	} else {
		err = open()
	}
	return fd, mac, err
}

// sendmmsg sends msgs and returns how many were sent; an error only when none was.
func sendmmsg(fd int, msgs []unix.Mmsghdr) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
