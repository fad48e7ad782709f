package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/wire"
)

// The established rows of the SYN proxy: two distributors, one whose rule has the SYN
// proxy on and one without it (today's LD), each holding the same clients' flows
// established, fed in turn. The proxied flows are made as a client and a member make
// them: every client's SYN is answered by the LD's cookie SYN-ACK, the client's ACK
// echoes the cookie, the LD's SYN to the member is answered by the member's SYN-ACK
// (tunnelled back on the internal port, as l7d sends it), and the LD completes the
// member's handshake; from then on each client packet is translated (acknowledgment
// and timestamp echo) on its way to the member.

// pxIdleSleep is the idle sleep of the two distributors: the one not fed sleeps,
// leaving the cores to the other (a worker that finds packets never sleeps).
const pxIdleSleep = time.Millisecond

// pxCaptureStride is the slot of a captured frame.
const pxCaptureStride = 128

// memberSynAckLen is the member's SYN-ACK as it reaches the LD: Ethernet, outer IPv4,
// GRE, inner IPv4 and TCP with 20 bytes of options.
const memberSynAckLen = packet.EthernetLen + packet.IPv4Len + 4 + packet.IPv4Len + 40

// srvISN and srvTS are the member's initial sequence number and TSval for a client.
func srvISN(c netip.Addr, port uint16) uint32 {
	return mix32(binary.BigEndian.Uint32(c.AsSlice()) ^ uint32(port)<<7)
}

func srvTS(c netip.Addr, port uint16) uint32 { return srvISN(c, port)*3 + 12345 }

// flowKey is a client's address and port.
func flowKey(c netip.Addr, port uint16) uint64 {
	return uint64(binary.BigEndian.Uint32(c.AsSlice()))<<16 | uint64(port)
}

// tcpSeg are the fields of a TCP segment the handshakes need.
type tcpSeg struct {
	p            packet.Packet
	seq, ack     uint32
	tsval, tsecr uint32
	ts           bool
}

// parseSeg parses frame (an Ethernet frame, or from off an IP packet when off > 0).
func parseSeg(frame []byte, off int) (tcpSeg, error) {
	var s tcpSeg
	var err error
	if off > 0 {
		err = packet.ParseIP(frame, off, &s.p)
	} else {
		err = packet.Parse(frame, &s.p)
	}
	if err != nil {
		return s, err
	}
	if s.p.Proto != packet.ProtoTCP || s.p.L4 < 0 || s.p.End-s.p.L4 < 20 {
		return s, fmt.Errorf("not a TCP segment: protocol %d", s.p.Proto)
	}
	tcp := frame[s.p.L4:s.p.End]
	s.seq, s.ack = binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:])
	if ts, ok := tcpOptions(tcp)[8]; ok && len(ts) == 8 {
		s.ts, s.tsval, s.tsecr = true, binary.BigEndian.Uint32(ts), binary.BigEndian.Uint32(ts[4:])
	}
	return s, nil
}

// newCapture is a frame set to capture up to n frames into.
func newCapture(kind string, n int) *frameSet {
	return &frameSet{kind: kind, data: make([]byte, n*pxCaptureStride), length: pxCaptureStride, stride: pxCaptureStride}
}

// exchange feeds count frames of set from src and waits until out has transmitted
// want more frames, which it captures.
func (r *rig) exchange(ctx context.Context, src source, set *frameSet, count int, out *meter, want int, kind string) (*frameSet, error) {
	c := newCapture(kind, want)
	tx0 := out.tx.Load()
	out.capture.Store(c)
	defer out.capture.Store(nil)
	f := src.feed(set, int64(count))
	deadline := time.Now().Add(10*time.Second + time.Duration(count)*5*time.Microsecond)
	var err error
	for out.tx.Load()-tx0 < uint64(want) {
		if err = r.wait(ctx, deadline); err != nil {
			break
		}
	}
	st := f.stop()
	if err == nil {
		err = st.err
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %d %s sent, %d of %d %s seen: %w (datapath counts: %s)", r.name, st.sent, set.kind,
			out.tx.Load()-tx0, want, kind, err, formatCounts(r.d.Status().Packets))
	}
	if c.n != want {
		return nil, fmt.Errorf("%s: %d %s captured, want %d", r.name, c.n, kind, want)
	}
	return c, nil
}

