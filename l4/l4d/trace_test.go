package l4d

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/l4/datapath"
)

// markedSYN is a client's SYN to 203.0.113.10:dport with the IPv4 TOS byte tos.
func markedSYN(t *testing.T, tos uint8, dport uint16) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 60, TOS: tos, Protocol: layers.IPProtocolTCP,
		SrcIP: net.ParseIP("192.0.2.9").To4(), DstIP: net.ParseIP("203.0.113.10").To4()}
	tcp := &layers.TCP{SrcPort: 40000, DstPort: layers.TCPPort(dport), SYN: true, Seq: 1, Window: 64240}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xfe}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, EthernetType: layers.EthernetTypeIPv4},
		ip, tcp)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestTraceAPI: with a trace section, a marked probe dropped for want of a rule is
// reported by GET /trace (filtered by reason and src) and the metrics; a bad query
// is 400; the trace section changes on reload.
func TestTraceAPI(t *testing.T) {
	cfg := testConfig + "trace: {ld: ld-test, dscp: 46, records: 64}\n"
	td := startWith(t, cfg)
	td.want("GET", "/trace", "", 200, `"enabled": true`, `"ld": "ld-test"`)
	td.ports.dev("external").Inject(markedSYN(t, 0, 444))     // unmarked
	td.ports.dev("external").Inject(markedSYN(t, 46<<2, 444)) // the probe
	var rep datapath.TraceReport
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, b := td.do("GET", "/trace?reason=no_rule&src=192.0.2.0/24", "")
		if err := json.Unmarshal([]byte(b), &rep); err != nil {
			t.Fatalf("GET /trace: %v: %s", err, b)
		}
		if len(rep.Points) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(rep.Points) != 1 {
		t.Fatalf("GET /trace: %d points, want the probe's drop: %+v", len(rep.Points), rep)
	}
	if p := rep.Points[0]; p.Kind != "drop" || p.Reason != "no_rule" || p.LD != "ld-test" || p.Src != "192.0.2.9" ||
		p.DstPort != 444 || !strings.HasPrefix(p.Sample, "45b8") {
		t.Errorf("drop point %+v", p)
	}
	td.want("GET", "/trace?reason=blacklisted", "", 200, `"points": []`)
	body := td.want("GET", "/trace?limit=0", "", 400)
	apiErr(t, body, 400, "bad_request")
	td.want("GET", "/trace?color=red", "", 400, "unknown query parameter")
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(td.want("GET", "/metrics", "", 200), `tiergate_l4_trace_drops_total{reason="no_rule"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("no trace drop in the metrics:\n%s", brief(td.want("GET", "/metrics", "", 200)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	td.want("GET", "/metrics", "", 200, `tiergate_l4_trace_points_total{direction="in",ld="ld-test"} 0`)

	writeFile(t, td.Path, strings.Replace(cfg, "ld-test", "ld-2", 1))
	td.want("POST", "/reload", "", 200)
	td.want("GET", "/trace", "", 200, `"ld": "ld-2"`)
	writeFile(t, td.Path, testConfig)
	td.want("POST", "/reload", "", 200)
	td.want("GET", "/trace", "", 200, `"enabled": false`)
}

func TestTraceConfigErrors(t *testing.T) {
	_, err := ParseConfig([]byte(testConfig+"trace: {dscp: 64, sources: [192.0.2.0/24]}\n"), "l4d.yaml")
	if err == nil || !strings.Contains(err.Error(), "trace.dscp") {
		t.Fatalf("ParseConfig: %v, want trace.dscp named", err)
	}
}
