package l7

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Handshake results, the values of tiergate_tls_handshakes_total{result}.
const (
	resultOK               = "ok"
	resultNoCertificate    = "no_certificate"    // GetCertificate found none for the SNI
	resultKeyserverError   = "keyserver_error"   // the private-key operation failed
	resultKeyserverTimeout = "keyserver_timeout" // the private-key operation timed out
	resultClientAlert      = "client_alert"      // the client aborted with an alert
	resultTimeout          = "timeout"           // HandshakeTimeout passed
	resultClientClosed     = "client_closed"     // the client went away without an alert
	resultProtocol         = "protocol"          // not TLS, or nothing we could agree on
	resultOther            = "other"
)

// Handshake transports, the values of the transport label of
// tiergate_tls_handshakes_total and tiergate_tls_handshake_seconds.
const (
	transportTCP  = "tcp"  // TLS over TCP
	transportQUIC = "quic" // TLS inside QUIC (HTTP/3)
)

// Connection protocols, the values of tiergate_l7_connections{proto}.
const (
	connTLS   = "tls" // TCP, handshaking
	connHTTP1 = "http1"
	connH2    = "h2"
	connH3    = "h3" // QUIC, handshaking or not
)

// HandshakeBuckets are the buckets of tiergate_tls_handshake_seconds, 500µs to 10s.
var HandshakeBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// RequestBuckets are the buckets of tiergate_http_request_seconds, 1ms to 60s.
var RequestBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

type metrics struct {
	handshakes       *prometheus.CounterVec
	handshakeSeconds *prometheus.HistogramVec
	conns            *prometheus.GaugeVec
	connsRejected    *prometheus.CounterVec
	quicRetries      *prometheus.CounterVec
	bodyMemory       prometheus.Gauge
	bodyRefused      prometheus.Counter
	responsesCut     *prometheus.CounterVec
	requests         *prometheus.CounterVec
	requestSeconds   *prometheus.HistogramVec
	requestsByProto  *prometheus.CounterVec
	backendErrors    *prometheus.CounterVec
	requestChildren  requestChildren // of requests and requestSeconds
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_tls_handshakes_total",
			Help: "TLS handshakes, by listener, transport (tcp: TLS over TCP, quic: TLS inside QUIC), TLS version, resumption, key type of the signature made (none when resumed) and result.",
		}, []string{"listener", "transport", "version", "resumed", "sig", "result"}),
		handshakeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_tls_handshake_seconds",
			Help:    "Time of successful TLS handshakes, from accepting the connection (TCP) or its first packet (QUIC) to the handshake's end, by listener, transport (tcp, quic) and resumption.",
			Buckets: HandshakeBuckets,
		}, []string{"listener", "transport", "resumed"}),
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tiergate_l7_connections",
			Help: "Client connections open, by listener and protocol (tls: TCP still handshaking).",
		}, []string{"listener", "proto"}),
		connsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_l7_connections_rejected_total",
			Help: "Client connections refused, by listener and reason: filtered (by the accept filter, such as a blacklist), max_handshakes, handshakes_per_source (each at accept, before any TLS work), max_conns (at accept over TCP, when its handshake completes over QUIC).",
		}, []string{"listener", "reason"}),
		quicRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_l7_quic_retries_total",
			Help: "QUIC Retry packets sent, asking a new connection to prove its address before any TLS work (quic_retry_above, max_handshakes_per_source), by listener.",
		}, []string{"listener"}),
		bodyMemory: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_l7_body_memory_bytes",
			Help: "Bytes of the buffers HTTP/2 and HTTP/3 request and response bodies are being copied through, against max_body_memory.",
		}),
		bodyRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_l7_body_memory_refused_total",
			Help: "HTTP/2 and HTTP/3 requests answered 503 because max_body_memory was in use.",
		}),
		responsesCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_l7_responses_cut_total",
			Help: "HTTP/2 and HTTP/3 responses whose stream was reset midway, by listener and reason: client (not taken within write_timeout over HTTP/3, or the client went away), backend (the backend failed midway).",
		}, []string{"listener", "reason"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_http_requests_total",
			Help: "HTTP requests answered, by route (its name; in the simple form, the pool; a pool the decider chose; - for requests refused before routing or matching no route) and status code (closed: dropped without an answer).",
		}, []string{"route", "code"}),
		requestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_http_request_seconds",
			Help:    "Time from a request's headers being read to its response being handed to the protocol server, by route.",
			Buckets: RequestBuckets,
		}, []string{"route"}),
		requestsByProto: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_l7_requests_total",
			Help: "HTTP requests answered, by listener and protocol.",
		}, []string{"listener", "proto"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_l7_backend_errors_total",
			Help: "Failed attempts to get a response from a pool member, by pool and reason (connect, timeout, busy, other); a retried request counts each attempt.",
		}, []string{"pool", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.handshakes, m.handshakeSeconds, m.conns, m.connsRejected, m.quicRetries,
			m.bodyMemory, m.bodyRefused, m.responsesCut,
			m.requests, m.requestSeconds, m.requestsByProto, m.backendErrors)
	}
	return m
}

// statusText holds the decimal form of every status code, so counting a request
// does not format one.
var statusText = func() (t [600]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func codeLabel(status int) string {
	if status >= 0 && status < len(statusText) {
		return statusText[status]
	}
	return strconv.Itoa(status)
}

func versionLabel(v uint16) string {
	switch v {
	case 0x0304:
		return "1.3"
	case 0x0303:
		return "1.2"
	case 0x0302:
		return "1.1"
	case 0x0301:
		return "1.0"
	}
	return "unknown"
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
