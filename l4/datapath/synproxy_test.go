package datapath

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/sessionsync"
	"github.com/tiergate/tiergate/l4/synproxy"
	"github.com/tiergate/tiergate/wire"
)

// pxSeg is a TCP segment src → dst as an Ethernet frame to the LD's external port.
func pxSeg(t *testing.T, src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags uint8, win uint16, opts []layers.TCPOption, payload []byte) []byte {
	t.Helper()
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: seq, Ack: ack, Window: win, Options: opts,
		SYN: flags&packet.TCPSyn != 0, ACK: flags&packet.TCPAck != 0, RST: flags&packet.TCPRst != 0, PSH: flags&packet.TCPPsh != 0}
	eth := &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}
	var nl gopacket.SerializableLayer
	if src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Flags: layers.IPv4DontFragment}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		nl = ip
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 60, NextHeader: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		nl = ip
	}
	return serialize(t, eth, nl, tcp, gopacket.Payload(payload))
}

// grePx is a member's reply: GRE over IPv4 from the member to the LD around inner,
// of either family.
func grePx(t *testing.T, member netip.Addr, inner []byte) []byte {
	proto := layers.EthernetTypeIPv4
	if inner[0]>>4 == 6 {
		proto = layers.EthernetTypeIPv6
	}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolGRE, SrcIP: member.AsSlice(), DstIP: ldInt.AsSlice()}
	return serialize(t, &layers.Ethernet{SrcMAC: memberMAC[member.String()], DstMAC: intMAC[:], EthernetType: layers.EthernetTypeIPv4},
		ip, &layers.GRE{Protocol: proto}, gopacket.Payload(inner))
}

// pxTooBig is a router's error (fragmentation needed, packet too big, MTU 1280)
// about the IP packet quoted, sent to its source (a VIP), from 198.18.0.1 or
// 2001:db8:e::1.
func pxTooBig(t *testing.T, vip netip.Addr, quoted []byte) []byte {
	t.Helper()
	v6 := vip.Is6()
	icmp := []byte{3, 4, 0, 0, 0, 0, 0x05, 0x00}
	router := gw4
	if v6 {
		icmp[0], icmp[1] = 2, 0
		router = gw6
	}
	icmp = append(icmp, quoted[:min(len(quoted), 200)]...)
	var sum uint32
	proto := layers.IPProtocolICMPv4
	if v6 {
		sum = packet.PseudoHeaderSum(router, vip, packet.ProtoICMPv6, len(icmp))
		proto = layers.IPProtocolICMPv6
	}
	binary.BigEndian.PutUint16(icmp[2:], wire.Checksum(icmp, sum))
	eth := &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}
	var nl gopacket.SerializableLayer = &layers.IPv4{Version: 4, TTL: 60, Protocol: proto, SrcIP: router.AsSlice(), DstIP: vip.AsSlice()}
	if v6 {
		eth.EthernetType = layers.EthernetTypeIPv6
		nl = &layers.IPv6{Version: 6, HopLimit: 60, NextHeader: proto, SrcIP: router.AsSlice(), DstIP: vip.AsSlice()}
	}
	return serialize(t, eth, nl, gopacket.Payload(icmp))
}

func tsOpt(val, ecr uint32) layers.TCPOption {
	d := make([]byte, 8)
	binary.BigEndian.PutUint32(d, val)
	binary.BigEndian.PutUint32(d[4:], ecr)
	return layers.TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: d}
}

var nop = layers.TCPOption{OptionType: layers.TCPOptionKindNop}

// seg is a TCP segment the LD sent, parsed and checked.
type seg struct {
	p        packet.Packet
	seq, ack uint32
	flags    uint8
	win      uint16
	o        synproxy.Options
	payload  []byte
}

// parseSeg parses an IP packet at off in b (a frame when off is 14), checking its
// checksums.
func parseSeg(t *testing.T, b []byte, off int) seg {
	t.Helper()
	var s seg
	if err := packet.ParseIP(b, off, &s.p); err != nil {
		t.Fatalf("parsing the LD's segment: %v", err)
	}
	if s.p.Proto != packet.ProtoTCP || !packet.VerifyL4Checksum(b, &s.p) {
		t.Fatalf("not a TCP segment with a correct checksum: %x", b[off:])
	}
	tc := b[s.p.L4:s.p.End]
	s.seq, s.ack, s.flags, s.win = binary.BigEndian.Uint32(tc[4:]), binary.BigEndian.Uint32(tc[8:]), tc[13], binary.BigEndian.Uint16(tc[14:])
	if err := synproxy.ParseOptions(tc, &s.o); err != nil {
		t.Fatal(err)
	}
	s.payload = tc[int(tc[12]>>4)*4:]
	return s
}

