package datapath

import (
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
	f.Add([]byte{}, true)
	w, s := fuzzWorker(f)
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

// fuzzWorker is a worker of a distributor that is not running, with static
// neighbours, whose control queue is drained as it fills.
func fuzzWorker(f *testing.F) (*worker, *snapshot) {
	cfg := testConfig()
	cfg.External.GatewayMAC = packet.MAC(gwMAC)
	p := cfg.Pools["l7"]
	for i := range p.Members {
		p.Members[i].MAC = packet.MAC(memberMAC[p.Members[i].Address.String()])
	}
	cfg.Pools["l7"] = p
	cfg.Conntrack.Capacity = 1024
	ext := port.NewMem("ext", extMAC, 2, 64, 2048)
	in := port.NewMem("int", intMAC, 2, 64, 2048)
	d, err := NewDistributor(cfg, Options{External: ext, Internal: in})
	if err != nil {
		f.Fatal(err)
	}
	// Nothing reads the control queue: let it drop (counted) rather than block.
	w := d.workers[0]
	s := d.snap.Load()
	w.resync(s)
	return w, s
}
