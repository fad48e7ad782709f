//go:build linux

package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/wire"
)

// Endpoint is a running tunnel endpoint: a TUN device carrying the VIPs, the policy
// rules that route replies into it, and raw sockets towards the LDs. New sets it all
// up (in the calling thread's network namespace), Run moves packets, Close removes it.
type Endpoint struct {
	core *core
	log  *slog.Logger
	dev  string

	tun   *os.File
	socks []*rawSock
	nl    *netlink.Handle
	rules []*netlink.Rule
	coll  *collector

	running   atomic.Bool
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// rawSock is one raw IP socket: family and protocol.
type rawSock struct {
	v6    bool
	proto uint8
	f     *os.File
	rc    syscall.RawConn
}

// New validates cfg, creates the TUN device with the VIPs, installs the reply routing
// and opens the raw sockets. It needs CAP_NET_ADMIN and CAP_NET_RAW. Everything is made
// in the network namespace of the calling OS thread.
func New(cfg Config) (*Endpoint, error) {
	cfg.VIPs = slices.Clone(cfg.VIPs)
	cfg.LDs = slices.Clone(cfg.LDs)
	cfg.LDRanges = slices.Clone(cfg.LDRanges)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Endpoint{core: newCore(cfg), log: cfg.Logger}
	if err := e.setup(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Endpoint) setup() error {
	cfg := &e.core.cfg
	var err error
	if e.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return fmt.Errorf("tunnel: opening netlink: %w", err)
	}
	if e.tun, e.dev, err = openTUN(cfg.Device); err != nil {
		return err
	}
	link, err := e.nl.LinkByName(e.dev)
	if err != nil {
		return fmt.Errorf("tunnel: finding device %s: %w", e.dev, err)
	}
	if err := e.nl.LinkSetMTU(link, cfg.MTU); err != nil {
		return fmt.Errorf("tunnel: setting MTU %d on %s: %w", cfg.MTU, e.dev, err)
	}
	has6 := slices.ContainsFunc(cfg.VIPs, netip.Addr.Is6)
	has4 := slices.ContainsFunc(cfg.VIPs, netip.Addr.Is4)
	// Packets from clients arrive on the device. Even under strict reverse-path
	// filtering (net.ipv4.conf.all.rp_filter=1 wins over the device's 0) they pass,
	// since the rules below route the replies back through it; failing to set it (a
	// read-only /proc/sys) is therefore no reason to stop.
	if err := sysctl("net/ipv4/conf/"+e.dev+"/rp_filter", "0"); err != nil {
		e.log.Warn("tunnel: leaving reverse-path filtering of the device as it is", "err", err)
	}
	if has6 {
		// No link-local address: nothing but replies from VIPs comes out of the device.
		_ = sysctl("net/ipv6/conf/"+e.dev+"/addr_gen_mode", "1")
		if err := sysctl("net/ipv6/conf/"+e.dev+"/disable_ipv6", "0"); err != nil {
			return err
		}
	} else {
		_ = sysctl("net/ipv6/conf/"+e.dev+"/disable_ipv6", "1") // absent without IPv6
	}
	if err := e.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("tunnel: setting %s up: %w", e.dev, err)
	}
	for _, v := range cfg.VIPs {
		a := &netlink.Addr{IPNet: hostNet(v)}
		if v.Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := e.nl.AddrAdd(link, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("tunnel: adding VIP %s to %s: %w", v, e.dev, err)
		}
	}
	for _, fam := range []struct {
		want bool
		dst  *net.IPNet
	}{
		{has4, &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}},
		{has6, &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	} {
		if !fam.want {
			continue
		}
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: fam.dst, Table: cfg.Table, Scope: netlink.SCOPE_LINK}
		if err := e.nl.RouteReplace(r); err != nil {
			return fmt.Errorf("tunnel: adding default route via %s to table %d: %w", e.dev, cfg.Table, err)
		}
	}
	for _, v := range cfg.VIPs {
		r := netlink.NewRule()
		r.Src = hostNet(v)
		r.Table = cfg.Table
		r.Family = netlink.FAMILY_V4
		if v.Is6() {
			r.Family = netlink.FAMILY_V6
		}
		_ = e.nl.RuleDel(r) // left by an endpoint that did not close
		if err := e.nl.RuleAdd(r); err != nil {
			return fmt.Errorf("tunnel: adding rule from %s lookup %d: %w", v, cfg.Table, err)
		}
		e.rules = append(e.rules, r)
	}
	ld4, ld6 := cfg.hasLDFamily(false), cfg.hasLDFamily(true)
	for _, s := range []struct {
		want  bool
		v6    bool
		proto uint8
	}{
		{ld4, false, protoGRE}, {ld4 && has4, false, protoIPIP}, {ld4 && has6, false, protoIPv6},
		{ld6, true, protoGRE}, {ld6 && has4, true, protoIPIP}, {ld6 && has6, true, protoIPv6},
	} {
		if !s.want {
			continue
		}
		rs, err := openRaw(s.v6, s.proto, cfg.Local)
		if err != nil {
			return err
		}
		e.socks = append(e.socks, rs)
	}
	if cfg.Registerer != nil {
		c := newCollector(e.core)
		if err := cfg.Registerer.Register(c); err != nil {
			return fmt.Errorf("tunnel: registering metrics: %w", err)
		}
		e.coll = c
	}
	return nil
}

