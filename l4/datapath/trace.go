package datapath

import (
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/trace"
)

// TraceConfig is Config.Trace: which probe packets are traced (trace.Config: ld,
// dscp, sources, tcp_option, records, sample_bytes). Its zero value traces nothing.
type TraceConfig = trace.Config

// traceConf is the snapshot's compiled tracing, nil when off.
type traceConf struct {
	marker  *trace.Marker
	ld      string // &ld is what records point at
	records int
	sample  int
	rate    int // records per second per worker
}

func newTraceConf(c *TraceConfig) *traceConf {
	m := trace.NewMarker(c)
	if m == nil {
		return nil
	}
	return &traceConf{marker: m, ld: c.LD, records: c.Records, sample: c.SampleBytes, rate: c.Rate}
}

// workerTrace is a worker's tracing: its ring of records (which readers load), its
// counters, and what it kept of the marked packet being handled. Only the worker
// writes it, but for the ring's records and the counters, which are atomics (they
// change only for marked packets).
type workerTrace struct {
	ring atomic.Pointer[trace.Ring]
	conf *traceConf // what ring and labels were made for

	points     [numDirs]atomic.Uint64    // trace points recorded, by direction
	drops      [numResults]atomic.Uint64 // drop points recorded, by reason
	suppressed atomic.Uint64             // marked packets not recorded, past the rate
	bucket     tokenBucket               // records written (Config.Trace.Rate)

	// The marked packet being handled (traceMark, traceInner).
	e      trace.Entry
	sample [trace.MaxSampleBytes]byte
	hop    *member // where forward sent it
	labels map[*member]*string
}

// traceSync follows a new snapshot's tracing: a new ring when its size changed.
// It runs on the worker (resync).
func (w *worker) traceSync(s *snapshot) {
	w.tmark = false
	tc := s.trace
	if tc == nil {
		w.tr.conf = nil
		return
	}
	if r := w.tr.ring.Load(); r == nil || r.Size() != tc.records || r.SampleBytes() != tc.sample {
		w.tr.ring.Store(trace.NewRing(tc.records, tc.sample))
	}
	w.tr.conf = tc
	w.tr.labels = map[*member]*string{}
	w.tr.bucket.set(tc.rate, max(32, tc.rate/10))
}

// traceMark decides, once per packet and only when tracing is on, whether the
// packet being handled is marked, and if it is keeps its addresses and a sample.
func (w *worker) traceMark(s *snapshot, frame []byte, p *packet.Packet, perr error) {
	m := s.trace.marker
	if perr != nil {
		w.tmark = m.MatchFrame(frame)
		if w.tmark {
			w.traceKeep(frame, 0, len(frame), &packet.Packet{})
		}
		return
	}
	if p.EtherType != packet.EtherTypeIPv4 && p.EtherType != packet.EtherTypeIPv6 {
		w.tmark = false
		return
	}
	w.tmark = m.Match(frame, p.L3, p.L4, p.Proto, p.Src)
	if w.tmark {
		w.traceKeep(frame, p.L3, p.End, p)
	}
}

// traceInner is traceMark for the client's packet inside a member's reply: a reply
// whose inner packet is marked (its destination a probe server's, or its DSCP the
// marker's) is traced, and then described by its inner packet.
func (w *worker) traceInner(s *snapshot, frame []byte, ip *packet.Packet) {
	if s.trace.marker.Match(frame, ip.L3, ip.L4, ip.Proto, ip.Dst) {
		w.tmark = true
		w.traceKeep(frame, ip.L3, ip.End, ip)
	}
}

// traceKeep keeps what a record says of the packet at frame[from:to].
func (w *worker) traceKeep(frame []byte, from, to int, p *packet.Packet) {
	to = min(to, len(frame))
	if from > to {
		from = to
	}
	e := &w.tr.e
	*e = trace.Entry{
		Proto: p.Proto, SrcPort: p.SrcPort, DstPort: p.DstPort, Src: p.Src, Dst: p.Dst,
		Len: uint16(min(to-from, 0xffff)),
	}
	n := copy(w.tr.sample[:], frame[from:to])
	e.Sample = w.tr.sample[:n]
	w.tr.hop = nil
}

// tracePoint records the marked packet being handled, counted as d/r: a trace point
// when it went on (forwarded, local), else a drop point with the reason.
func (w *worker) tracePoint(d direction, r result) {
	w.tmark = false
	tc := w.tr.conf
	ring := w.tr.ring.Load()
	if tc == nil || ring == nil {
		return
	}
	if !w.tr.bucket.ready(w.mono) {
		w.tr.suppressed.Add(1)
		return
	}
	w.tr.bucket.take()
	w.last.mark = true
	e := &w.tr.e
	e.Time = time.Now().UnixNano()
	e.Dir, e.Result, e.LD = uint8(d), uint8(r), &tc.ld
	e.HopName, e.HopAddr, e.Hop = nil, netip.Addr{}, 0
	if r == resForwarded || r == resLocal {
		e.Kind = trace.KindTrace
		if m := w.tr.hop; m != nil && d == dirIn {
			e.Hop, e.HopAddr, e.HopName = m.id, m.addr, w.traceLabel(m)
		}
		w.tr.points[d].Add(1)
	} else {
		e.Kind = trace.KindDrop
		w.tr.drops[r].Add(1)
	}
	ring.Put(e)
	w.tr.hop = nil
}

