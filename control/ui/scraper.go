package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/promtext"
)

// Defaults of ScraperConfig.
const (
	DefaultInterval   = 2 * time.Second
	DefaultHistory    = 16 * time.Minute
	DefaultRateWindow = 10 * time.Second
	// MaxTargets bounds the nodes scraped; more are left out and logged.
	MaxTargets = 2000
	// MaxSeriesPerNode bounds the sums kept per node and round.
	MaxSeriesPerNode = 4096
	// scrapeParallel bounds the scrapes in flight.
	scrapeParallel = 16
)

// NodeInfo is a node known to the store.
type NodeInfo struct {
	Node    string
	Role    string
	Address string
	// Metrics is where its metrics are (its status's metrics: host:port of its
	// admin endpoint, or a URL); when empty, Address is scraped.
	Metrics string
	// Lost says the node has a seen record and no status: it stopped reporting.
	Lost bool
}

// ScraperConfig configures a Scraper.
type ScraperConfig struct {
	// Nodes returns the nodes to scrape (StoreNodes reads them from the store).
	// Required.
	Nodes func(ctx context.Context) ([]NodeInfo, error)
	// Interval is the time between scrapes of every node. Default DefaultInterval (2s).
	Interval time.Duration
	// History is how far back the rounds are kept. Default DefaultHistory (16m).
	History time.Duration
	// RateWindow is the span each rate is taken over. Default DefaultRateWindow (10s).
	RateWindow time.Duration
	// Timeout bounds each scrape. Default the Interval, at most 5s.
	Timeout time.Duration
	// Client scrapes. Default a client with no proxy.
	Client *http.Client
	// Logger logs scrape failures once per change. Default slog.Default().
	Logger *slog.Logger
}

// Scraper gathers the panels' figures by scraping the nodes itself, keeping
// History of them in memory. It is a Source.
type Scraper struct {
	cfg     ScraperConfig
	now     func() time.Time // time.Now; a test's clock
	queries []*Query
	byName  map[string][]int // sample name -> indexes into queries

	mu      sync.Mutex
	rounds  []*round
	targets map[string]*Target
	certs   map[string][]Cert // by node, from its last good scrape
	// cached is the last dashboard answered, for the same round and window:
	// every viewer's refresh between two rounds gets it without evaluating again.
	cached       *Dashboard
	cachedRound  *round
	cachedWindow time.Duration
}

// round is one scrape of every node at one time.
type round struct {
	t time.Time
	// nodes holds, for each node scraped, one map per query: the sums by group
	// (label values joined; a histogram's le last).
	nodes map[string][]map[string]float64
}