// writeClientACK writes a client's 66-byte ACK (timestamps, NOP NOP TS) to the VIP.
func writeClientACK(b []byte, client netip.Addr, cport uint16, seq, ack, tsval, tsecr uint32) {
	copy(b[0:6], extMAC[:])
	copy(b[6:12], gwMAC[:])
	binary.BigEndian.PutUint16(b[12:], packet.EtherTypeIPv4)
	ip := b[packet.EthernetLen : packet.EthernetLen+packet.IPv4Len]
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], packet.IPv4Len+ackTCPLen)
	binary.BigEndian.PutUint16(ip[4:], uint16(seq))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9], ip[10], ip[11] = 64, packet.ProtoTCP, 0, 0
	src, dst := client.As4(), vip.As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], wire.Checksum(ip, 0))
	tcp := b[packet.EthernetLen+packet.IPv4Len : packet.EthernetLen+packet.IPv4Len+ackTCPLen]
	clear(tcp)
	binary.BigEndian.PutUint16(tcp[0:], cport)
	binary.BigEndian.PutUint16(tcp[2:], vipPort)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12], tcp[13] = byte(ackTCPLen/4)<<4, packet.TCPAck
	binary.BigEndian.PutUint16(tcp[14:], 502)
	o := tcp[20:]
	o[0], o[1], o[2], o[3] = 1, 1, 8, 10
	binary.BigEndian.PutUint32(o[4:], tsval)
	binary.BigEndian.PutUint32(o[8:], tsecr)
	binary.BigEndian.PutUint16(tcp[16:], wire.Checksum(tcp, packet.PseudoHeaderSum(client, vip, packet.ProtoTCP, ackTCPLen)))
}

// writeMemberSynAck writes, into a slot of memberSynAckLen bytes or more, the
// member's SYN-ACK to the LD's SYN syn (its inner segment), tunnelled by e.
func writeMemberSynAck(slot []byte, e *packet.Encap, syn *tcpSeg) error {
	client, cport := syn.p.Src, syn.p.SrcPort
	inner := make([]byte, packet.IPv4Len+40)
	ip := inner[:packet.IPv4Len]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(inner)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, packet.ProtoTCP
	src, dst := vip.As4(), client.As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], wire.Checksum(ip, 0))
	tcp := inner[packet.IPv4Len:]
	binary.BigEndian.PutUint16(tcp[0:], vipPort)
	binary.BigEndian.PutUint16(tcp[2:], cport)
	binary.BigEndian.PutUint32(tcp[4:], srvISN(client, cport))
	binary.BigEndian.PutUint32(tcp[8:], syn.seq+1)
	tcp[12], tcp[13] = 10<<4, packet.TCPSyn|packet.TCPAck
	binary.BigEndian.PutUint16(tcp[14:], 65160)
	o := tcp[20:]
	o[0], o[1] = 2, 4
	binary.BigEndian.PutUint16(o[2:], 1460)
	o[4], o[5], o[6], o[7] = 4, 2, 8, 10
	binary.BigEndian.PutUint32(o[8:], srvTS(client, cport))
	binary.BigEndian.PutUint32(o[12:], syn.tsval)
	o[16], o[17], o[18], o[19] = 1, 3, 3, 7
	binary.BigEndian.PutUint16(tcp[16:], wire.Checksum(tcp, packet.PseudoHeaderSum(vip, client, packet.ProtoTCP, len(tcp))))
	buf := make([]byte, 64+len(inner))
	copy(buf[64:], inner)
	start, err := e.Write(buf, 64, len(inner), uint16(cport))
	if err != nil {
		return err
	}
	if n := copy(slot, buf[start:]); n != memberSynAckLen {
		return fmt.Errorf("the member's SYN-ACK is %d bytes, want %d", n, memberSynAckLen)
	}
	return nil
}

