package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// scrapeCost is what scraping l7d's /metrics once a second costs it while it
// serves a paced load of TLS 1.3 handshakes (-scrape-cost-rate, -scrape-cost-mode):
// l7d's CPU over windows without and with the scrapes, alternated, and the CPU of
// one scrape measured apart (back-to-back scrapes of an idle l7d, less its idle
// CPU). The windows' difference is within their noise (NoisePct, the spread of the
// windows without scrapes) on a shared machine; the direct figure is not, and is
// the one held to the target.
type scrapeCost struct {
	Server         string  `json:"server"`
	Mode           string  `json:"mode"`
	TargetRate     float64 `json:"target_handshakes_per_s"`
	RateOff        float64 `json:"handshakes_per_s_without"`
	RateOn         float64 `json:"handshakes_per_s_with"`
	CoresOff       float64 `json:"l7d_cores_without_scrapes"`
	CoresOn        float64 `json:"l7d_cores_with_scrapes"`
	AddedPct       float64 `json:"added_pct"` // (with − without) ÷ without, per handshake, from the paced windows
	NoisePct       float64 `json:"noise_pct"` // the spread of the windows without scrapes, per handshake
	ScrapeMs       float64 `json:"l7d_cpu_ms_per_scrape"`
	ScrapeBytes    int     `json:"metrics_bytes"`
	AddedPctDirect float64 `json:"added_pct_direct"` // one scrape a second ÷ l7d's CPU without them
	Pairs          int     `json:"pairs"`
	Scrapes        int     `json:"scrapes"`
	Met            bool    `json:"under_1pct"`
}

// pacer spaces operations interval apart, whichever worker takes the next slot.
type pacer struct {
	mu       sync.Mutex
	next     time.Time
	interval time.Duration
}

func (p *pacer) wait(ctx context.Context) error {
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	at := p.next
	p.next = p.next.Add(p.interval)
	p.mu.Unlock()
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scrapeOnce reads url's whole body and returns its length.
func scrapeOnce(ctx context.Context, hc *http.Client, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	return int(n), err
}

// measureScrapeCost runs the scrape-cost rows on s.
func (b *bench) measureScrapeCost(ctx context.Context, s *server) (*scrapeCost, error) {
	rate := b.o.scrapeRate
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	sc := &scrapeCost{Server: s.label, Mode: b.o.scrapeMode, TargetRate: rate, Pairs: b.o.scrapePairs}

	// One scrape's CPU: back-to-back scrapes of the idle l7d, less its CPU over as
	// long without them.
	const apart = 200
	if err := b.WaitQuiet(ctx, benchkit.SelfCPU, s.clock); err != nil {
		return nil, err
	}
	c0, err := s.clock()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	for range apart {
		if sc.ScrapeBytes, err = scrapeOnce(ctx, hc, s.metricsURL); err != nil {
			return nil, err
		}
	}
	took := time.Since(t0)
	c1, err := s.clock()
	if err != nil {
		return nil, err
	}
	time.Sleep(took)
	c2, err := s.clock()
	if err != nil {
		return nil, err
	}
	sc.ScrapeMs = round(ms(max((c1-c0)-(c2-c1), 0))/apart, 4)

	var nOff, nOn int
	var offPer []float64 // l7d's CPU per handshake of each window without scrapes
	for i := range 2 * b.o.scrapePairs {
		on := i%2 == 1
		label := fmt.Sprintf("%s, TLS 1.3 %s at %.0f/s, scrapes each 1s %v", s.label, b.o.scrapeMode, rate, on)
		if err := b.WaitQuiet(ctx, benchkit.SelfCPU, s.clock); err != nil {
			return nil, err
		}
		b.Progress("%s: %v warm-up, %v measured", label, b.o.warmup, b.o.duration)
		cl := newClient(s.addr, tls.VersionTLS13, b.o.scrapeMode == modeResumed, b.o.workers, b.o.opTimeout, b.o.verifyEvery, b.f.siteCA.Pool())
		p := &pacer{interval: time.Duration(float64(time.Second) / rate)}
		sctx, stopScrapes := context.WithCancel(ctx)
		var scrapes int
		var scrapeErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			if !on {
				return
			}
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-sctx.Done():
					return
				case <-tick.C:
				}
				if _, err := scrapeOnce(sctx, hc, s.metricsURL); err != nil && sctx.Err() == nil && scrapeErr == nil {
					scrapeErr = err
				}
				scrapes++
			}
		}()
		res, err := benchkit.Run(ctx, benchkit.Load{
			Workers: b.o.workers, Warmup: b.o.warmup, Duration: b.o.duration,
			Op: func(ctx context.Context, w int, seq uint64) error {
				if err := p.wait(ctx); err != nil {
					return err
				}
				return cl.op(ctx, w, seq)
			},
			Clocks: []benchkit.CPUClock{s.clock},
		})
		stopScrapes()
		<-done
		if err != nil {
			return nil, err
		}
		if res.CPUErr != nil {
			return nil, fmt.Errorf("%s: reading l7d's CPU: %w", label, res.CPUErr)
		}
		if res.Errors > 0 {
			return nil, fmt.Errorf("%s: %d errors, the first: %v", label, res.Errors, res.FirstErr)
		}
		if scrapeErr != nil {
			return nil, fmt.Errorf("%s: %w", label, scrapeErr)
		}
		cores := res.CPU[0].Seconds() / res.Elapsed.Seconds()
		b.Progress("  %.0f handshakes/s, l7d %.3f cores, %d scrapes", res.Rate(), cores, scrapes)
		if on {
			sc.CoresOn += cores
			sc.RateOn += res.Rate()
			sc.Scrapes += scrapes
			nOn++
		} else {
			sc.CoresOff += cores
			sc.RateOff += res.Rate()
			if res.Rate() > 0 {
				offPer = append(offPer, cores/res.Rate())
			}
			nOff++
		}
	}
	sc.CoresOff, sc.RateOff = sc.CoresOff/float64(nOff), sc.RateOff/float64(nOff)
	sc.CoresOn, sc.RateOn = sc.CoresOn/float64(nOn), sc.RateOn/float64(nOn)
	// The figures are per handshake, so a rate somewhat short of the target (a
	// shared machine) is shown, not failed; half of it is not the load asked for.
	if sc.RateOff < 0.5*rate || sc.RateOn < 0.5*rate {
		b.Fail("scrape cost: %.0f and %.0f handshakes/s made, not half of %.0f/s: the machine is too busy for the figure", sc.RateOff, sc.RateOn, rate)
	}
	// Per handshake, so that a small difference in the rates made does not count.
	perOff, perOn := sc.CoresOff/sc.RateOff, sc.CoresOn/sc.RateOn
	sc.AddedPct = round(100*(perOn-perOff)/perOff, 2)
	if len(offPer) > 1 {
		lo, hi := offPer[0], offPer[0]
		for _, v := range offPer {
			lo, hi = min(lo, v), max(hi, v)
		}
		sc.NoisePct = round(100*(hi-lo)/perOff, 2)
	}
	sc.AddedPctDirect = round(100*sc.ScrapeMs/1000/sc.CoresOff, 3)
	sc.CoresOff, sc.CoresOn = round(sc.CoresOff, 4), round(sc.CoresOn, 4)
	sc.RateOff, sc.RateOn = round(sc.RateOff, 1), round(sc.RateOn, 1)
	sc.Met = sc.AddedPctDirect < 1
	return sc, nil
}
