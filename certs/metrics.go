package certs

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tiergate/tiergate/internal/promreg"
)

type metrics struct {
	expiry   *prometheus.GaugeVec   // tiergate_tls_certificate_expiry_seconds{name,subject}
	count    prometheus.Gauge       // tiergate_tls_certificates
	rejected prometheus.Gauge       // tiergate_tls_certificates_rejected
	loads    *prometheus.CounterVec // tiergate_tls_certificate_loads_total{result}

	series map[[2]string]struct{} // expiry label sets set by the last load
}

func newMetrics(reg prometheus.Registerer, log *slog.Logger) *metrics {
	m := &metrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tiergate_tls_certificate_expiry_seconds",
			Help: "When each served certificate expires (its NotAfter), as a Unix time.",
		}, []string{"name", "subject"}),
		count: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_tls_certificates",
			Help: "Certificates being served.",
		}),
		rejected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_tls_certificates_rejected",
			Help: "Configured certificates left out by the last successful load.",
		}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_tls_certificate_loads_total",
			Help: "Certificate loads and reloads, by result (ok: the new set is served; error: the old set stays).",
		}, []string{"result"}),
	}
	m.loads.WithLabelValues("ok")
	m.loads.WithLabelValues("error")
	if reg == nil {
		return m
	}
	var err error
	if m.expiry, err = promreg.Register(reg, m.expiry); err == nil {
		if m.count, err = promreg.Register(reg, m.count); err == nil {
			if m.rejected, err = promreg.Register(reg, m.rejected); err == nil {
				m.loads, err = promreg.Register(reg, m.loads)
			}
		}
	}
	if err != nil {
		log.Error("certificate metrics are not registered", "err", err)
	}
	return m
}

// loaded records a successful load: set is served and rejected certificates were
// left out. Expiry series of certificates no longer served are deleted.
func (m *metrics) loaded(set *Set, rejected int) {
	series := make(map[[2]string]struct{}, len(set.certs))
	for _, c := range set.certs {
		l := [2]string{c.Name, c.Leaf.Subject.String()}
		series[l] = struct{}{}
		m.expiry.WithLabelValues(l[0], l[1]).Set(float64(c.NotAfter.Unix()))
	}
	for l := range m.series {
		if _, ok := series[l]; !ok {
			m.expiry.DeleteLabelValues(l[0], l[1])
		}
	}
	m.series = series
	m.count.Set(float64(len(set.certs)))
	m.rejected.Set(float64(rejected))
	m.loads.WithLabelValues("ok").Inc()
}

func (m *metrics) failed() { m.loads.WithLabelValues("error").Inc() }
