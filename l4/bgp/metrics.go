package bgp

import (
	"context"
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
)

// collector reads the speaker at scrape time.
type collector struct{ s *Speaker }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessionUp, descSessionState, descSessionUptime, descSessionFlaps,
		descPeerAdvertised, descAnnounced, descWithdrawn, descAnnouncements, descWithdrawals, descVIPAnnounced} {
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
