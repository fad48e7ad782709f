package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's metrics, each labelled with the node.
type metrics struct {
	applied    prometheus.Gauge
	nacks      prometheus.Counter
	reconnects prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, node string) (*metrics, error) {
	labels := prometheus.Labels{"node": node}
	m := &metrics{
		applied: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_agent_applied_revision", ConstLabels: labels,
			Help: "Store revision of the cluster configuration in force on the node (0 before any).",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_agent_nacks_total", ConstLabels: labels,
			Help: "Snapshots of the cluster configuration the node refused (invalid, inconsistent, or not applied).",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_agent_store_reconnects_total", ConstLabels: labels,
			Help: "Times the node read the store again after it had failed or been out of reach.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.applied, m.nacks, m.reconnects} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("agent: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}