// traceLabel is "pool/name" of m, made once per snapshot.
func (w *worker) traceLabel(m *member) *string {
	if l, ok := w.tr.labels[m]; ok {
		return l
	}
	l := m.pool + "/" + m.name
	if w.tr.labels == nil {
		w.tr.labels = map[*member]*string{}
	}
	w.tr.labels[m] = &l
	return &l
}

// traceTxFull records a drop point for a marked packet that the port did not take
// (tx_full), from the frame as it was to be sent, instead of its trace point in the
// counters. Only a recorded packet comes here, so the rate is not checked again.
func (w *worker) traceTxFull(b *port.Buf, c counted) {
	tc := w.tr.conf
	ring := w.tr.ring.Load()
	if tc == nil || ring == nil {
		return
	}
	if c.r == resForwarded || c.r == resLocal {
		w.tr.points[c.d].Add(^uint64(0))
	} else {
		w.tr.drops[c.r].Add(^uint64(0))
	}
	w.tr.drops[resTxFull].Add(1)
	frame := b.Data[b.Off : b.Off+b.Len]
	var p packet.Packet
	if packet.Parse(frame, &p) != nil {
		p = packet.Packet{}
	}
	w.traceKeep(frame, 0, len(frame), &p)
	e := &w.tr.e
	e.Time = time.Now().UnixNano()
	e.Kind, e.Dir, e.Result, e.LD = trace.KindDrop, uint8(c.d), uint8(resTxFull), &tc.ld
	ring.Put(e)
}

// TraceReport is GET /trace: the LD's ID and its recent trace and drop points.
type TraceReport struct {
	// Enabled is false when Config.Trace sets no criterion (nothing is traced).
	Enabled bool `json:"enabled"`
	// LD is this LD's ID (Config.Trace.LD).
	LD string `json:"ld,omitempty"`
	// Points are the records the filter kept, newest first.
	Points []trace.Point `json:"points"`
}

var traceNames = trace.Names{
	Dir:    func(d uint8) string { return dirNames[direction(d)%numDirs] },
	Result: func(r uint8) string { return resultNames[result(r)%numResults] },
	Action: func(d uint8) string {
		switch direction(d) {
		case dirIn:
			return "tunnel"
		case dirOut:
			return "reply"
		}
		return "local"
	},
	Out: uint8(dirOut),
}

// Trace returns the trace and drop points of every worker that f keeps, newest
// first. It copies the workers' rings without stopping them.
func (d *Distributor) Trace(f trace.Filter) TraceReport {
	rep := TraceReport{Points: []trace.Point{}}
	if s := d.snap.Load(); s != nil && s.trace != nil {
		rep.Enabled, rep.LD = true, s.trace.ld
	}
	var pts []trace.Point
	var buf []trace.Entry
	for _, w := range d.workers {
		r := w.tr.ring.Load()
		if r == nil {
			continue
		}
		buf = r.Read(buf[:0], 0)
		for i := range buf {
			pts = append(pts, trace.PointOf(&buf[i], w.id, &traceNames))
		}
	}
	if pts != nil {
		rep.Points = trace.Select(pts, f)
	}
	return rep
}

var (
	descTracePoints = prometheus.NewDesc("tiergate_l4_trace_points_total",
		"Trace points: marked probe packets (Config.Trace) this LD forwarded or answered, by LD ID and direction.",
		[]string{"ld", "direction"}, nil)
	descTraceDrops = prometheus.NewDesc("tiergate_l4_trace_drops_total",
		"Drop points: marked probe packets (Config.Trace) this LD dropped, by reason.",
		[]string{"reason"}, nil)
	descTraceSuppressed = prometheus.NewDesc("tiergate_l4_trace_suppressed_total",
		"Marked probe packets counted but not recorded, past the workers' record rate (Config.Trace.Rate).",
		nil, nil)
)

func describeTrace(ch chan<- *prometheus.Desc) {
	ch <- descTracePoints
	ch <- descTraceDrops
	ch <- descTraceSuppressed
}

// collectTrace reports the trace counters, while tracing is on or once a point was
// recorded.
func (c *collector) collectTrace(ch chan<- prometheus.Metric) {
	ld := ""
	on := false
	if s := c.d.snap.Load(); s != nil && s.trace != nil {
		ld, on = s.trace.ld, true
	}
	for dd := range numDirs {
		var n uint64
		for _, w := range c.d.workers {
			n += w.tr.points[dd].Load()
		}
		if n > 0 || on && dd != dirLocal {
			ch <- prometheus.MustNewConstMetric(descTracePoints, prometheus.CounterValue, float64(n), ld, dirNames[dd])
		}
	}
	for r := range numResults {
		var n uint64
		for _, w := range c.d.workers {
			n += w.tr.drops[r].Load()
		}
		if n > 0 {
			ch <- prometheus.MustNewConstMetric(descTraceDrops, prometheus.CounterValue, float64(n), resultNames[r])
		}
	}
	var supp uint64
	for _, w := range c.d.workers {
		supp += w.tr.suppressed.Load()
	}
	if on || supp > 0 {
		ch <- prometheus.MustNewConstMetric(descTraceSuppressed, prometheus.CounterValue, float64(supp))
	}
}