// innerOf returns the inner IP packet of a frame the LD tunnelled (GRE over IPv4).
func innerOf(t *testing.T, f []byte) []byte {
	t.Helper()
	var p packet.Packet
	if err := packet.Parse(f, &p); err != nil || p.Proto != packet.ProtoGRE {
		t.Fatalf("not a GRE frame: %v", err)
	}
	return f[p.L4+4 : p.End]
}

func pxConfig(mode string) Config {
	cfg := tunnelConfig(false, "gre")
	for i := range cfg.Rules {
		cfg.Rules[i].SynProxy = mode
	}
	return cfg
}

// TestSynProxyHandshake runs a connection through the proxy, for both families:
// the LD answers the SYN itself, opens the member's connection on the cookie's ACK
// and translates sequence numbers, timestamps and windows from then on.
func TestSynProxyHandshake(t *testing.T) {
	r := startRig(t, pxConfig("on"), Options{})
	r.resolveNeighbours()
	for i, c := range []struct{ client, vip netip.Addr }{{client, vip}, {client6, vip6}} {
		const isn, cTS = 0xfffffff0, 1000
		sport := uint16(41000 + i)
		synOpts := []layers.TCPOption{
			{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}},
			{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2}, tsOpt(cTS, 0), nop,
			{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}}
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn, 0, packet.TCPSyn, 64240, synOpts, nil))
		sa := parseSeg(t, waitSent(t, r.ext, 1)[0], 14)
		if sa.flags != packet.TCPSyn|packet.TCPAck || sa.ack != isn+1 || sa.p.Src != c.vip || sa.p.Dst != c.client {
			t.Fatalf("answer %+v", sa)
		}
		if !sa.o.HasTS() || sa.o.TSecr != cTS || !sa.o.SACKPerm || sa.o.WScale != 7 || !sa.o.HasMSS || sa.o.MSS > 1460-24 {
			t.Fatalf("SYN-ACK options %+v", sa.o)
		}
		if n := len(r.int.Drain()); n != 0 {
			t.Fatalf("the SYN reached a member (%d frames)", n)
		}
		if st := r.d.Status(); st.Conns != int64(i) {
			t.Fatalf("%d connections after the cookie, want %d: the SYN made an entry", st.Conns, i)
		}
		cookie, ldTS := sa.seq, sa.o.TSval

		// A wrong cookie is dropped.
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn+1, cookie+1+1<<20, packet.TCPAck, 502, []layers.TCPOption{nop, nop, tsOpt(cTS+1, ldTS)}, nil))
		r.waitCount(dirIn, resSynProxyBadCookie, uint64(i+1))

		// The cookie's ACK opens the member's connection with the client's options.
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn+1, cookie+1, packet.TCPAck, 502, []layers.TCPOption{nop, nop, tsOpt(cTS+1, ldTS)}, nil))
		out := waitSent(t, r.int, 1)[0]
		tu := decodeTunnelled(t, out)
		syn := parseSeg(t, innerOf(t, out), 0)
		if syn.flags != packet.TCPSyn || syn.seq != isn || syn.p.Src != c.client || syn.p.Dst != c.vip || len(syn.payload) != 0 {
			t.Fatalf("SYN to the member %+v", syn)
		}
		if !syn.o.HasTS() || syn.o.TSval != cTS+1 || !syn.o.SACKPerm || !syn.o.HasWScale || syn.o.WScale != 7 || syn.o.MSS < 1300 || syn.o.MSS > 1460-24 {
			t.Fatalf("SYN options %+v", syn.o)
		}
		member := tu.outerDst

		// The client's first data, before the member answered, is held; a second
		// packet is dropped.
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn+1, cookie+1, packet.TCPAck|packet.TCPPsh, 502, []layers.TCPOption{nop, nop, tsOpt(cTS+2, ldTS)}, []byte("hello")))
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn+6, cookie+1, packet.TCPAck|packet.TCPPsh, 502, []layers.TCPOption{nop, nop, tsOpt(cTS+2, ldTS)}, []byte("again")))
		r.waitCount(dirIn, resSynProxyWait, uint64(i+1))
		// The client sends its first segment again, the member still silent: the
		// SYN goes to the member again.
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn+1, cookie+1, packet.TCPAck|packet.TCPPsh, 502, []layers.TCPOption{nop, nop, tsOpt(cTS+3, ldTS)}, []byte("hello")))
		resyn := parseSeg(t, innerOf(t, waitSent(t, r.int, 1)[0]), 0)
		if resyn.flags != packet.TCPSyn || resyn.seq != isn || resyn.o.TSval != cTS+3 || resyn.o.WScale != 7 || len(resyn.payload) != 0 {
			t.Fatalf("SYN sent again %+v", resyn)
		}

		// The member's SYN-ACK (window scale 9) is answered with the ACK that
		// completes its handshake, and goes no further; the held data follows.
		const mISN, mTS = 0x7000_0000, 50_000
		msa := pxSeg(t, c.vip, c.client, 443, sport, mISN, isn+1, packet.TCPSyn|packet.TCPAck, 65160, []layers.TCPOption{
			{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0x8c}},
			{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2}, tsOpt(mTS, cTS+1), nop,
			{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{9}}}, nil)
		r.int.Inject(grePx(t, member, msa[14:]))
		sent := waitSent(t, r.int, 2)
		held := parseSeg(t, innerOf(t, sent[0]), 0)
		if held.seq != isn+1 || held.ack != mISN+1 || held.o.TSval != cTS+2 || held.o.TSecr != mTS || string(held.payload) != "hello" {
			t.Fatalf("held data for the member %+v", held)
		}
		ack := parseSeg(t, innerOf(t, sent[1]), 0)
		if ack.flags != packet.TCPAck || ack.seq != isn+1 || ack.ack != mISN+1 || ack.p.Src != c.client || ack.win != 502 ||
			!ack.o.HasTS() || ack.o.TSecr != mTS || ack.o.TSval != cTS+1 {
			t.Fatalf("ACK to the member %+v", ack)
		}

		// The client's data reaches the member with its numbers translated.
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, isn+1, cookie+1, packet.TCPAck|packet.TCPPsh, 502,
			[]layers.TCPOption{nop, nop, tsOpt(cTS+3, ldTS+5)}, []byte("hello")))
		d := parseSeg(t, innerOf(t, waitSent(t, r.int, 1)[0]), 0)
		if d.seq != isn+1 || d.ack != mISN+1 || d.o.TSval != cTS+3 || d.o.TSecr != mTS+5 || string(d.payload) != "hello" {
			t.Fatalf("client data for the member %+v", d)
		}
		// The member's data reaches the client with its numbers translated, and
		// its window scaled from 9 to the LD's 7.
		md := pxSeg(t, c.vip, c.client, 443, sport, mISN+1, isn+6, packet.TCPAck|packet.TCPPsh, 100,
			[]layers.TCPOption{nop, nop, tsOpt(mTS+10, cTS+3)}, []byte("world!"))
		r.int.Inject(grePx(t, member, md[14:]))
		back := waitSent(t, r.ext, 1)[0]
		cd := parseSeg(t, back, 14)
		if cd.seq != cookie+1 || cd.ack != isn+6 || cd.o.TSval != ldTS+10 || cd.o.TSecr != cTS+3 || cd.win != 400 || string(cd.payload) != "world!" {
			t.Fatalf("member data for the client %+v", cd)
		}
		if n := len(r.ext.Drain()); n != 0 {
			t.Fatalf("%d more frames to the client (the member's SYN-ACK?)", n)
		}
		// A router on the client's path finds the member's segment too big: its
		// error reaches the member quoting the member's own sequence number.
		r.ext.Inject(pxTooBig(t, c.vip, back[14:]))
		ic := innerOf(t, waitSent(t, r.int, 1)[0])
		var ip packet.Packet
		if err := packet.ParseIP(ic, 0, &ip); err != nil || !packet.VerifyL4Checksum(ic, &ip) {
			t.Fatalf("ICMP error to the member does not parse or verify: %v", err)
		}
		var quoted packet.Packet
		if err := packet.ICMPEmbedded(ic, &ip, &quoted); err != nil {
			t.Fatal(err)
		}
		if q := binary.BigEndian.Uint32(ic[quoted.L4+4:]); q != mISN+1 {
			t.Fatalf("the ICMP error quotes sequence number %d, want the member's %d", q, mISN+1)
		}
		// A new SYN from the same port (the connection over, the port reused) is
		// answered with a new cookie, not translated to the member.
		r.ext.Inject(pxSeg(t, c.client, c.vip, sport, 443, 12345, 0, packet.TCPSyn, 64240, synOpts, nil))
		if sa2 := parseSeg(t, waitSent(t, r.ext, 1)[0], 14); sa2.flags != packet.TCPSyn|packet.TCPAck || sa2.ack != 12346 {
			t.Fatalf("answer to the port's new SYN %+v", sa2)
		}
		if n := len(r.int.Drain()); n != 0 {
			t.Fatalf("the port's new SYN reached the member (%d frames)", n)
		}

	}
	deadline := time.Now().Add(3 * time.Second)
	for (r.d.SynProxyStats().Connections < 2 || r.d.SynProxyStats().CookiesSent < 4) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := r.d.SynProxyStats(); st.CookiesSent != 4 || st.CookiesOK != 2 || st.CookiesBad != 2 || st.Connections != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSynProxyAuto: with synproxy auto, SYNs go to the members until the worker's
