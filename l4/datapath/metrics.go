package datapath

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descPackets = prometheus.NewDesc("tiergate_l4_packets_total",
		"Packets handled by the datapath, by direction (in: client to member, out: member to client, local: to the LD) and result (forwarded, local, or the drop reason).",
		[]string{"dir", "result"}, nil)
	descConns = prometheus.NewDesc("tiergate_l4_connections",
		"Entries in the connection tables of all workers.", nil, nil)
	descHalfOpen = prometheus.NewDesc("tiergate_l4_connections_half_open",
		"Half-open (SYN seen, no ACK yet) entries in the connection tables.", nil, nil)
	descUnconfirmed = prometheus.NewDesc("tiergate_l4_connections_unconfirmed",
		"Unconfirmed entries (flows picked up mid-way that their member has not answered yet) in the connection tables.", nil, nil)
	descEvictions = prometheus.NewDesc("tiergate_l4_conntrack_evictions_total",
		"Unconfirmed, then half-open, entries evicted to make room for new connections (flood defence).", nil, nil)
	descICMPErrors = prometheus.NewDesc("tiergate_l4_icmp_errors_total",
		"ICMP errors (fragmentation needed, packet too big) for packets that do not fit the tunnel: sent, or suppressed by the rate limit.", []string{"result"}, nil)
	descNeighbours = prometheus.NewDesc("tiergate_l4_neighbours",
		"Entries in the neighbour (ARP and ND) table.", nil, nil)
	descNeighEvictions = prometheus.NewDesc("tiergate_l4_neighbour_evictions_total",
		"Neighbour entries evicted, least recently used first, to make room in a full table.", nil, nil)
	descNeighRefused = prometheus.NewDesc("tiergate_l4_neighbour_refused_total",
		"On-link destinations not resolved because the neighbour table was full of pinned entries (gateways, members).", nil, nil)
	descExpired = prometheus.NewDesc("tiergate_l4_conntrack_expired_total",
		"Connection-table entries reclaimed after their timeout.", nil, nil)
	descBlSweeps = prometheus.NewDesc("tiergate_l4_blacklist_sweeps_total",
		"Sweeps of the workers' connection tables completed after the blacklists changed (each removes the flows of clients now listed).", nil, nil)
	descBlRemoved = prometheus.NewDesc("tiergate_l4_blacklist_flows_removed_total",
		"Flows removed from the connection tables because their client was put on a blacklist.", nil, nil)
	descRulePackets = prometheus.NewDesc("tiergate_l4_rule_packets_total",
		"Packets tunnelled to members, by rule.", []string{"rule"}, nil)
	descRuleFlows = prometheus.NewDesc("tiergate_l4_rule_new_flows_total",
		"New flows scheduled, by rule.", []string{"rule"}, nil)
	descMemberPackets = prometheus.NewDesc("tiergate_l4_member_packets_total",
		"Packets tunnelled to a member.", []string{"pool", "member"}, nil)
	descMemberConns = prometheus.NewDesc("tiergate_l4_member_connections",
		"Connection-table entries that refer to a member.", []string{"pool", "member"}, nil)
	descMemberUp = prometheus.NewDesc("tiergate_l4_member_up",
		"1 when a member passes its health check, else 0.", []string{"pool", "member"}, nil)
	descMemberDrained = prometheus.NewDesc("tiergate_l4_member_drained",
		"1 when a member is drained (no new flows), else 0.", []string{"pool", "member"}, nil)
)

