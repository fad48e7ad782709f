package trace

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Point is one record as the admin API shows it (GET /trace).
type Point struct {
	Time time.Time `json:"time"`
	// LD is the ID of the LD that recorded it, Worker the worker.
	LD     string `json:"ld"`
	Worker int    `json:"worker"`
	// Kind is "trace" (the packet went on) or "drop".
	Kind string `json:"kind"`
	// Direction is "in" (client to VIP), "out" (a member's reply to the client) or
	// "local" (to the LD itself).
	Direction string `json:"direction"`
	// Action, for a trace point: "tunnel" (sent to Member over the tunnel),
	// "reply" (a member's reply sent on to the client) or "local" (answered by the
	// LD, as an echo request is).
	Action string `json:"action,omitempty"`
	// Reason, for a drop point: why it was dropped, the result label of
	// tiergate_l4_packets_total (no_rule, blacklisted, tx_full, ...).
	Reason string `json:"reason,omitempty"`
	// Member ("pool/name") and MemberAddress: where a packet in was tunnelled.
	Member        string `json:"member,omitempty"`
	MemberAddress string `json:"member_address,omitempty"`
	// Protocol ("tcp", "udp", "icmp", "ipv6-icmp" or the number), the addresses and
	// the ports of the packet (the inner one, for a reply), and its length.
	Protocol string `json:"protocol,omitempty"`
	Src      string `json:"src,omitempty"`
	Dst      string `json:"dst,omitempty"`
	SrcPort  uint16 `json:"src_port,omitempty"`
	DstPort  uint16 `json:"dst_port,omitempty"`
	Length   int    `json:"length"`
	// Sample is the packet's first bytes in hex (Config.SampleBytes).
	Sample string `json:"sample,omitempty"`

	// client is the probe's side, for Filter: the source of a packet in, the
	// destination of one out.
	client netip.Addr
}

// Names turn an Entry's codes into the words of a Point.
type Names struct {
	Dir    func(uint8) string
	Result func(uint8) string
	// Action is the action of a trace point in a direction.
	Action func(dir uint8) string
	// Out is the code of the direction "out", whose probe side is the destination.
	Out uint8
}

// PointOf turns e, recorded by worker, into a Point.
func PointOf(e *Entry, worker int, n *Names) Point {
	p := Point{
		Time: time.Unix(0, e.Time).UTC(), Worker: worker, Kind: e.Kind.String(),
		Direction: n.Dir(e.Dir), Protocol: protoName(e.Proto),
		SrcPort: e.SrcPort, DstPort: e.DstPort, Length: int(e.Len),
		Sample: hex.EncodeToString(e.Sample), client: e.Src,
	}
	if e.Dir == n.Out {
		p.client = e.Dst
	}
	if e.LD != nil {
		p.LD = *e.LD
	}
	if e.Kind == KindDrop {
		p.Reason = n.Result(e.Result)
	} else {
		p.Action = n.Action(e.Dir)
	}
	if e.HopName != nil {
		p.Member = *e.HopName
	}
	if e.HopAddr.IsValid() {
		p.MemberAddress = e.HopAddr.String()
	}
	if e.Src.IsValid() {
		p.Src = e.Src.String()
	}
	if e.Dst.IsValid() {
		p.Dst = e.Dst.String()
	}
	return p
}

func protoName(p uint8) string {
	switch p {
	case 0:
		return ""
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 47:
		return "gre"
	case 58:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(p))
}

// Filter selects points: by the probe's address, the kind, the reason, and how many.
type Filter struct {
	// Src, when valid, keeps the points whose probe side (the source of a packet in
	// or to the LD, the destination of a reply out) it contains.
	Src netip.Prefix
	// Kind, when not "", keeps "trace" or "drop" points only.
	Kind string
	// Reason, when not "", keeps the drop points of this reason.
	Reason string
	// Limit is the most points returned, newest first. Default 100.
	Limit int
}

// DefaultLimit is Filter.Limit's default, MaxLimit its ceiling.
const (
	DefaultLimit = 100
	MaxLimit     = MaxRecords * 64
)

// ParseQuery reads a Filter from GET /trace's query: src (an address or a prefix),
// kind (trace or drop), reason (a drop reason: letters, digits and "_") and limit
// (1..MaxLimit). Any other parameter, or one given twice, is an error that says
// which.
func ParseQuery(q url.Values) (Filter, error) {
	f := Filter{Limit: DefaultLimit}
	for k, vs := range q {
		if len(vs) != 1 {
			return f, fmt.Errorf("query parameter %q is given %d times", k, len(vs))
		}
		v := vs[0]
		switch k {
		case "src":
			if strings.Contains(v, "/") {
				p, err := netip.ParsePrefix(v)
				if err != nil {
					return f, fmt.Errorf("src: %v", err)
				}
				f.Src = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr())).Masked()
			} else {
				a, err := netip.ParseAddr(v)
				if err != nil {
					return f, fmt.Errorf("src: %v", err)
				}
				if a.Zone() != "" {
					return f, fmt.Errorf("src: %q has a zone", v)
				}
				a = a.Unmap()
				f.Src = netip.PrefixFrom(a, a.BitLen())
			}
		case "kind":
			if v != "trace" && v != "drop" {
				return f, fmt.Errorf("kind: %q is not trace or drop", v)
			}
			f.Kind = v
		case "reason":
			if v == "" || len(v) > 64 || strings.IndexFunc(v, func(r rune) bool {
				return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
			}) >= 0 {
				return f, fmt.Errorf("reason: %q is not a drop reason (no_rule, blacklisted, ...)", v)
			}
			f.Reason = v
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxLimit {
				return f, fmt.Errorf("limit: %q is not a number in 1..%d", v, MaxLimit)
			}
			f.Limit = n
		default:
			return f, fmt.Errorf("unknown query parameter %q (src, kind, reason, limit)", k)
		}
	}
	return f, nil
}

// Keep reports whether p passes the filter (Limit aside).
func (f *Filter) Keep(p *Point) bool {
	if f.Src.IsValid() && !f.Src.Contains(p.client.Unmap()) {
		return false
	}
	if f.Kind != "" && p.Kind != f.Kind {
		return false
	}
	if f.Reason != "" && p.Reason != f.Reason {
		return false
	}
	return true
}

// Select returns the points f keeps, newest first, at most f.Limit of them (all
// when it is 0). points is reordered.
func Select(points []Point, f Filter) []Point {
	slices.SortStableFunc(points, func(a, b Point) int { return b.Time.Compare(a.Time) })
	out := points[:0]
	for i := range points {
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
		if f.Keep(&points[i]) {
			out = append(out, points[i])
		}
	}
	return out
}