// Device returns the TUN device's name.
func (e *Endpoint) Device() string { return e.dev }

// Stats returns the endpoint's counters.
func (e *Endpoint) Stats() Stats { return e.core.stats() }

// Run moves packets until ctx is done or the endpoint is closed (then it returns nil),
// or until reading a socket or the device fails. It may be called once.
func (e *Endpoint) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("tunnel: Run called twice")
	}
	if e.tun == nil {
		return errors.New("tunnel: endpoint closed")
	}
	e.log.Info("tunnel endpoint running", "device", e.dev, "vips", e.core.cfg.VIPs,
		"lds", e.core.cfg.LDs, "ld_ranges", e.core.cfg.LDRanges, "key", e.core.cfg.Key != 0,
		"mtu", e.core.cfg.MTU, "table", e.core.cfg.Table)
	errc := make(chan error, len(e.socks)+1)
	var wg sync.WaitGroup
	for _, s := range e.socks {
		r := newReader(e, s)
		wg.Go(func() { errc <- r.run() })
	}
	w := newWriter(e)
	wg.Go(func() { errc <- w.run() })
	stop := make(chan struct{})
	wg.Go(func() {
		t := time.NewTicker(e.core.sweepInterval())
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				e.core.sweep()
			}
		}
	})
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	past := time.Unix(1, 0)
	e.tun.SetDeadline(past)
	for _, s := range e.socks {
		s.f.SetDeadline(past)
	}
	close(stop)
	wg.Wait()
	if e.closed.Load() || errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil
	}
	return err
}

// Close removes the policy rules, the TUN device (with its addresses and routes) and the
// sockets, and unregisters the metrics. Run returns. Close may be called more than once.
func (e *Endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		var errs []error
		for _, r := range e.rules {
			if err := e.nl.RuleDel(r); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("tunnel: removing rule from %s: %w", r.Src, err))
			}
		}
		for _, s := range e.socks {
			s.f.Close()
		}
		if e.tun != nil {
			if err := e.tun.Close(); err != nil {
				errs = append(errs, fmt.Errorf("tunnel: closing %s: %w", e.dev, err))
			}
		}
		if e.nl != nil {
			e.nl.Close()
		}
		if e.coll != nil {
			e.core.cfg.Registerer.Unregister(e.coll)
		}
		e.closeErr = errors.Join(errs...)
	})
	return e.closeErr
}

// reader moves packets from one raw socket to the TUN device.
type reader struct {
	e       *Endpoint
	s       *rawSock
	buf     []byte
	n       int
	errno   syscall.Errno
	from    unix.RawSockaddrInet6
	fromLen uint32
	noter   ldNoter
	readFn  func(uintptr) bool
}

func newReader(e *Endpoint, s *rawSock) *reader {
	r := &reader{e: e, s: s, buf: make([]byte, 1<<16)}
	r.readFn = r.read
	return r
}

// read is the RawConn callback: one datagram into r.buf, with its source for IPv6.
func (r *reader) read(fd uintptr) bool {
	for {
		var n uintptr
		var errno syscall.Errno
		if r.s.v6 {
			r.fromLen = unix.SizeofSockaddrInet6
			n, _, errno = unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)),
				0, uintptr(unsafe.Pointer(&r.from)), uintptr(unsafe.Pointer(&r.fromLen)))
		} else {
			n, _, errno = unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)))
		}
		switch errno {
		case 0:
			r.n, r.errno = int(n), 0
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			r.n, r.errno = 0, errno
			return true
		}
	}
}

func (r *reader) run() error {
	e := r.e
	for {
		if err := r.s.rc.Read(r.readFn); err != nil {
			return err
		}
		if r.errno != 0 {
			if r.errno == unix.ENOBUFS || r.errno == unix.ENOMEM {
				continue
			}
			return fmt.Errorf("tunnel: reading raw socket (protocol %d): %w", r.s.proto, r.errno)
		}
		inner, res := e.core.inbound(r.s.v6, r.s.proto, r.buf[:r.n], &r.from.Addr, &r.noter)
		if inner != nil {
			if _, err := e.tun.Write(inner); err != nil {
				if errors.Is(err, os.ErrClosed) {
					return err
				}
				res = inError
			}
		}
		e.core.count(res)
	}
}

// writer moves replies from the TUN device to the LDs. The buffer keeps room before the
// packet for the GRE header.
type writer struct {
	e      *Endpoint
	buf    []byte
	key    uint32 // Config.Key
	gre    int    // the GRE header's length
	fc     fragCache
	out    []byte
	v6     bool
	sa4    unix.RawSockaddrInet4
	sa6    unix.RawSockaddrInet6
	errno  syscall.Errno
	sendFn func(uintptr) bool
}