// NewScraper returns a Scraper; Run gathers.
func NewScraper(cfg ScraperConfig) *Scraper {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.History <= 0 {
		cfg.History = DefaultHistory
	}
	if cfg.RateWindow <= 0 {
		cfg.RateWindow = DefaultRateWindow
	}
	if cfg.RateWindow < cfg.Interval {
		cfg.RateWindow = cfg.Interval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = min(cfg.Interval, 5*time.Second)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Scraper{cfg: cfg, now: time.Now, byName: map[string][]int{}, targets: map[string]*Target{}, certs: map[string][]Cert{}}
	for pi := range Panels {
		for qi := range Panels[pi].Queries {
			q := &Panels[pi].Queries[qi]
			s.byName[q.sampleName()] = append(s.byName[q.sampleName()], len(s.queries))
			s.queries = append(s.queries, q)
		}
	}
	return s
}

// maxRounds is how many rounds History holds.
func (s *Scraper) maxRounds() int { return int(s.cfg.History/s.cfg.Interval) + 1 }

// Run scrapes every Interval until ctx is done.
func (s *Scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round scrapes every node once and keeps the round.
func (s *Scraper) Round(ctx context.Context) {
	now := s.now()
	nodes, err := s.cfg.Nodes(ctx)
	if err != nil {
		s.cfg.Logger.Warn("ui: reading the nodes to scrape", "err", err)
		return
	}
	if len(nodes) > MaxTargets {
		s.cfg.Logger.Warn("ui: too many nodes to scrape; the first are", "nodes", len(nodes), "scraped", MaxTargets)
		nodes = nodes[:MaxTargets]
	}
	r := &round{t: now, nodes: map[string][]map[string]float64{}}
	type result struct {
		n     NodeInfo
		url   string
		sums  []map[string]float64
		certs []Cert
		err   error
	}
	results := make([]result, len(nodes))
	sem := make(chan struct{}, scrapeParallel)
	var wg sync.WaitGroup
	for i, n := range nodes {
		results[i].n = n
		if n.Lost || n.metricsAt() == "" {
			continue
		}
		results[i].url = metricsURL(n.metricsAt())
		wg.Add(1)
		sem <- struct{}{}
		go func(res *result) {
			defer func() { <-sem; wg.Done() }()
			sctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
			defer cancel()
			ss, err := promtext.Get(sctx, s.cfg.Client, res.url)
			if err != nil {
				res.err = err
				return
			}
			res.sums, res.certs = s.sum(res.n.Node, ss, now)
		}(&results[i])
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // stopping: the scrapes cut short say nothing of the nodes
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for _, res := range results {
		n := res.n
		seen[n.Node] = true
		tg := s.targets[n.Node]
		if tg == nil {
			tg = &Target{Node: n.Node}
			s.targets[n.Node] = tg
		}
		tg.Role, tg.URL, tg.Lost = n.Role, res.url, n.Lost
		was := tg.Error
		switch {
		case n.Lost:
			tg.Up, tg.Error = false, "lost: the node no longer reports to the store"
			delete(s.certs, n.Node)
		case n.metricsAt() == "":
			tg.Up, tg.Error = false, "the node reports no metrics address (its admin endpoint is off)"
		case res.err != nil:
			tg.Up, tg.Error = false, res.err.Error()
		default:
			tg.Up, tg.Error, tg.LastSeen = true, "", now
			r.nodes[n.Node] = res.sums
			s.certs[n.Node] = res.certs
		}
		if tg.Error != was && tg.Error != "" {
			s.cfg.Logger.Info("ui: a node is not scraped", "node", n.Node, "reason", tg.Error)
		}
	}
	for name := range s.targets {
		if !seen[name] {
			delete(s.targets, name)
			delete(s.certs, name)
		}
	}
	if len(s.rounds) >= s.maxRounds() {
		n := copy(s.rounds, s.rounds[len(s.rounds)-s.maxRounds()+1:])
		clear(s.rounds[n:])
		s.rounds = s.rounds[:n]
	}
	s.rounds = append(s.rounds, r)
}

// metricsAt is where n's metrics are: Metrics, or else Address.
func (n *NodeInfo) metricsAt() string {
	if n.Metrics != "" {
		return n.Metrics
	}
	return n.Address
}

// metricsURL is the /metrics URL of a node's admin address; an address without
// a host (":9100", "0.0.0.0:9100") is taken as this machine's loopback. A URL
// (http:// or https://) is taken as it is.
func metricsURL(addr string) string {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/metrics"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}

// sum keeps of a scrape the sums the queries need, and the certificates.
func (s *Scraper) sum(node string, ss promtext.Samples, now time.Time) ([]map[string]float64, []Cert) {
	sums := make([]map[string]float64, len(s.queries))
	var certs []Cert
	kept := 0
	for _, smp := range ss {
		if smp.Name == CertMetric {
			exp := time.Unix(int64(smp.Value), 0).UTC()
			certs = append(certs, Cert{Name: smp.Labels["name"], Subject: smp.Labels["subject"], Node: node,
				Expires: exp, DaysLeft: math.Round(exp.Sub(now).Hours()/24*10) / 10})
			continue
		}
		for _, qi := range s.byName[smp.Name] {
			q := s.queries[qi]
			if !q.matches(smp.Labels) {
				continue
			}
			vals := make([]string, 0, len(q.By)+1)
			for _, l := range q.By {
				if l != NodeLabel {
					vals = append(vals, smp.Labels[l])
				}
			}
			if q.Kind == KindQuantile {
				vals = append(vals, smp.Labels["le"])
			}
			if sums[qi] == nil {
				sums[qi] = map[string]float64{}
			}
			k := groupKey(vals)
			if _, ok := sums[qi][k]; !ok {
				if kept >= MaxSeriesPerNode {
					continue
				}
				kept++
			}
			if q.Kind == KindGauge && q.Agg == "max" {
				if v, ok := sums[qi][k]; !ok || smp.Value > v {
					sums[qi][k] = smp.Value
				}
				continue
			}
			sums[qi][k] += smp.Value
		}
	}
	return sums, certs
}

// Dashboard evaluates the panels over the rounds within window.
func (s *Scraper) Dashboard(_ context.Context, window time.Duration) (*Dashboard, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last *round
	if len(s.rounds) > 0 {
		last = s.rounds[len(s.rounds)-1]
	}
	if s.cached != nil && s.cachedRound == last && s.cachedWindow == window {
		return s.cached, nil
	}
	d := s.dashboard(window)
	d.trim()
	s.cached, s.cachedRound, s.cachedWindow = d, last, window
	return d, nil
}

// dashboard evaluates the panels over the rounds within window; s.mu is held.
func (s *Scraper) dashboard(window time.Duration) *Dashboard {
	d := &Dashboard{Source: "scrape", IntervalSeconds: s.cfg.Interval.Seconds(), Times: []float64{}, Targets: []Target{}, Certificates: []Cert{}}
	first := len(s.rounds)
	if len(s.rounds) > 0 {
		from := s.rounds[len(s.rounds)-1].t.Add(-window)
		first = len(s.rounds) - 1
		for first > 0 && !s.rounds[first-1].t.Before(from) {
			first--
		}
	}
	for _, r := range s.rounds[first:] {
		d.Times = append(d.Times, float64(r.t.UnixMilli())/1000)
	}
	qi := 0
	for _, p := range Panels {
		pd := PanelData{Panel: p, Series: []Series{}}
		for i := range p.Queries {
			prefix := ""
			if i < len(p.Names) {
				prefix = p.Names[i]
			}
			pd.Series = append(pd.Series, s.eval(qi, prefix, first)...)
			qi++
		}
		d.Panels = append(d.Panels, pd)
	}
	for _, name := range sortedKeys(s.targets) {
		d.Targets = append(d.Targets, *s.targets[name])
	}
	for _, name := range sortedKeys(s.certs) {
		d.Certificates = append(d.Certificates, s.certs[name]...)
	}
	slices.SortStableFunc(d.Certificates, func(a, b Cert) int { return a.Expires.Compare(b.Expires) })
	return d
}

// eval returns query qi's series over the rounds from first on.
func (s *Scraper) eval(qi int, prefix string, first int) []Series {
	q := s.queries[qi]
	n := len(s.rounds) - first
	nodeAt := slices.Index(q.By, NodeLabel)
	byOut := make(map[string][]*float64)
	labelsOf := map[string][]string{}
	// full builds a group's label values with the node's name in its place.
	full := func(node string, vals []string) string {
		if nodeAt < 0 {
			return groupKey(vals)
		}
		return groupKey(slices.Insert(slices.Clone(vals), nodeAt, node))
	}
	set := func(key string, i int, v float64, agg string) {
		vs := byOut[key]
		if vs == nil {
			vs = make([]*float64, n)
			byOut[key] = vs
			labelsOf[key] = splitKey(key, len(q.By))
		}
		switch {
		case vs[i] == nil:
			vs[i] = ptr(v)
		case agg == "max":
			*vs[i] = max(*vs[i], v)
		case agg == "min":
			*vs[i] = min(*vs[i], v)
		default:
			*vs[i] += v
		}
	}
	back := int(math.Ceil(float64(s.cfg.RateWindow) / float64(s.cfg.Interval)))
	nBy := len(q.By)
	if nodeAt >= 0 {
		nBy--
	}
	for i := first; i < len(s.rounds); i++ {
		cur := s.rounds[i]
		hist := map[string]map[float64]float64{} // quantile: group -> le -> rate
		for node, sums := range cur.nodes {
			m := sums[qi]
			if q.Kind == KindGauge {
				for k, v := range m {
					set(full(node, splitKey(k, nBy)), i-first, v, q.Agg)
				}
				continue
			}
			var prev *round
			for k := max(0, i-back); k < i; k++ {
				if _, ok := s.rounds[k].nodes[node]; ok {
					prev = s.rounds[k]
					break
				}
			}
			if prev == nil {
				continue
			}
			dt := cur.t.Sub(prev.t).Seconds()
			if dt <= 0 {
				continue
			}
			pm := prev.nodes[node][qi]
			for k, v := range m {
				d := v - pm[k]
				if d < 0 { // a reset: the counter started again from 0
					d = v
				}
				rate := d / dt
				if q.Kind == KindRate {
					set(full(node, splitKey(k, nBy)), i-first, rate, "sum")
					continue
				}
				parts := splitKey(k, nBy+1)
				le, err := strconv.ParseFloat(parts[nBy], 64)
				if err != nil {
					continue
				}
				g := full(node, parts[:nBy])
				if hist[g] == nil {
					hist[g] = map[float64]float64{}
				}
				hist[g][le] += rate
			}
		}
		for g, bs := range hist {
			buckets := make([]bucket, 0, len(bs))
			for le, c := range bs {
				buckets = append(buckets, bucket{le: le, count: c})
			}
			if v := quantile(q.Quantile, buckets); !math.IsNaN(v) {
				set(g, i-first, v, "sum")
			} else if byOut[g] == nil {
				byOut[g] = make([]*float64, n)
				labelsOf[g] = splitKey(g, len(q.By))
			}
		}
	}
	out := make([]Series, 0, len(byOut))
	for _, key := range sortedKeys(byOut) {
		vals := labelsOf[key]
		labels := map[string]string{}
		for i, l := range q.By {
			if i < len(vals) {
				labels[l] = vals[i]
			}
		}
		out = append(out, Series{Name: seriesName(prefix, q.By, vals), Labels: labels, Values: byOut[key]})
	}
	return out
}

// StoreNodes returns the Nodes function of a ScraperConfig reading st: every
// node with a status (reporting) or a seen record only (lost), the keyservers
// that report no metrics address left out (the address they report is their
// service's, not a metrics endpoint's).
func StoreNodes(st *store.Store) func(ctx context.Context) ([]NodeInfo, error) {
	return func(ctx context.Context) ([]NodeInfo, error) {
		resp, err := st.Client().Txn(ctx).Then(
			clientv3.OpGet(agent.StatusPrefix, clientv3.WithPrefix(), clientv3.WithLimit(MaxTargets+1)),
			clientv3.OpGet(agent.SeenPrefix, clientv3.WithPrefix(), clientv3.WithLimit(MaxTargets+1)),
		).Commit()
		if err != nil {
			return nil, fmt.Errorf("reading the nodes' statuses: %w", err)
		}
		byName := map[string]NodeInfo{}
		for i, prefix := range []string{agent.StatusPrefix, agent.SeenPrefix} {
			for _, kv := range resp.Responses[i].GetResponseRange().GetKvs() {
				name := strings.TrimPrefix(string(kv.Key), prefix)
				if _, ok := byName[name]; ok {
					continue
				}
				var stt agent.Status
				if json.Unmarshal(kv.Value, &stt) != nil || (stt.Role == "keyserverd" && stt.Metrics == "") {
					continue
				}
				byName[name] = NodeInfo{Node: name, Role: stt.Role, Address: stt.Address, Metrics: stt.Metrics, Lost: i == 1}
			}
		}
		out := make([]NodeInfo, 0, len(byName))
		for _, name := range sortedKeys(byName) {
			out = append(out, byName[name])
		}
		return out, nil
	}
}