// establishProxied makes the proxied flows of syn's clients on r (whose rule has the
// SYN proxy on) and returns their clients' established ACKs, stored in the order of
// order (a frame set of the same clients). The table's entries are made in syn's
// order, as the unproxied distributor's are, and its rows visit them in order's, as
// the unproxied one's do: entries lie in memory in the order they were made, and
// visiting them in that order would be faster than in any other.
func establishProxied(ctx context.Context, r *rig, sink *sinkPort, syn, order *frameSet) (*frameSet, error) {
	n := syn.n
	// The clients' SYNs, each answered with a cookie SYN-ACK on the external port.
	synacks, err := r.exchange(ctx, r.src, syn, n, r.ext, n, "SYN-ACKs from the LD")
	if err != nil {
		return nil, err
	}
	index := make(map[uint64]int32, n)
	syns := make([]tcpSeg, n)
	for j := range n {
		s, err := parseSeg(syn.frame(j), 0)
		if err != nil {
			return nil, fmt.Errorf("SYN %d: %w", j, err)
		}
		syns[j] = s
		index[flowKey(s.p.Src, s.p.SrcPort)] = int32(j)
	}
	// Each client acknowledges its cookie.
	ack := &frameSet{kind: "proxied ACK", data: make([]byte, n*frameStride), n: n, length: ackFrameLen, stride: frameStride}
	done := make([]bool, n)
	for i := range synacks.n {
		sa, err := parseSeg(synacks.frame(i), 0)
		if err != nil {
			return nil, fmt.Errorf("the LD's SYN-ACK %d: %w", i, err)
		}
		j, ok := index[flowKey(sa.p.Dst, sa.p.DstPort)]
		if !ok || done[j] || sa.p.TCPFlags != packet.TCPSyn|packet.TCPAck || sa.ack != syns[j].seq+1 || !sa.ts {
			return nil, fmt.Errorf("the LD's SYN-ACK %d (to %v:%d, flags %#x, ack %d) answers no SYN of the flood",
				i, sa.p.Dst, sa.p.DstPort, sa.p.TCPFlags, sa.ack)
		}
		done[j] = true
		s := &syns[j]
		writeClientACK(ack.frame(int(j)), s.p.Src, s.p.SrcPort, s.seq+1, sa.seq+1, s.tsval+100, sa.tsval)
	}
	// Each cookie checks: the LD opens the connection to a member with a SYN.
	memberSyns, err := r.exchange(ctx, r.src, ack, n, r.int, n, "SYNs to the members")
	if err != nil {
		return nil, err
	}
	// The members answer through the tunnel.
	encaps := map[netip.Addr]*packet.Encap{}
	for i, a := range memberAddr {
		e := &packet.Encap{Src: a, Dst: ldInt.Addr(), SrcMAC: memberMACs()[i], DstMAC: packet.MAC(intMAC)}
		if err := e.Prepare(); err != nil {
			return nil, err
		}
		encaps[a] = e
	}
	replies := &frameSet{kind: "member SYN-ACK", data: make([]byte, n*pxCaptureStride), n: n, length: memberSynAckLen, stride: pxCaptureStride}
	for i := range memberSyns.n {
		f := memberSyns.frame(i)
		var outer packet.Packet
		if err := packet.Parse(f, &outer); err != nil {
			return nil, fmt.Errorf("the LD's SYN to a member %d: %w", i, err)
		}
		in, _, err := packet.Decap(f, &outer)
		if err != nil {
			return nil, fmt.Errorf("the LD's SYN to a member %d: %w", i, err)
		}
		s, err := parseSeg(f, in)
		if err != nil || s.p.TCPFlags != packet.TCPSyn || s.p.Dst != vip {
			return nil, fmt.Errorf("the LD's SYN to a member %d: flags %#x to %v: %v", i, s.p.TCPFlags, s.p.Dst, err)
		}
		e, ok := encaps[outer.Dst]
		if !ok {
			return nil, fmt.Errorf("the LD's SYN %d went to %v, not a member", i, outer.Dst)
		}
		if err := writeMemberSynAck(replies.frame(i), e, &s); err != nil {
			return nil, err
		}
	}
	// The LD completes each member's handshake with an ACK.
	if _, err := r.exchange(ctx, memSource{sink}, replies, n, r.int, n, "ACKs to the members"); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Second)
	for r.d.Status().Conns != int64(n) {
		if err := r.wait(ctx, deadline); err != nil {
			return nil, fmt.Errorf("%s: the table holds %d connections, want %d: %w", r.name, r.d.Status().Conns, n, err)
		}
	}
	if order.n != n {
		return nil, fmt.Errorf("%d frames to order %d ACKs by", order.n, n)
	}
	out := &frameSet{kind: ack.kind, data: make([]byte, n*frameStride), n: n, length: ackFrameLen, stride: frameStride}
	for j := range n {
		var p packet.Packet
		if err := packet.Parse(order.frame(j), &p); err != nil {
			return nil, fmt.Errorf("ordering frame %d: %w", j, err)
		}
		i, ok := index[flowKey(p.Src, p.SrcPort)]
		if !ok {
			return nil, fmt.Errorf("ordering frame %d: client %v:%d sent no SYN", j, p.Src, p.SrcPort)
		}
		copy(out.frame(j), ack.frame(int(i)))
	}
	return out, nil
}

