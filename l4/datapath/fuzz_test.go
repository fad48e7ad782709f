package datapath

import (
	"net/netip"
	"testing"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
)

// FuzzHandle feeds arbitrary frames to a worker, as if received on either port: it
// must never panic, and every frame it transmits must parse.
func FuzzHandle(f *testing.F) {
	t := &testing.T{}
	f.Add(tcp4(t, client, 40000, vip, 443, true, false, nil), true)
	f.Add(tcp4(t, client, 40000, vip, 443, false, true, []byte("data")), true)
	f.Add(udp4(t, client, 5000, vip, 443, append([]byte{0x40}, make([]byte, 30)...)), true)
	f.Add(gre4(t, ldInt, tcp4(t, vip, 443, client, 40000, true, true, nil)[14:]), false)
	f.Add(gre4(t, memberA, replyPacket(t, vip, client, 40000)), false)
	f.Add(tcp4(t, client, 40000, vip, 443, false, true, make([]byte, 1460)), true) // too big, DF
	f.Add(tcpFrame(t, client6, 40000, netip.AddrFrom16(vip.As16()), 443, true, false, nil), true)
	f.Add([]byte{}, true)
	w, s := benchWorker(f, 1024) // nothing reads its control queue: ARP is dropped, counted
	buf := port.Buf{Data: make([]byte, 4096)}
	f.Fuzz(func(t *testing.T, frame []byte, fromExt bool) {
		if len(frame) > 4096-256 {
			return
		}
		buf.Off, buf.Len = 256, copy(buf.Data[256:], frame)
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
	})
}
