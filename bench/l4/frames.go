package main

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/wire"
)

// The rule every frame is addressed to, and where clients come from.
var (
	vip     = netip.MustParseAddr("203.0.113.10")
	vipPort = uint16(443)
	// clientBase is the first client address: flow i comes from clientBase + i mod
	// 65536 (198.19.0.0/16), port clientPortBase + i / 65536.
	clientBase     = netip.MustParseAddr("198.19.0.0")
	clientPortBase = uint16(1024)
)

// maxFlows bounds -flows: client ports must stay below 65536, and the frames of two
// kinds (frameStride bytes each) must fit this machine's memory with room to spare.
const maxFlows = 10_000_000

// Frame sizes. A SYN carries the options a Linux client sends (MSS, SACK permitted,
// timestamps, window scale); an ACK carries timestamps.
const (
	synTCPLen   = 40
	ackTCPLen   = 32
	synFrameLen = packet.EthernetLen + packet.IPv4Len + synTCPLen // 74
	ackFrameLen = packet.EthernetLen + packet.IPv4Len + ackTCPLen // 66
	frameStride = 80
)

// flowClient returns the client address and port of flow i.
func flowClient(i int) (netip.Addr, uint16) {
	b := clientBase.As4()
	v := binary.BigEndian.Uint32(b[:]) + uint32(i%65536)
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b), clientPortBase + uint16(i/65536)
}

// frameSet is one pre-built frame per flow, stored at a fixed stride in a shuffled
// order, so a port that hands them out in storage order visits every flow once per
// pass in an order unrelated to the flows' numbers (and to their hashes' buckets).
type frameSet struct {
	kind   string // "SYN" or "ACK"
	data   []byte
	n      int // frames
	length int // bytes per frame
	stride int // bytes from one frame to the next: frameStride, or more for longer frames
}

// frame returns frame j in storage order.
func (f *frameSet) frame(j int) []byte {
	off := j * f.stride
	return f.data[off : off+f.length : off+f.length]
}

// clientFunc gives the client address and port of flow i.
type clientFunc func(i int) (netip.Addr, uint16)

// buildFrames builds one client → VIP TCP frame per flow (a SYN when syn is set, else
// an ACK), to dstMAC from srcMAC, shuffled with seed, the clients from flowClient.
func buildFrames(flows int, syn bool, dstMAC, srcMAC [6]byte, seed uint64) *frameSet {
	return buildFramesOf(flows, syn, dstMAC, srcMAC, seed, flowClient)
}

// buildFramesOf is buildFrames with the clients from client.
func buildFramesOf(flows int, syn bool, dstMAC, srcMAC [6]byte, seed uint64, client clientFunc) *frameSet {
	f := &frameSet{kind: "ACK", data: make([]byte, flows*frameStride), n: flows, length: ackFrameLen, stride: frameStride}
	if syn {
		f.kind, f.length = "SYN", synFrameLen
	}
	order := make([]uint32, flows)
	for i := range order {
		order[i] = uint32(i)
	}
	rng := rand.New(rand.NewPCG(seed, 0x6c34))
	rng.Shuffle(flows, func(a, b int) { order[a], order[b] = order[b], order[a] })
	for j, i := range order {
		writeTCPFrame(f.frame(j), int(i), client, syn, dstMAC, srcMAC)
	}
	return f
}

// writeTCPFrame writes flow i's SYN or ACK into b (synFrameLen or ackFrameLen bytes),
// checksums included.
func writeTCPFrame(b []byte, i int, clientOf clientFunc, syn bool, dstMAC, srcMAC [6]byte) {
	client, cport := clientOf(i)
	copy(b[0:6], dstMAC[:])
	copy(b[6:12], srcMAC[:])
	binary.BigEndian.PutUint16(b[12:], packet.EtherTypeIPv4)

	tcpLen := ackTCPLen
	if syn {
		tcpLen = synTCPLen
	}
	ip := b[packet.EthernetLen : packet.EthernetLen+packet.IPv4Len]
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], uint16(packet.IPv4Len+tcpLen))
	binary.BigEndian.PutUint16(ip[4:], uint16(i))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8], ip[9] = 64, packet.ProtoTCP
	ip[10], ip[11] = 0, 0
	src, dst := client.As4(), vip.As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], wire.Checksum(ip, 0))

	tcp := b[packet.EthernetLen+packet.IPv4Len : packet.EthernetLen+packet.IPv4Len+tcpLen]
	clear(tcp)
	binary.BigEndian.PutUint16(tcp[0:], cport)
	binary.BigEndian.PutUint16(tcp[2:], vipPort)
	iss := uint32(i)*2654435761 + 1
	tsval := uint32(i) * 7
	if syn {
		binary.BigEndian.PutUint32(tcp[4:], iss)
		tcp[12] = byte(synTCPLen/4) << 4
		tcp[13] = packet.TCPSyn
		binary.BigEndian.PutUint16(tcp[14:], 64240)
		o := tcp[20:]
		o[0], o[1] = 2, 4 // MSS 1460
		binary.BigEndian.PutUint16(o[2:], 1460)
		o[4], o[5] = 4, 2 // SACK permitted
		o[6], o[7] = 8, 10
		binary.BigEndian.PutUint32(o[8:], tsval)
		o[16] = 1                     // NOP
		o[17], o[18], o[19] = 3, 3, 7 // window scale 7
	} else {
		binary.BigEndian.PutUint32(tcp[4:], iss+1)
		binary.BigEndian.PutUint32(tcp[8:], uint32(i)*40503+1)
		tcp[12] = byte(ackTCPLen/4) << 4
		tcp[13] = packet.TCPAck
		binary.BigEndian.PutUint16(tcp[14:], 502)
		o := tcp[20:]
		o[0], o[1] = 1, 1 // NOP NOP
		o[2], o[3] = 8, 10
		binary.BigEndian.PutUint32(o[4:], tsval+100)
		binary.BigEndian.PutUint32(o[8:], tsval+50)
	}
	sum := packet.PseudoHeaderSum(client, vip, packet.ProtoTCP, tcpLen)
	binary.BigEndian.PutUint16(tcp[16:], wire.Checksum(tcp, sum))
}
