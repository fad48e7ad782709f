package sessionsync

import "github.com/prometheus/client_golang/prometheus"

var (
	descDatagrams = prometheus.NewDesc("tiergate_l4_sync_datagrams_total",
		"Session sync datagrams sent (tx, counted once per peer) and accepted (rx).", []string{"dir"}, nil)
	descEntries = prometheus.NewDesc("tiergate_l4_sync_entries_total",
		"Connection entries in the session sync datagrams sent (tx, once per peer) and accepted (rx).", []string{"dir"}, nil)
	descBytes = prometheus.NewDesc("tiergate_l4_sync_bytes_total",
		"Bytes of UDP payload of the session sync datagrams sent and accepted.", []string{"dir"}, nil)
	descDropped = prometheus.NewDesc("tiergate_l4_sync_dropped_total",
		"Received session sync datagrams dropped: malformed, foreign (another cluster ID), forged (bad HMAC), replayed (sequence seen or too old), unknown_peer.",
		[]string{"reason"}, nil)
	descFullSyncs = prometheus.NewDesc("tiergate_l4_sync_full_syncs_total",
		"Full syncs completed (every live long connection re-sent).", nil, nil)
	descFullSyncSeconds = prometheus.NewDesc("tiergate_l4_sync_full_sync_last_seconds",
		"How long the last full sync took.", nil, nil)
	descWarm = prometheus.NewDesc("tiergate_l4_sync_warmed_up",
		"Whether the warm-up is over: 1 once every peer's full sync arrived or the warm-up timeout passed, else 0.", nil, nil)
	descQueued = prometheus.NewDesc("tiergate_l4_sync_queued_total",
		"Entries the workers queued for the peers (emitted), or could not queue for a full ring (dropped; the next full sync repairs them).",
		[]string{"result"}, nil)
	descInstalled = prometheus.NewDesc("tiergate_l4_sync_installed_total",
		"Received entries the workers installed in their tables (marked synced) or deleted.", nil, nil)
	descRefused = prometheus.NewDesc("tiergate_l4_sync_refused_total",
		"Received entries not installed, by reason: no_rule, no_member, kept (this LD made the flow and keeps it), table_full.",
		[]string{"reason"}, nil)
	descEncap = prometheus.NewDesc("tiergate_l4_sync_encap_mismatch_total",
		"Received entries whose encapsulation is not this LD's (installed all the same).", nil, nil)
)

type collector struct{ s *Syncer }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDatagrams, descEntries, descBytes, descDropped, descFullSyncs,
		descFullSyncSeconds, descWarm, descQueued, descInstalled, descRefused, descEncap} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	counter(descDatagrams, st.TxDatagrams, "tx")
	counter(descDatagrams, st.RxDatagrams, "rx")
	counter(descEntries, st.TxEntries, "tx")
	counter(descEntries, st.RxEntries, "rx")
	counter(descBytes, st.TxBytes, "tx")
	counter(descBytes, st.RxBytes, "rx")
	for _, r := range dropReasons {
		counter(descDropped, st.Dropped[r], r)
	}
	counter(descFullSyncs, st.FullSyncs)
	ch <- prometheus.MustNewConstMetric(descFullSyncSeconds, prometheus.GaugeValue, st.FullSyncLast.Seconds())
	w := 0.0
	if c.s.WarmedUp() {
		w = 1
	}
	ch <- prometheus.MustNewConstMetric(descWarm, prometheus.GaugeValue, w)
	if c.s.opts.Stats != nil {
		ds := c.s.opts.Stats()
		counter(descQueued, ds.Emitted, "emitted")
		counter(descQueued, ds.QueueDropped, "dropped")
		counter(descInstalled, ds.Installed)
		for _, r := range []string{"no_rule", "no_member", "kept", "table_full"} {
			counter(descRefused, ds.Refused[r], r)
		}
		counter(descEncap, ds.EncapMismatch)
	}
}
