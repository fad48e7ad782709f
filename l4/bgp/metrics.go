package bgp

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descSessionUp = prometheus.NewDesc("tiergate_l4_bgp_session_up",
		"1 when the BGP session with the peer is established, else 0.", []string{"peer"}, nil)
	descSessionState = prometheus.NewDesc("tiergate_l4_bgp_session_state",
		"1 for the BGP session's FSM state (idle, connect, active, opensent, openconfirm, established), 0 for the others.", []string{"peer", "state"}, nil)
	descSessionUptime = prometheus.NewDesc("tiergate_l4_bgp_session_uptime_seconds",
		"How long the BGP session with the peer has been established; 0 when it is not.", []string{"peer"}, nil)
	descSessionFlaps = prometheus.NewDesc("tiergate_l4_bgp_session_flaps_total",
		"Times the BGP session with the peer went down after having been established.", []string{"peer"}, nil)
	descPeerAdvertised = prometheus.NewDesc("tiergate_l4_bgp_peer_prefixes_advertised",
		"Prefixes advertised to the peer and in force there.", []string{"peer"}, nil)
	descAnnounced = prometheus.NewDesc("tiergate_l4_bgp_prefixes_announced",
		"VIPs announced now.", nil, nil)
	descWithdrawn = prometheus.NewDesc("tiergate_l4_bgp_prefixes_withdrawn",
		"VIPs withdrawn now, by the reason (drain, shutdown, datapath_stopped, ports_down, no_healthy_member, a gate's name, not_started).", []string{"reason"}, nil)
	descAnnouncements = prometheus.NewDesc("tiergate_l4_bgp_announcements_total",
		"VIPs announced (each time one goes from withdrawn to announced).", nil, nil)
	descWithdrawals = prometheus.NewDesc("tiergate_l4_bgp_withdrawals_total",
		"VIPs withdrawn (each time one goes from announced to withdrawn), by reason.", []string{"reason"}, nil)
	descVIPAnnounced = prometheus.NewDesc("tiergate_l4_bgp_vip_announced",
		"1 when the VIP is announced; 0 when it is withdrawn, with the reason.", []string{"vip", "reason"}, nil)

	descBFDUp = prometheus.NewDesc("tiergate_l4_bfd_session_up",
		"1 when the BFD session with the peer is up, else 0 (only peers with BFD).", []string{"peer"}, nil)
	descBFDFlaps = prometheus.NewDesc("tiergate_l4_bfd_session_flaps_total",
		"Times the BFD session with the peer left up.", []string{"peer"}, nil)
	descBFDPackets = prometheus.NewDesc("tiergate_l4_bfd_packets_total",
		"BFD control packets sent (dir=out) to and taken (dir=in) from the peer.", []string{"peer", "dir"}, nil)
	descBFDDetect = prometheus.NewDesc("tiergate_l4_bfd_detect_time_seconds",
		"The time without a packet from the peer after which this LD takes the BFD session down.", []string{"peer"}, nil)
	descBFDDropped = prometheus.NewDesc("tiergate_l4_bfd_dropped_total",
		"BFD packets received and dropped, by reason (ttl: not 255, malformed, auth, unknown_session, queue_full).", []string{"reason"}, nil)
)

// collector reads the speaker at scrape time.
type collector struct{ s *Speaker }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessionUp, descSessionState, descSessionUptime, descSessionFlaps,
		descPeerAdvertised, descAnnounced, descWithdrawn, descAnnouncements, descWithdrawals, descVIPAnnounced,
		descBFDUp, descBFDFlaps, descBFDPackets, descBFDDetect, descBFDDropped} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st := c.s.Status(ctx)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for _, p := range st.Peers {
		gauge(descSessionUp, b2f(p.State == "established"), p.Address)
		for _, s := range SessionStates {
			gauge(descSessionState, b2f(p.State == s), p.Address, s)
		}
		gauge(descSessionUptime, p.UptimeSeconds, p.Address)
		counter(descSessionFlaps, float64(p.Flaps), p.Address)
		gauge(descPeerAdvertised, float64(p.Advertised), p.Address)
		if b := p.BFD; b != nil {
			gauge(descBFDUp, b2f(b.Up()), p.Address)
			counter(descBFDFlaps, float64(b.Flaps), p.Address)
			counter(descBFDPackets, float64(b.TxPackets), p.Address, "out")
			counter(descBFDPackets, float64(b.RxPackets), p.Address, "in")
			gauge(descBFDDetect, b.DetectTimeMs/1000, p.Address)
		}
	}
	for _, r := range slices.Sorted(maps.Keys(st.BFDDropped)) {
		counter(descBFDDropped, float64(st.BFDDropped[r]), r)
	}
	gauge(descAnnounced, float64(st.Announced))
	withdrawn := map[string]int{}
	for _, v := range st.VIPs {
		gauge(descVIPAnnounced, b2f(v.Announced), v.VIP, v.Reason)
		if !v.Announced {
			withdrawn[v.Reason]++
		}
	}
	reasons := []string{ReasonDrain, ReasonShutdown, ReasonDatapathStopped, ReasonPortsDown, ReasonNoHealthyMember}
	for r := range withdrawn {
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	for r := range st.Withdrawals {
		if !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		gauge(descWithdrawn, float64(withdrawn[r]), r)
		counter(descWithdrawals, float64(st.Withdrawals[r]), r)
	}
	counter(descAnnouncements, float64(st.Announcements))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
