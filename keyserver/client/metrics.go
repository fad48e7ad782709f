package client

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/promreg"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// opSeconds are the buckets of tiergate_keyserver_op_seconds: 100µs to 5s.
var opSeconds = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5,
}

// opCache is the number of op codes whose metric children are cached.
const opCache = 64

// metrics are the client's Prometheus metrics. A nil *metrics records nothing.
type metrics struct {
	ops       *prometheus.CounterVec   // tiergate_keyserver_ops_total{op,result}
	seconds   *prometheus.HistogramVec // tiergate_keyserver_op_seconds{op}
	inflight  prometheus.Gauge         // tiergate_keyserver_inflight
	conns     *prometheus.GaugeVec     // tiergate_keyserver_connections{server}
	failovers prometheus.Counter       // tiergate_keyserver_failovers_total
	fallbacks prometheus.Counter       // tiergate_keyserver_fallbacks_total
	attempts  *prometheus.CounterVec   // tiergate_keyserver_attempts_total{server,result}

	// Children resolved once, so the hot path does not hash label values.
	opCounters [opCache][numOutcomes]atomic.Pointer[prometheus.Counter]
	opObserver [opCache]atomic.Pointer[prometheus.Observer]
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_keyserver_ops_total",
			Help: "Keyserver operations requested by this client, by operation and final result (a protocol code, timeout, transport, fallback, canceled, closed or unavailable).",
		}, []string{"op", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_keyserver_op_seconds",
			Help:    "Time from request to final answer of keyserver operations, fail-over included.",
			Buckets: opSeconds,
		}, []string{"op"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_inflight",
			Help: "Keyserver operations waiting for an answer.",
		}),
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tiergate_keyserver_connections",
			Help: "Connections to each keyserver that are up.",
		}, []string{"server"}),
		failovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_keyserver_failovers_total",
			Help: "Attempts retried on another keyserver after a failure.",
		}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_keyserver_fallbacks_total",
			Help: "Operations served by a local fallback key after every keyserver failed.",
		}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_keyserver_attempts_total",
			Help: "Attempts on each keyserver, by result.",
		}, []string{"server", "result"}),
	}
	var err error
	if m.ops, err = promreg.Register(reg, m.ops); err != nil {
		return nil, err
	}
	if m.seconds, err = promreg.Register(reg, m.seconds); err != nil {
		return nil, err
	}
	if m.inflight, err = promreg.Register(reg, m.inflight); err != nil {
		return nil, err
	}
	if m.conns, err = promreg.Register(reg, m.conns); err != nil {
		return nil, err
	}
	if m.failovers, err = promreg.Register(reg, m.failovers); err != nil {
		return nil, err
	}
	if m.fallbacks, err = promreg.Register(reg, m.fallbacks); err != nil {
		return nil, err
	}
	if m.attempts, err = promreg.Register(reg, m.attempts); err != nil {
		return nil, err
	}
	return m, nil
}

// op records the final result and duration of an operation.
func (m *metrics) op(op protocol.Op, o outcome, start time.Time) {
	if m == nil {
		return
	}
	m.opCounter(op, o).Inc()
	m.opSeconds(op).Observe(time.Since(start).Seconds())
}

func (m *metrics) opCounter(op protocol.Op, o outcome) prometheus.Counter {
	if int(op) >= opCache {
		return m.ops.WithLabelValues(op.String(), o.String())
	}
	p := &m.opCounters[op][o]
	if c := p.Load(); c != nil {
		return *c
	}
	c := m.ops.WithLabelValues(op.String(), o.String())
	p.Store(&c)
	return c
}

func (m *metrics) opSeconds(op protocol.Op) prometheus.Observer {
	if int(op) >= opCache {
		return m.seconds.WithLabelValues(op.String())
	}
	p := &m.opObserver[op]
	if o := p.Load(); o != nil {
		return *o
	}
	o := m.seconds.WithLabelValues(op.String())
	p.Store(&o)
	return o
}

func (m *metrics) addInflight(d float64) {
	if m != nil {
		m.inflight.Add(d)
	}
}

func (m *metrics) failover() {
	if m != nil {
		m.failovers.Inc()
	}
}

func (m *metrics) fallback() {
	if m != nil {
		m.fallbacks.Inc()
	}
}

// serverMetrics are one server's children of the labelled metrics.
type serverMetrics struct {
	conns    prometheus.Gauge
	attempts [numOutcomes]atomic.Pointer[prometheus.Counter]
	vec      *prometheus.CounterVec
	addr     string
}

func (m *metrics) server(addr string) *serverMetrics {
	if m == nil {
		return nil
	}
	return &serverMetrics{conns: m.conns.WithLabelValues(addr), vec: m.attempts, addr: addr}
}

func (sm *serverMetrics) addConns(d float64) {
	if sm != nil {
		sm.conns.Add(d)
	}
}

func (sm *serverMetrics) attempt(o outcome) {
	if sm == nil {
		return
	}
	p := &sm.attempts[o]
	if c := p.Load(); c != nil {
		(*c).Inc()
		return
	}
	c := sm.vec.WithLabelValues(sm.addr, o.String())
	p.Store(&c)
	c.Inc()
}
