package blacklist

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tiergate/tiergate/internal/promreg"
)

// Hit sources, the values of tiergate_blacklist_hits_total{source}.
const (
	SourcePacket = "packet" // the address the connection came from
	SourceHeader = "header" // an address taken from a request header
)

// Update kinds and results, the values of tiergate_blacklist_updates_total.
const (
	kindReplace = "replace"
	kindDelta   = "delta"
	resultOK    = "ok"
	resultError = "rejected"
)

// metrics are shared by every List registered with one Registerer; each List holds
// its own children.
type metrics struct {
	hits    *prometheus.CounterVec
	entries *prometheus.GaugeVec
	bytes   *prometheus.GaugeVec
	updates *prometheus.CounterVec
	updated *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_blacklist_hits_total",
			Help: "Blacklisted addresses seen, by list (its name: global, a listener's, or a list from the store) and where the address came from (packet or header).",
		}, []string{"list", "source"}),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tiergate_blacklist_entries",
			Help: "Entries in force (single addresses and merged ranges), by list.",
		}, []string{"list"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tiergate_blacklist_bytes",
			Help: "Memory of the lookup arrays in force, by list.",
		}, []string{"list"}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_blacklist_updates_total",
			Help: "Updates, by list, kind (replace or delta) and result (ok or rejected: the list in force was kept).",
		}, []string{"list", "kind", "result"}),
		updated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tiergate_blacklist_last_update_timestamp_seconds",
			Help: "When the list in force was swapped in, by list.",
		}, []string{"list"}),
	}
	var err error
	if m.hits, err = promreg.Register(reg, m.hits); err != nil {
		return nil, err
	}
	if m.entries, err = promreg.Register(reg, m.entries); err != nil {
		return nil, err
	}
	if m.bytes, err = promreg.Register(reg, m.bytes); err != nil {
		return nil, err
	}
	if m.updates, err = promreg.Register(reg, m.updates); err != nil {
		return nil, err
	}
	if m.updated, err = promreg.Register(reg, m.updated); err != nil {
		return nil, err
	}
	return m, nil
}