// checkProxiedSample checks the frame r's internal port sampled: a client's ACK
// tunnelled to a member, its acknowledgment and timestamp echo translated to the
// member's sequence space and clock.
func checkProxiedSample(r *rig) error {
	sp := r.int.sample.Load()
	if sp == nil {
		return errors.New("no frame was sampled")
	}
	f := *sp
	if err := checkTunnelled(f, false); err != nil {
		return err
	}
	var outer packet.Packet
	if err := packet.Parse(f, &outer); err != nil {
		return err
	}
	in, _, err := packet.Decap(f, &outer)
	if err != nil {
		return err
	}
	s, err := parseSeg(f, in)
	if err != nil {
		return err
	}
	if want := srvISN(s.p.Src, s.p.SrcPort) + 1; s.ack != want {
		return fmt.Errorf("the ACK of %v:%d reached its member acknowledging %d, want %d (the member's ISN + 1)", s.p.Src, s.p.SrcPort, s.ack, want)
	}
	if want := srvTS(s.p.Src, s.p.SrcPort); !s.ts || s.tsecr != want {
		return fmt.Errorf("the ACK of %v:%d reached its member echoing timestamp %d, want %d (the member's)", s.p.Src, s.p.SrcPort, s.tsecr, want)
	}
	return nil
}

// runSynproxyEstablished measures established flows with the SYN proxy on ÷ off: two
// distributors, each with the flows of syn's clients established (proxied on one),
// fed their clients' ACKs in turn, in rounds whose order alternates.
func runSynproxyEstablished(ctx context.Context, o *options, syn, ack *frameSet, log *slog.Logger) (res *featureResults, err error) {
	n := syn.n
	off := ldConfig(ldSetup{ext: ldExt, gw: ldExtGW, gwMAC: gwMAC, memberMACs: memberMACs(), capacity: tableCapacity(n)})
	on := off
	if err := setRules(&on, "synproxy", `"on"`); err != nil {
		return nil, err
	}
	start := func(name string, cfg datapath.Config) (*rig, *sinkPort, error) {
		pool := newGenPool(genPoolSize)
		g := &genPort{name: "gen", mac: extMAC, pool: pool}
		sink := &sinkPort{name: "sink", mac: intMAC, pool: pool}
		r, err := startRigIdle(name, cfg, g, sink, memSource{g}, n, nil, pxIdleSleep, log)
		return r, sink, err
	}
	rOff, _, err := start("in-memory, SYN proxy off", off)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rOff.stop()) }()
	if _, err := rOff.counted(ctx, syn, n); err != nil {
		return nil, err
	}
	if _, err := rOff.counted(ctx, ack, n); err != nil {
		return nil, err
	}
	if err := rOff.checkStatus(ctx, rOff.int.tx.Load(), int64(n)); err != nil {
		return nil, err
	}
	rOn, sink, err := start("in-memory, SYN proxy on", on)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rOn.stop()) }()
	pxAck, err := establishProxied(ctx, rOn, sink, syn, ack)
	if err != nil {
		return nil, err
	}

	res = &featureResults{What: "the rule's SYN proxy on, its flows made through it (cookie handshake with the client, " +
		"the LD's own with the member) and translated; off: today's LD, flows made directly"}
	measure := func(r *rig, set *frameSet, proxied bool) (*phaseResult, error) {
		p, err := r.timedCount(ctx, set, o.defDuration, &r.int.tx, r.int, true, nil)
		if err != nil {
			return nil, err
		}
		if proxied {
			err = checkProxiedSample(r)
		} else {
			err = r.checkSample(set.kind)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: the frame sent to a member: %w", r.name, err)
		}
		res.SourceBound = res.SourceBound || p.starved()
		return p, nil
	}
	for i := range o.defRounds {
		var rd featureRound
		if i%2 == 0 {
			if rd.Off, err = measure(rOff, ack, false); err == nil {
				rd.On, err = measure(rOn, pxAck, true)
			}
		} else {
			if rd.On, err = measure(rOn, pxAck, true); err == nil {
				rd.Off, err = measure(rOff, ack, false)
			}
		}
		if err != nil {
			return res, err
		}
		rd.Ratio = ratio(rd.On.MppsPerCPU, rd.Off.MppsPerCPU)
		rd.WallRatio = ratio(rd.On.Mpps, rd.Off.Mpps)
		rd.NsPerPacket = round(1e3/rd.On.MppsPerCPU-1e3/rd.Off.MppsPerCPU, 2)
		res.Rounds = append(res.Rounds, rd)
	}
	res.Ratio = medianOf(res.Rounds, func(r featureRound) float64 { return r.Ratio })
	res.WallRatio = medianOf(res.Rounds, func(r featureRound) float64 { return r.WallRatio })
	res.NsPerPacket = medianOf(res.Rounds, func(r featureRound) float64 { return r.NsPerPacket })
	if st := rOn.d.Status(); st.Conns != int64(n) {
		return res, fmt.Errorf("%s: %d connections after the rows, want %d", rOn.name, st.Conns, n)
	}
	return res, nil
}