// collector reads the workers' published counters at scrape time.
type collector struct{ d *Distributor }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descConns, descHalfOpen, descUnconfirmed, descEvictions, descExpired,
		descICMPErrors, descNeighbours, descNeighEvictions, descNeighRefused, descBlSweeps, descBlRemoved,
		descRulePackets, descRuleFlows, descMemberPackets, descMemberConns, descMemberUp, descMemberDrained} {
		ch <- d
	}
	ovDescribe(ch)
	describeTrace(ch)
	pxDescribe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ws := c.d.workers
	for d := range numDirs {
		for r := range numResults {
			var n uint64
			for _, w := range ws {
				n += w.pub.packets[d][r].Load()
			}
			if n > 0 || r == resForwarded {
				ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(n), dirNames[d], resultNames[r])
			}
		}
	}
	var conns, half, unconf int64
	var ev, ex, sent, supp, sweeps, removed uint64
	for _, w := range ws {
		sweeps += w.pub.blSweeps.Load()
		removed += w.pub.blRemoved.Load()
		conns += w.pub.tableLen.Load()
		half += w.pub.halfOpen.Load()
		unconf += w.pub.unconf.Load()
		ev += w.pub.evictions.Load()
		ex += w.pub.expired.Load()
		sent += w.pub.icmpSent.Load()
		supp += w.pub.icmpSupp.Load()
	}
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(conns))
	ch <- prometheus.MustNewConstMetric(descHalfOpen, prometheus.GaugeValue, float64(half))
	ch <- prometheus.MustNewConstMetric(descUnconfirmed, prometheus.GaugeValue, float64(unconf))
	ch <- prometheus.MustNewConstMetric(descICMPErrors, prometheus.CounterValue, float64(sent), "sent")
	ch <- prometheus.MustNewConstMetric(descICMPErrors, prometheus.CounterValue, float64(supp), "suppressed")
	ch <- prometheus.MustNewConstMetric(descNeighbours, prometheus.GaugeValue, float64(c.d.neighCount.Load()))
	ch <- prometheus.MustNewConstMetric(descNeighEvictions, prometheus.CounterValue, float64(c.d.neighEvictions.Load()))
	ch <- prometheus.MustNewConstMetric(descNeighRefused, prometheus.CounterValue, float64(c.d.neighRefused.Load()))
	ch <- prometheus.MustNewConstMetric(descBlSweeps, prometheus.CounterValue, float64(sweeps))
	ch <- prometheus.MustNewConstMetric(descBlRemoved, prometheus.CounterValue, float64(removed))
	ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(ev))
	ch <- prometheus.MustNewConstMetric(descExpired, prometheus.CounterValue, float64(ex))
	c.collectTrace(ch)

	s := c.d.snap.Load()
	if s == nil {
		return
	}
	c.pxCollect(ch, s)
	c.ovCollect(ch, s)
	for id, r := range s.ruleByID {
		if r == nil {
			continue
		}
		var pk, nf uint64
		for _, w := range ws {
			pk += w.pub.rule[id].Load()
			nf += w.pub.newFlows[id].Load()
		}
		ch <- prometheus.MustNewConstMetric(descRulePackets, prometheus.CounterValue, float64(pk), r.name)
		ch <- prometheus.MustNewConstMetric(descRuleFlows, prometheus.CounterValue, float64(nf), r.name)
	}
	for id, m := range s.members {
		if m == nil || m.retired {
			continue
		}
		var pk, cn uint64
		for _, w := range ws {
			pk += w.pub.member[id].Load()
			cn += w.pub.conns[id].Load()
		}
		ch <- prometheus.MustNewConstMetric(descMemberPackets, prometheus.CounterValue, float64(pk), m.pool, m.name)
		ch <- prometheus.MustNewConstMetric(descMemberConns, prometheus.GaugeValue, float64(cn), m.pool, m.name)
		ch <- prometheus.MustNewConstMetric(descMemberUp, prometheus.GaugeValue, b2f(m.up), m.pool, m.name)
		ch <- prometheus.MustNewConstMetric(descMemberDrained, prometheus.GaugeValue, b2f(m.drained), m.pool, m.name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Status is a point-in-time view of the datapath for the admin API.
type Status struct {
	Rules   []RuleStatus      `json:"rules"`
	Members []MemberStatus    `json:"members"`
	Packets map[string]uint64 `json:"packets"` // "dir/result" → count
	Conns   int64             `json:"connections"`
	Neigh   map[string]string `json:"neighbours"`
	// Blacklist is what the workers did for the blacklists (SetBlacklists).
	Blacklist BlacklistStatus `json:"blacklist"`
	// SynProxy is the SYN proxy's counters (SynProxyStats).
	SynProxy SynProxyStats `json:"synproxy"`
	// Overload is the overload protection's state and the rules' limits and quotas.
	Overload OverloadStatus `json:"overload"`
}

// BlacklistStatus is the blacklists' view: the lists in force and the sweeps of the
// connection tables their changes caused. Packets dropped are in Status.Packets, as
// in/blacklisted.
type BlacklistStatus struct {
	// Lists are the names of the lists in force, and Entries their sizes.
	Lists   []string `json:"lists"`
	Entries []int    `json:"entries"`
	// Sweeps counts the workers' sweeps completed (one per worker per change), and
	// FlowsRemoved the flows they removed because their client was listed.
	Sweeps       uint64 `json:"sweeps"`
	FlowsRemoved uint64 `json:"flows_removed"`
}

// RuleStatus is one rule's view.
type RuleStatus struct {
	Name     string `json:"name"`
	VIP      string `json:"vip"`
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
	Pool     string `json:"pool"`
	Members  int    `json:"schedulable_members"`
	Packets  uint64 `json:"packets"`
	NewFlows uint64 `json:"new_flows"`
}

// MemberStatus is one member's view.
type MemberStatus struct {
	Pool        string `json:"pool"`
	Name        string `json:"name"`
	Address     string `json:"address"`
	Up          bool   `json:"up"`
	Drained     bool   `json:"drained"`
	Retired     bool   `json:"retired,omitempty"`
	Resolved    bool   `json:"resolved"`
	Connections uint64 `json:"connections"`
	Packets     uint64 `json:"packets"`
}

// Status reports rules, members and counters as the workers last published them
// (at most 100 ms old).
func (d *Distributor) Status() Status {
	st := Status{Packets: map[string]uint64{}, Neigh: map[string]string{}}
	ws := d.workers
	for dd := range numDirs {
		for r := range numResults {
			var n uint64
			for _, w := range ws {
				n += w.pub.packets[dd][r].Load()
			}
			if n > 0 {
				st.Packets[dirNames[dd]+"/"+resultNames[r]] = n
			}
		}
	}
	for _, w := range ws {
		st.Conns += w.pub.tableLen.Load()
		st.Blacklist.Sweeps += w.pub.blSweeps.Load()
		st.Blacklist.FlowsRemoved += w.pub.blRemoved.Load()
	}
	st.Blacklist.Lists, st.Blacklist.Entries = []string{}, []int{}
	st.SynProxy = d.SynProxyStats()
	for _, l := range d.Blacklists() {
		st.Blacklist.Lists = append(st.Blacklist.Lists, l.Name())
		st.Blacklist.Entries = append(st.Blacklist.Entries, l.Len())
	}
	s := d.snap.Load()
	st.Overload = d.overloadStatus(s)
	for id, r := range s.ruleByID {
		if r == nil {
			continue
		}
		rs := RuleStatus{Name: r.name, VIP: r.vip.String(), Port: r.port, Pool: r.pool, Members: len(r.ids)}
		rs.Protocol = "tcp"
		if r.proto != 6 {
			rs.Protocol = "udp"
		}
		for _, w := range ws {
			rs.Packets += w.pub.rule[id].Load()
			rs.NewFlows += w.pub.newFlows[id].Load()
		}
		st.Rules = append(st.Rules, rs)
	}
	for id, m := range s.members {
		if m == nil {
			continue
		}
		ms := MemberStatus{Pool: m.pool, Name: m.name, Address: m.addr.String(), Up: m.up,
			Drained: m.drained, Retired: m.retired, Resolved: m.encap != nil}
		for _, w := range ws {
			ms.Connections += w.pub.conns[id].Load()
			ms.Packets += w.pub.member[id].Load()
		}
		st.Members = append(st.Members, ms)
	}
	_ = d.do(func(c *control) {
		for a, e := range c.neigh.entries {
			if e.valid {
				st.Neigh[a.String()] = e.mac.String()
			}
		}
	})
	return st
}