func newWriter(e *Endpoint) *writer {
	w := &writer{e: e, buf: make([]byte, wire.GREKeyHeaderLen+1<<16), key: e.core.cfg.Key, gre: wire.SendLen(e.core.cfg.Key)}
	w.sa4.Family = unix.AF_INET
	w.sa6.Family = unix.AF_INET6
	w.sendFn = w.send
	return w
}

// send is the RawConn callback: w.out to the address in w.sa4 or w.sa6.
func (w *writer) send(fd uintptr) bool {
	sa, salen := unsafe.Pointer(&w.sa4), uintptr(unix.SizeofSockaddrInet4)
	if w.v6 {
		sa, salen = unsafe.Pointer(&w.sa6), uintptr(unix.SizeofSockaddrInet6)
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&w.out[0])), uintptr(len(w.out)), 0, uintptr(sa), salen)
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		w.errno = errno
		return true
	}
}

func (w *writer) run() error {
	e := w.e
	for {
		const room = wire.GREKeyHeaderLen
		n, err := e.tun.Read(w.buf[room:])
		if err != nil {
			return err
		}
		pkt := w.buf[room : room+n]
		p, alt, res := e.core.route(pkt, &w.fc)
		switch res {
		case outOK, outFallback, outHashed:
		case outDeadLD:
			// The live LD's copy first, and its fate is the one counted; the dead
			// LD gets the packet too, in case it is only quiet.
			if err := w.sendTo(alt, pkt, room, n); err != nil {
				return err
			}
			errno := w.errno
			if err := w.sendTo(p, pkt, room, n); err != nil {
				return err
			}
			w.errno = errno
		default:
			e.core.count(res)
			continue
		}
		if res != outDeadLD {
			if err := w.sendTo(p, pkt, room, n); err != nil {
				return err
			}
		}
		switch w.errno {
		case 0:
		case unix.EMSGSIZE:
			res = outTooBig
		default:
			res = outError
		}
		e.core.count(res)
	}
}

// sendTo encapsulates pkt (w.buf[room:room+n]) for p and sends it, leaving the result in
// w.errno (EAFNOSUPPORT when there is no socket for it); the error is the raw socket's
// failure.
func (w *writer) sendTo(p peer, pkt []byte, room, n int) error {
	var proto uint8
	if p.mode == modeGRE {
		proto = protoGRE
		wire.PutGREKey(w.buf[room-w.gre:], wire.GREProtocol(pkt[0]>>4 == 6), w.key)
		w.out = w.buf[room-w.gre : room+n]
	} else {
		proto = wire.IPIPProto(pkt[0]>>4 == 6)
		w.out = pkt
	}
	s := w.e.sock(p.v6, proto)
	if s == nil { // no LD of that family, or a packet of a family without VIPs
		w.errno = unix.EAFNOSUPPORT
		return nil
	}
	w.v6 = p.v6
	if p.v6 {
		w.sa6.Addr = p.addr
	} else {
		copy(w.sa4.Addr[:], p.addr[:4])
	}
	return s.rc.Write(w.sendFn)
}

func (e *Endpoint) sock(v6 bool, proto uint8) *rawSock {
	for _, s := range e.socks {
		if s.v6 == v6 && s.proto == proto {
			return s
		}
	}
	return nil
}

// openTUN creates (or attaches to) the TUN device name, without packet information
// headers, non-blocking under the runtime's poller.
func openTUN(name string) (*os.File, string, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, "", fmt.Errorf("tunnel: opening /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, "", fmt.Errorf("tunnel: device name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, "", fmt.Errorf("tunnel: creating TUN device %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), ifr.Name(), nil
}

// openRaw opens a raw socket for protocol proto, bound to local when it is of the
// socket's family, with path MTU discovery on (DF set; too big is an error, not a
// fragment).
func openRaw(v6 bool, proto uint8, local netip.Addr) (*rawSock, error) {
	fam, name := unix.AF_INET, "ip4"
	if v6 {
		fam, name = unix.AF_INET6, "ip6"
	}
	name = fmt.Sprintf("%s:%d", name, proto)
	fd, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, fmt.Errorf("tunnel: opening raw socket %s: %w", name, err)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	if v6 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tunnel: setting path MTU discovery on %s: %w", name, err)
	}
	if local.IsValid() && local.Is6() == v6 {
		var sa unix.Sockaddr = &unix.SockaddrInet4{Addr: local.As4()}
		if v6 {
			sa = &unix.SockaddrInet6{Addr: local.As16()}
		}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("tunnel: binding raw socket %s to %s: %w", name, local, err)
		}
	}
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("tunnel: raw socket %s: %w", name, err)
	}
	return &rawSock{v6: v6, proto: proto, f: f, rc: rc}, nil
}

// hostNet is a as a /32 or /128 network.
func hostNet(a netip.Addr) *net.IPNet {
	bits := a.BitLen()
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}
}

// sysctl writes value to /proc/sys/key, in the calling thread's network namespace.
func sysctl(key, value string) error {
	if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0); err != nil {
		return fmt.Errorf("tunnel: setting %s: %w", key, err)
	}
	return nil
}
