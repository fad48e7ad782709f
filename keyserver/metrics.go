package keyserver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Rejection reasons, the values of tiergate_keyserver_rejections_total{reason}.
const (
	rejectNoClientCert  = "no_client_cert"
	rejectUnknownCA     = "unknown_ca"
	rejectBadClientCert = "bad_client_cert"
	rejectHandshake     = "handshake"
	rejectNoRule        = "no_rule"
	rejectNotAuthorized = "not_authorized"
	rejectBadRequest    = "bad_request"
	rejectOverloaded    = "overloaded"
	rejectTooManyConns  = "too_many_conns"

	rejectTooManyHandshakes = "too_many_handshakes"        // max_handshakes reached at accept
	rejectSourceHandshakes  = "too_many_source_handshakes" // max_handshakes_per_source reached at accept
	rejectDenied            = "denied"                     // the certificate is on the deny list
	rejectRateLimited       = "rate_limited"               // the client's rule's rate_limit
	rejectDeadline          = "deadline_exceeded"          // the client's deadline passed before the backend took it
	rejectBackendBusy       = "backend_busy"               // no backend session free within backend_wait
)

type metrics struct {
	ops         *prometheus.CounterVec
	opSeconds   *prometheus.HistogramVec
	inFlight    prometheus.Gauge
	conns       prometheus.Gauge
	handshaking prometheus.Gauge
	allowAll    prometheus.Gauge
	rejections  *prometheus.CounterVec
	keys        prometheus.Gauge
	handshakes  prometheus.Counter
	opCounters  map[protocol.Op]map[protocol.Code]prometheus.Counter
	opObservers map[protocol.Op]prometheus.Observer
}

// OpBuckets are the latency buckets of tiergate_keyserver_op_seconds, 100µs to 5s.
var OpBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_keyserver_ops_total",
			Help: "Keyserver operations handled, by operation and result code.",
		}, []string{"op", "result"}),
		opSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_keyserver_op_seconds",
			Help:    "Time from a request's arrival to its answer being queued, by operation.",
			Buckets: OpBuckets,
		}, []string{"op"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_inflight",
			Help: "Requests being worked on.",
		}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_connections",
			Help: "Client connections open, their TLS handshake done (bounded by max_conns).",
		}),
		handshaking: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_handshakes_in_progress",
			Help: "Connections in their TLS handshake, not yet authenticated (bounded by max_handshakes).",
		}),
		allowAll: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_allow_all_clients",
			Help: "1 while allow_all_clients lets every certificate of the client CA sign with every key (no client rules), else 0.",
		}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_keyserver_rejections_total",
			Help: "Connections and requests refused, by reason.",
		}, []string{"reason"}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_keys",
			Help: "Keys the server offers.",
		}),
		handshakes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_keyserver_client_handshakes_total",
			Help: "Client TLS handshakes completed.",
		}),
		opCounters:  map[protocol.Op]map[protocol.Code]prometheus.Counter{},
		opObservers: map[protocol.Op]prometheus.Observer{},
	}
	// Resolve the label sets once so the hot path does no map lookups under a lock.
	for _, op := range protocol.Ops() {
		m.opCounters[op] = map[protocol.Code]prometheus.Counter{}
		for c := protocol.CodeOK; c <= protocol.MaxCode; c++ {
			m.opCounters[op][c] = m.ops.WithLabelValues(op.String(), c.String())
		}
		m.opObservers[op] = m.opSeconds.WithLabelValues(op.String())
	}
	for _, r := range []string{rejectNoClientCert, rejectUnknownCA, rejectBadClientCert, rejectHandshake,
		rejectNoRule, rejectNotAuthorized, rejectBadRequest, rejectOverloaded, rejectTooManyConns,
		rejectTooManyHandshakes, rejectSourceHandshakes, rejectDenied, rejectRateLimited, rejectDeadline, rejectBackendBusy} {
		m.rejections.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.ops, m.opSeconds, m.inFlight, m.conns, m.handshaking, m.allowAll, m.rejections, m.keys, m.handshakes)
	}
	return m
}

func (m *metrics) op(op protocol.Op, code protocol.Code, seconds float64) {
	if c, ok := m.opCounters[op][code]; ok {
		c.Inc()
	} else {
		m.ops.WithLabelValues(op.String(), code.String()).Inc()
	}
	if o, ok := m.opObservers[op]; ok {
		o.Observe(seconds)
	}
}
