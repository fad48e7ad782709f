package packet

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

func optMSS(v uint16) layers.TCPOption {
	return layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: binary.BigEndian.AppendUint16(nil, v)}
}

var (
	optNOP    = layers.TCPOption{OptionType: layers.TCPOptionKindNop, OptionLength: 1}
	optSACKOK = layers.TCPOption{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2}
	optWScale = layers.TCPOption{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}
	optTS     = layers.TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: make([]byte, 8)}
)

// mssOf returns the MSS option value of the TCP header at b[l4:], as gopacket decodes
// it, or 0.
func mssOf(t *testing.T, f []byte) uint16 {
	t.Helper()
	g := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	tcp, _ := g.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if tcp == nil {
		t.Fatalf("gopacket: no TCP layer: %v", g.ErrorLayer())
	}
	for _, o := range tcp.Options {
		if o.OptionType == layers.TCPOptionKindMSS && len(o.OptionData) == 2 {
			return binary.BigEndian.Uint16(o.OptionData)
		}
	}
	return 0
}

func TestClampMSS(t *testing.T) {
	cases := []struct {
		name    string
		src     string // "4" or "6"
		syn     bool
		synAck  bool
		opts    []layers.TCPOption
		max     uint16
		changed bool
		mss     uint16 // MSS after, 0 if absent
	}{
		{"syn mss 1460 to 1400", "4", true, false, []layers.TCPOption{optMSS(1460)}, 1400, true, 1400},
		{"syn mss already below", "4", true, false, []layers.TCPOption{optMSS(1300)}, 1400, false, 1300},
		{"syn mss equal", "4", true, false, []layers.TCPOption{optMSS(1400)}, 1400, false, 1400},
		{"syn no mss", "4", true, false, []layers.TCPOption{optSACKOK, optWScale}, 1400, false, 0},
		{"syn no options", "4", true, false, nil, 1400, false, 0},
		{"syn linux options", "4", true, false, []layers.TCPOption{optMSS(1460), optSACKOK, optTS, optNOP, optWScale}, 1360, true, 1360},
		{"syn mss at odd offset", "4", true, false, []layers.TCPOption{optNOP, optMSS(1460), optNOP, optNOP, optNOP}, 1400, true, 1400},
		{"syn mss after others", "4", true, false, []layers.TCPOption{optNOP, optWScale, optSACKOK, optMSS(9000)}, 1400, true, 1400},
		{"syn mss odd offset big delta", "4", true, false, []layers.TCPOption{optNOP, optNOP, optNOP, optMSS(0xffff)}, 0x0101, true, 0x0101},
		{"syn-ack", "4", false, true, []layers.TCPOption{optMSS(1460)}, 1400, true, 1400},
		{"ack not clamped", "4", false, false, []layers.TCPOption{optMSS(1460)}, 1400, false, 1460},
		{"syn6", "6", true, false, []layers.TCPOption{optMSS(1440), optSACKOK, optWScale}, 1380, true, 1380},
		{"syn6 odd offset", "6", true, false, []layers.TCPOption{optNOP, optMSS(1440)}, 1380, true, 1380},
		{"max 0 ignored", "4", true, false, []layers.TCPOption{optMSS(1460)}, 0, false, 1460},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, dst := client4, vip4
			if c.src == "6" {
				src, dst = client6, vip6
			}
			n := ipLayer(src, dst, layers.IPProtocolTCP)
			tcp := &layers.TCP{SrcPort: 40000, DstPort: 443, Seq: 7, SYN: c.syn || c.synAck, ACK: !c.syn, Window: 1000, Options: c.opts}
			_ = tcp.SetNetworkLayerForChecksum(n)
			f := frame(serialize(t, n.(gopacket.SerializableLayer), tcp, gopacket.Payload("data")))
			var p Packet
			if err := Parse(f, &p); err != nil {
				t.Fatal(err)
			}
			orig := clone(f)
			if got := ClampMSS(f, &p, c.max); got != c.changed {
				t.Fatalf("ClampMSS = %v, want %v", got, c.changed)
			}
			if !c.changed && !bytes.Equal(f, orig) {
				t.Fatal("frame changed though ClampMSS reported no change")
			}
			if !VerifyL4Checksum(f, &p) {
				t.Error("TCP checksum wrong after ClampMSS")
			}
			if got := mssOf(t, f); got != c.mss {
				t.Errorf("MSS %d, want %d", got, c.mss)
			}
			// Only the MSS value and the checksum may differ.
			diff := 0
			for i := range f {
				if f[i] != orig[i] {
					diff++
				}
			}
			if diff > 4 {
				t.Errorf("%d bytes changed", diff)
			}
		})
	}
}

func TestClampMSSMalformedOptions(t *testing.T) {
	base := frame(tcpIP(t, client4, vip4, 1, 2, true, []layers.TCPOption{optMSS(1460), optSACKOK}, nil))
	var p Packet
	if err := Parse(base, &p); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(o []byte) // o is the option space (4 + 2 + padding)
	}{
		{"option length 0", func(o []byte) { o[0], o[1] = 8, 0 }},
		{"option length 1", func(o []byte) { o[0], o[1] = 8, 1 }},
		{"option past header", func(o []byte) { o[0], o[1] = 8, 40 }},
		{"end of options first", func(o []byte) { o[0] = 0 }},
		{"mss length 3", func(o []byte) { o[1] = 3 }},
		{"kind without length", func(o []byte) { o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7] = 1, 1, 1, 1, 1, 1, 1, 2 }},
	} {
		f := clone(base)
		c.edit(f[p.L4+TCPLen : p.L4+int(f[p.L4+12]>>4)*4])
		if ClampMSS(f, &p, 1000) {
			t.Errorf("%s: clamped", c.name)
		}
	}
	// A packet that is not from b must not panic.
	q := p
	q.End = len(base) + 10
	if ClampMSS(base, &q, 1000) {
		t.Error("inconsistent packet clamped")
	}
}