// table is auto_on half-open; then the LD answers them itself.
func TestSynProxyAuto(t *testing.T) {
	cfg := pxConfig("auto")
	cfg.Conntrack.Capacity = 100
	cfg.Conntrack.Timeouts.SynRecv = config.Duration(time.Second)
	cfg.SynProxy.AutoOn = 0.2
	cfg.SynProxy.AutoHold = config.Duration(10 * time.Millisecond)
	r := startRig(t, cfg, Options{})
	r.resolveNeighbours()
	for i := range 20 {
		r.ext.Inject(pxSeg(t, client, vip, uint16(20000+i), 443, 1, 0, packet.TCPSyn, 1000, nil, nil))
	}
	waitSent(t, r.int, 20)
	if n := len(r.ext.Drain()); n != 0 {
		t.Fatalf("%d answers below the threshold", n)
	}
	// The table is 20% half-open: the next SYN is answered by the LD.
	deadline := time.Now().Add(3 * time.Second)
	for {
		r.ext.Inject(pxSeg(t, client, vip, 30000, 443, 1, 0, packet.TCPSyn, 1000, nil, nil))
		time.Sleep(5 * time.Millisecond)
		if f := r.ext.Drain(); len(f) == 1 {
			sa := parseSeg(t, f[0], 14)
			if sa.flags != packet.TCPSyn|packet.TCPAck || sa.o.HasTS() {
				t.Fatalf("answer %+v", sa)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("auto never answered a SYN")
		}
		r.int.Drain()
	}
	waitFor(t, time.Second, func() bool { return r.d.SynProxyStats().AutoWorkers == 1 })
	// The half-open entries expire (syn_recv 1s): below auto_off, SYNs go to the
	// members again.
	r.int.Drain()
	deadline = time.Now().Add(5 * time.Second)
	for {
		r.ext.Inject(pxSeg(t, client, vip, 30001, 443, 1, 0, packet.TCPSyn, 1000, nil, nil))
		time.Sleep(20 * time.Millisecond)
		if len(r.int.Drain()) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("auto never turned off")
		}
		r.ext.Drain()
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
	}
}

func TestSynProxyValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(c *Config) { c.Rules[0].SynProxy = "AUTO" }, ""},
		{"mode", func(c *Config) { c.Rules[0].SynProxy = "yes" }, `rules[0].synproxy: "yes" is not on, off or auto`},
		{"udp", func(c *Config) { c.Rules[1].SynProxy = "on" }, "rules[1].synproxy: needs protocol tcp"},
		{"auto_off", func(c *Config) { c.SynProxy.AutoOn, c.SynProxy.AutoOff = 0.2, 0.3 }, "synproxy.auto_off"},
		{"wscale", func(c *Config) { c.SynProxy.WScale = 15 }, "synproxy.wscale"},
		{"rotate", func(c *Config) { c.SynProxy.Rotate = 1 }, "synproxy.rotate"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkValidate(t, tc.edit, tc.want) })
	}
}

// startSyncRig is startRig with session sync on.
func startSyncRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	ext := port.NewMem("ext", extMAC, 2, 1024, 2048)
	in := port.NewMem("int", intMAC, 2, 1024, 2048)
	d, err := NewDistributor(cfg, Options{External: ext, Internal: in, IdleSleep: 20 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.EnableSync(SyncOptions{After: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &rig{t: t, d: d, ext: ext, int: in}
}

// TestSynProxySync: a proxied connection's translation travels with its entry, so
// the LD that receives it translates the connection's packets as the first did.
func TestSynProxySync(t *testing.T) {
	a := startSyncRig(t, pxConfig("on"))
	a.resolveNeighbours()
	const isn, cTS, mISN, mTS = 5000, 77, 900_000, 123_456
	a.ext.Inject(pxSeg(t, client, vip, 42000, 443, isn, 0, packet.TCPSyn, 64240, []layers.TCPOption{
		{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}, tsOpt(cTS, 0), nop,
		{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{2}}}, nil))
	sa := parseSeg(t, waitSent(t, a.ext, 1)[0], 14)
	a.ext.Inject(pxSeg(t, client, vip, 42000, 443, isn+1, sa.seq+1, packet.TCPAck, 502, []layers.TCPOption{nop, nop, tsOpt(cTS, sa.o.TSval)}, nil))
	member := decodeTunnelled(t, waitSent(t, a.int, 1)[0]).outerDst
	a.int.Inject(grePx(t, member, pxSeg(t, vip, client, 443, 42000, mISN, isn+1, packet.TCPSyn|packet.TCPAck, 65160, []layers.TCPOption{
		tsOpt(mTS, cTS), nop, {OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}}, nil)[14:]))
	waitSent(t, a.int, 1)

	var es []sessionsync.Entry
	deadline := time.Now().Add(3 * time.Second)
	for len(es) == 0 && time.Now().Before(deadline) {
		es = a.d.SyncDrain(es, false, 16)
		time.Sleep(5 * time.Millisecond)
	}
	if len(es) != 1 || !es[0].Proxied || es[0].Proxy.SeqDelta != mISN-sa.seq || es[0].Proxy.TSDelta != sa.o.TSval-mTS || es[0].Proxy.WShift != 0 {
		t.Fatalf("sent %+v; want the proxied connection with its deltas", es)
	}

	// Another LD, whose configuration does not proxy the rule, takes the connection.
	b := startSyncRig(t, pxConfig(""))
	b.resolveNeighbours()
	b.d.SyncInstall(es)
	deadline = time.Now().Add(3 * time.Second)
	for b.d.SyncStats().Installed == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	b.int.Inject(grePx(t, member, pxSeg(t, vip, client, 443, 42000, mISN+1, isn+1, packet.TCPAck, 1000,
		[]layers.TCPOption{nop, nop, tsOpt(mTS+1, cTS)}, []byte("x"))[14:]))
	cd := parseSeg(t, waitSent(t, b.ext, 1)[0], 14)
	if cd.seq != sa.seq+1 || cd.o.TSval != sa.o.TSval+1 || cd.win != 1000 {
		t.Fatalf("after the move, the member's data reaches the client as %+v", cd)
	}
	b.ext.Inject(pxSeg(t, client, vip, 42000, 443, isn+1, sa.seq+2, packet.TCPAck, 502, []layers.TCPOption{nop, nop, tsOpt(cTS+1, sa.o.TSval+1)}, nil))
	d := parseSeg(t, innerOf(t, waitSent(t, b.int, 1)[0]), 0)
	if d.ack != mISN+2 || d.o.TSecr != mTS+1 {
		t.Fatalf("after the move, the client's ACK reaches the member as %+v", d)
	}
}

// TestSynProxyRuleLimit: a proxied rule's connection limit counts the connections
// whose cookie checked; the cookie answers cost nothing of it.
func TestSynProxyRuleLimit(t *testing.T) {
	cfg := pxConfig("on")
	cfg.Rules[0].Limits.MaxConns = 1
	r := startRig(t, cfg, Options{})
	r.resolveNeighbours()
	for i := range 2 {
		sport := uint16(43000 + i)
		r.ext.Inject(pxSeg(t, client, vip, sport, 443, 100, 0, packet.TCPSyn, 64240, nil, nil))
		sa := parseSeg(t, waitSent(t, r.ext, 1)[0], 14)
		r.ext.Inject(pxSeg(t, client, vip, sport, 443, 101, sa.seq+1, packet.TCPAck, 502, nil, nil))
	}
	waitSent(t, r.int, 1)
	r.waitCount(dirIn, resRuleLimit, 1)
	if n := len(r.int.Drain()); n != 0 {
		t.Fatalf("%d more SYNs to members past the limit", n)
	}
}

// FuzzSynProxyHandle feeds arbitrary frames to a worker whose rule is proxied, from a
// seed corpus that walks a proxied connection (SYN, cookie ACK, the member's SYN-ACK,
// data both ways, an ICMP error): it must never panic, and every frame it sends must
// parse.
func FuzzSynProxyHandle(f *testing.F) {
	cfg := testConfig()
	cfg.Rules[0].SynProxy = SynProxyOn
	cfg.External.GatewayMAC = packet.MAC(gwMAC)
	p := cfg.Pools["l7"]
	for i := range p.Members {
		p.Members[i].MAC = packet.MAC(memberMAC[p.Members[i].Address.String()])
	}
	cfg.Pools["l7"] = p
	cfg.Conntrack.Capacity = 1024
	d, err := NewDistributor(cfg, Options{External: port.NewMem("ext", extMAC, 2, 64, 2048), Internal: port.NewMem("int", intMAC, 2, 64, 2048)})
	if err != nil {
		f.Fatal(err)
	}
	w, s := d.workers[0], d.snap.Load()
	w.resync(s)
	t := &testing.T{}
	const isn = 1000
	opts := []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}},
		{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2}, tsOpt(5, 0), nop,
		{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}}
	tu := synproxy.Tuple{Src: client.As16(), Dst: vip.As16(), SrcPort: 40000, DstPort: 443}
	cookie := w.px.keys.Cookie(&tu, isn, w.px.minute, 3)
	ts := synproxy.CookieTSval(w.px.tsNow, synproxy.Negotiated{WScale: 7, HasWScale: true, SACK: true})
	member := netip.MustParseAddr("198.18.1.11")
	back := pxSeg(t, vip, client, 443, 40000, 7001, isn+1, packet.TCPAck, 100, []layers.TCPOption{nop, nop, tsOpt(90, 6)}, []byte("data"))
	for _, fr := range [][]byte{
		pxSeg(t, client, vip, 40000, 443, isn, 0, packet.TCPSyn, 64240, opts, nil),
		pxSeg(t, client6, vip6, 40000, 443, isn, 0, packet.TCPSyn, 64240, opts, nil),
		pxSeg(t, client, vip, 40000, 443, isn+1, cookie+1, packet.TCPAck, 502, []layers.TCPOption{nop, nop, tsOpt(6, ts)}, nil),
		pxSeg(t, client, vip, 40000, 443, isn+1, cookie+1, packet.TCPAck|packet.TCPPsh, 502, []layers.TCPOption{nop, nop, tsOpt(6, ts)}, []byte("hi")),
		grePx(t, member, pxSeg(t, vip, client, 443, 40000, 7000, isn+1, packet.TCPSyn|packet.TCPAck, 65160, opts, nil)[14:]),
		grePx(t, member, back[14:]),
		pxSeg(t, client, vip, 40000, 443, isn+3, cookie+1, packet.TCPAck, 502, []layers.TCPOption{nop, nop, tsOpt(7, ts),
			{OptionType: layers.TCPOptionKindSACK, OptionLength: 10, OptionData: []byte{0, 0, 0, 1, 0, 0, 0, 2}}}, nil),
		pxTooBig(t, vip, back[14:]),
	} {
		f.Add(fr, fr[12] != 0x08 || fr[23] != 47)
	}
	buf := port.Buf{Data: make([]byte, 4096)}
	f.Fuzz(func(t *testing.T, frame []byte, fromExt bool) {
		if len(frame) > 4096-256 {
			return
		}
		buf.Off, buf.Len = 256, copy(buf.Data[256:], frame)
		w.txInt = w.txInt[:0]
		w.txIntMeta = w.txIntMeta[:0]
		switch v := w.handleFrame(s, &buf, fromExt); v {
		case vExt, vInt, vBack:
			if buf.Off < 0 || buf.Off+buf.Len > len(buf.Data) {
				t.Fatalf("verdict %d with frame [%d:%d] outside the buffer", v, buf.Off, buf.Off+buf.Len)
			}
			var p packet.Packet
			if err := packet.Parse(buf.Data[buf.Off:buf.Off+buf.Len], &p); err != nil {
				t.Fatalf("verdict %d: the frame sent does not parse: %v", v, err)
			}
		}
		for _, b := range w.txInt {
			var p packet.Packet
			if err := packet.Parse(b.Data[b.Off:b.Off+b.Len], &p); err != nil {
				t.Fatalf("a held packet sent does not parse: %v", err)
			}
			w.int.Free([]port.Buf{b})
		}
	})
}
