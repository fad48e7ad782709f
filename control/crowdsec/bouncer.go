package crowdsec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Defaults of Config.
const (
	DefaultList         = "crowdsec"
	DefaultPollInterval = 10 * time.Second
	DefaultResync       = time.Minute
	DefaultTimeout      = 30 * time.Second
)

// Config is a bouncer's settings: controld's crowdsec section.
type Config struct {
	// LAPIURL is the Local API's base URL, http://127.0.0.1:8080 as CrowdSec
	// listens by default (https with CAFile or the system's roots). Required.
	LAPIURL string `yaml:"lapi_url" json:"lapi_url"`
	// APIKeyFile holds the bouncer's API key, the line `cscli bouncers add
	// tiergate` prints. Required. The Local API remembers each key's last pull
	// and sends the next changes once: several controld need a key each
	// (tiergate-<host>), each then writing the same changes, which is harmless.
	APIKeyFile string `yaml:"api_key_file" json:"api_key_file"`
	// CAFile is the CA the Local API's certificate chains to, for an https
	// LAPIURL. Default the system's roots.
	CAFile string `yaml:"ca_file,omitempty" json:"ca_file,omitempty"`
	// List is the name of the blacklist kept in step with the decisions.
	// Default "crowdsec".
	List string `yaml:"list,omitempty" json:"list,omitempty"`
	// PollInterval is the time between two pulls of the decision stream.
	// Default 10s.
	PollInterval config.Duration `yaml:"poll_interval,omitempty" json:"poll_interval,omitempty"`
	// ResyncInterval is how often a pull asks for every active decision
	// (startup=true) instead of the changes, and writes the difference from the
	// list as one delta (none when there is none): the Local API's stream only
	// reports the longest decision on an address, so a shorter one left when the
	// longer is deleted, or a change missed, is caught within this time. CrowdSec
	// 1.4's Local API (Debian 12's) misses changes: it answers the decisions
	// created since the bouncer's last pull, and records the pull's end, not its
	// query, as that pull, so a decision written while a pull runs is never sent
	// (one in a few hundred added, at a pull every 200ms). Default 1m.
	ResyncInterval config.Duration `yaml:"resync_interval,omitempty" json:"resync_interval,omitempty"`
	// Timeout bounds one pull, the answer's body included. Default 30s.
	Timeout config.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// MaxAnswerBytes bounds one answer's body. Default DefaultMaxAnswerBytes
	// (128 MiB).
	MaxAnswerBytes int64 `yaml:"max_answer_bytes,omitempty" json:"max_answer_bytes,omitempty"`
	// Types are the decision types enforced; the others (captcha, …) are
	// skipped and counted. Default [ban].
	Types []string `yaml:"types,omitempty" json:"types,omitempty"`
	// Origins, when given, are the only decision origins taken (crowdsec, cscli,
	// CAPI, lists, …); asked of the Local API and checked again here. Default any.
	Origins []string `yaml:"origins,omitempty" json:"origins,omitempty"`
	// ScenariosContaining, when given, takes only the decisions whose scenario
	// contains one of these strings. Default any.
	ScenariosContaining []string `yaml:"scenarios_containing,omitempty" json:"scenarios_containing,omitempty"`
	// ScenariosNotContaining leaves out the decisions whose scenario contains
	// one of these strings. Default none.
	ScenariosNotContaining []string `yaml:"scenarios_not_containing,omitempty" json:"scenarios_not_containing,omitempty"`
}

// Defaults fills in the default of every field left zero.
func (c *Config) Defaults() {
	if c.List == "" {
		c.List = DefaultList
	}
	if c.PollInterval == 0 {
		c.PollInterval = config.Duration(DefaultPollInterval)
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = config.Duration(DefaultResync)
	}
	if c.Timeout == 0 {
		c.Timeout = config.Duration(DefaultTimeout)
	}
	if c.MaxAnswerBytes == 0 {
		c.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if len(c.Types) == 0 {
		c.Types = []string{"ban"}
	}
}

// Validate checks c (after Defaults); field paths are the YAML names.
func (c *Config) Validate() error {
	var ck config.Checker
	if c.LAPIURL == "" {
		ck.Addf("lapi_url", "required (the Local API's URL, http://127.0.0.1:8080 by default)")
	} else if u, err := url.Parse(c.LAPIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		ck.Addf("lapi_url", "%q is not an http or https URL", c.LAPIURL)
	}
	if c.APIKeyFile == "" {
		ck.Addf("api_key_file", "required (a file holding the key `cscli bouncers add tiergate` prints)")
	}
	if err := blsync.CheckName(c.List); err != nil {
		ck.Add("list", err)
	}
	if c.PollInterval < config.Duration(100*time.Millisecond) {
		ck.Addf("poll_interval", "%s: at least 100ms", c.PollInterval)
	}
	if c.ResyncInterval < config.Duration(time.Second) {
		ck.Addf("resync_interval", "%s: at least 1s", c.ResyncInterval)
	}
	if c.Timeout <= 0 {
		ck.Addf("timeout", "must be positive")
	}
	if c.MaxAnswerBytes < 1024 {
		ck.Addf("max_answer_bytes", "%d: at least 1024", c.MaxAnswerBytes)
	}
	for i, t := range c.Types {
		if strings.TrimSpace(t) == "" {
			ck.Addf(config.Index("types", i), "empty")
		}
	}
	return ck.Err()
}

func (c *Config) filter() *Filter {
	return &Filter{Types: c.Types, Origins: c.Origins, ScenariosContaining: c.ScenariosContaining, ScenariosNotContaining: c.ScenariosNotContaining}
}

// A Sink takes the list's writes: controld's blacklist writer (control/blsync).
// Each returns the list's version after the write.
type Sink interface {
	// Replace makes the list s.
	Replace(ctx context.Context, list string, s *blacklist.Set, who string) (int64, error)
	// Delta changes the list by d (removals, then additions).
	Delta(ctx context.Context, list string, d *blacklist.Delta, who string) (int64, error)
}

// A ReasonSink is a Sink that also records why each addition is made
// (blsync.Writer): the bouncer gives the scenario of each.
type ReasonSink interface {
	DeltaMeta(ctx context.Context, list string, d *blacklist.Delta, meta blsync.Meta) (int64, error)
}

// held is one decision holding a prefix.
type held struct {
	end      time.Time // zero: never
	scenario string
}

// Who is the writer the bouncer's writes are recorded as.
const Who = "crowdsec"

// A Bouncer keeps a named list in step with the decisions of CrowdSec's Local
// API: a first pull with startup=true makes the whole list (one Replace), each
// later pull its changes (one Delta, none when nothing changed). After any
// failure, of the pull or the write, the next pull starts over with
// startup=true, so the list never misses a change the Local API has since
// forgotten to send.
//
// It remembers each listed prefix's decisions (by ID, with their ends), so a
// deletion removes a prefix only when no other decision holds it, and a prefix
// whose end moves earlier is removed and added again.
type Bouncer struct {
	cfg    Config
	filter *Filter
	key    string
	base   *url.URL
	client *http.Client
	sink   Sink
	log    *slog.Logger

	synced bool
	fullAt time.Time                       // the answer time of the last pull of every decision
	active map[netip.Prefix]map[int64]held // prefix → decision ID → its end and scenario
	ranges map[netip.Prefix]struct{}       // the active prefixes wider than one address

	mu    sync.Mutex
	stats Stats
}

// Stats is what a bouncer has done.
type Stats struct {
	// Polls and Errors count the pulls and those that failed (pull or write).
	Polls, Errors uint64
	// Writes counts the list's writes (replaces and deltas).
	Writes uint64
	// Version is the list's version after the last write.
	Version int64
	// Listed is how many prefixes the decisions list now.
	Listed int
	// Skipped counts the decisions left out, by reason (SkipScope, SkipType, …).
	Skipped map[string]uint64
	// LastError is the last failure's text, empty after a pull that succeeded.
	LastError string
}

// New returns a bouncer of cfg writing to sink, logging to log (nil: discarded).
// It reads the API key file.
func New(cfg Config, sink Sink, log *slog.Logger) (*Bouncer, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	raw, err := os.ReadFile(cfg.APIKeyFile)
	if err != nil {
		return nil, fmt.Errorf("crowdsec: reading the API key (api_key_file): %w", err)
	}
	key := strings.TrimSpace(string(raw))
	if key == "" || strings.ContainsAny(key, "\r\n\t ") {
		return nil, fmt.Errorf("crowdsec: api_key_file %s: not one key on one line", cfg.APIKeyFile)
	}
	base, _ := url.Parse(strings.TrimRight(cfg.LAPIURL, "/"))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("crowdsec: ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("crowdsec: ca_file %s: no PEM certificate", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Bouncer{
		cfg:    cfg,
		filter: cfg.filter(),
		key:    key,
		base:   base,
		client: &http.Client{Transport: tr, Timeout: cfg.Timeout.D()},
		sink:   sink,
		log:    log.With("list", cfg.List, "lapi", base.Redacted()),
		stats:  Stats{Skipped: map[string]uint64{}},
	}, nil
}

// List is the name of the list the bouncer keeps.
func (b *Bouncer) List() string { return b.cfg.List }

// Stats returns a copy of what the bouncer has done.
func (b *Bouncer) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stats
	s.Skipped = make(map[string]uint64, len(b.stats.Skipped))
	for k, v := range b.stats.Skipped {
		s.Skipped[k] = v
	}
	return s
}

// Run pulls every PollInterval until ctx is done, then returns nil. A failed
// pull is logged and tried again after a backoff of 1s doubling up to the poll
// interval (at least 30s), starting over with startup=true.
func (b *Bouncer) Run(ctx context.Context) error {
	backoff := time.Second
	for {
		wait := b.cfg.PollInterval.D()
		if err := b.Poll(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			b.log.Warn("crowdsec: pulling decisions failed; starting over", "err", err, "retry_in", backoff)
			wait = backoff
			backoff = min(2*backoff, max(b.cfg.PollInterval.D(), 30*time.Second))
		} else {
			backoff = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Poll pulls the decision stream once and writes the list's change: the whole
// list on the first pull (and after a failure), the difference from every active
// decision once ResyncInterval has passed since the last such pull, the changes
// since the last pull otherwise.
func (b *Bouncer) Poll(ctx context.Context) error {
	mode := pullChanges
	switch {
	case !b.synced:
		mode = pullReplace
	case time.Since(b.fullAt) >= b.cfg.ResyncInterval.D():
		mode = pullResync
	}
	return b.record(b.poll(ctx, mode))
}

// Resync pulls every active decision now and writes the difference from the
// list as one delta (none when there is none); the whole list when the bouncer
// has not made it yet.
func (b *Bouncer) Resync(ctx context.Context) error {
	mode := pullResync
	if !b.synced {
		mode = pullReplace
	}
	return b.record(b.poll(ctx, mode))
}

// record counts a pull and its outcome.
func (b *Bouncer) record(err error) error {
	b.mu.Lock()
	b.stats.Polls++
	if err != nil {
		b.stats.Errors++
		b.stats.LastError = err.Error()
	} else {
		b.stats.LastError = ""
	}
	b.stats.Listed = len(b.active)
	b.mu.Unlock()
	if err != nil {
		b.synced = false
	}
	return err
}

// What a pull asks for and writes.
type pull int

const (
	pullReplace pull = iota // every active decision, written as the whole list
	pullResync              // every active decision, written as the difference
	pullChanges             // the changes since the last pull, written as a delta
)

func (b *Bouncer) poll(ctx context.Context, mode pull) error {
	s, at, err := b.fetch(ctx, mode != pullChanges)
	if err != nil {
		return err
	}
	skipped := Skipped{}
	var d *blacklist.Delta
	var reasons []string
	switch mode {
	case pullReplace:
		b.active = map[netip.Prefix]map[int64]held{}
		b.ranges = map[netip.Prefix]struct{}{}
		for i := range s.New {
			b.add(&s.New[i], at, skipped, nil)
		}
		var bl blacklist.Builder
		for p, ids := range b.active {
			e, _ := end(ids)
			bl.Add(p, e)
		}
		set := bl.BuildAt(at)
		v, err := b.sink.Replace(ctx, b.cfg.List, set, Who)
		if err != nil {
			return fmt.Errorf("crowdsec: replacing list %s with %d entries: %w", b.cfg.List, set.Len(), err)
		}
		b.wrote(v, skipped)
		b.synced, b.fullAt = true, at
		b.log.Info("crowdsec: list made from the active decisions", "entries", len(b.active), "version", v, "skipped", skipped.Total())
		return nil
	case pullResync:
		d, reasons = b.resync(s, at)
		b.fullAt = at
		skipped = nil // counted when they came
	default:
		d, reasons = b.change(s, at, skipped)
	}
	if len(d.Add) == 0 && len(d.Remove) == 0 {
		b.count(skipped)
		return nil
	}
	if rs, ok := b.sink.(ReasonSink); ok {
		v, err := rs.DeltaMeta(ctx, b.cfg.List, d, blsync.Meta{Who: Who, Reasons: reasons})
		if err != nil {
			return fmt.Errorf("crowdsec: changing list %s (%d added, %d removed): %w", b.cfg.List, len(d.Add), len(d.Remove), err)
		}
		b.wrote(v, skipped)
	} else {
		v, err := b.sink.Delta(ctx, b.cfg.List, d, Who)
		if err != nil {
			return fmt.Errorf("crowdsec: changing list %s (%d added, %d removed): %w", b.cfg.List, len(d.Add), len(d.Remove), err)
		}
		b.wrote(v, skipped)
	}
	if mode == pullResync {
		b.log.Info("crowdsec: a pull of every decision found the list behind; changed", "added", len(d.Add), "removed", len(d.Remove))
	}
	return nil
}

func (b *Bouncer) wrote(v int64, skipped Skipped) {
	b.mu.Lock()
	b.stats.Writes++
	b.stats.Version = v
	b.mu.Unlock()
	b.count(skipped)
}

func (b *Bouncer) count(skipped Skipped) {
	if len(skipped) == 0 {
		return
	}
	b.mu.Lock()
	for k, v := range skipped {
		b.stats.Skipped[k] += uint64(v)
	}
	b.mu.Unlock()
}

// end is when a prefix's decisions end: the latest, zero (never) if any never
// ends; and the scenario of the decision ending last.
func end(ids map[int64]held) (time.Time, string) {
	var last held
	first := true
	for _, h := range ids {
		if first || !earlier(h.end, last.end) && (!h.end.Equal(last.end) || h.scenario < last.scenario) {
			last, first = h, false
		}
	}
	return last.end, last.scenario
}

// endSlack is how far apart two ends of one decision may be and still be the
// same: the Local API gives durations from its clock at the answer, the bouncer
// counts them from its own at the answer's arrival, and the lists keep seconds.
const endSlack = 2 * time.Second

// sameEnd reports whether ends a and b (zero: never) are within endSlack.
func sameEnd(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() == b.IsZero()
	}
	d := a.Sub(b)
	return d <= endSlack && d >= -endSlack
}

// earlier reports whether end a comes before end b (zero: never).
func earlier(a, b time.Time) bool {
	switch {
	case b.IsZero():
		return !a.IsZero()
	case a.IsZero():
		return false
	}
	return a.Before(b)
}

// add records the new decision d if the filter takes it, and its prefix in
// touched (with the prefix's end before, the first time).
func (b *Bouncer) add(d *Decision, at time.Time, skipped Skipped, touched map[netip.Prefix]before) {
	if why := b.filter.takes(d); why != "" {
		skipped[why]++
		return
	}
	p, exp, err := d.Target(at)
	if err != nil {
		skipped[err.Error()]++
		return
	}
	if !exp.IsZero() && !exp.After(at) {
		skipped[SkipExpired]++
		return
	}
	ids := b.active[p]
	if touched != nil {
		if _, ok := touched[p]; !ok {
			e, _ := end(ids)
			touched[p] = before{listed: ids != nil, end: e}
		}
	}
	if ids == nil {
		ids = map[int64]held{}
		b.active[p] = ids
		if p.Bits() < p.Addr().BitLen() {
			b.ranges[p] = struct{}{}
		}
	}
	ids[d.ID] = held{end: exp, scenario: d.Scenario}
}

type before struct {
	listed bool
	end    time.Time
}

// change applies a stream's deletions, then its additions, to the bouncer's
// decisions, and returns the list's change (deltaOf).
func (b *Bouncer) change(s *Stream, at time.Time, skipped Skipped) (*blacklist.Delta, []string) {
	touched := map[netip.Prefix]before{}
	for i := range s.Deleted {
		d := &s.Deleted[i]
		p, _, err := d.Target(at)
		if err != nil && err != errDuration {
			skipped[err.Error()]++
			continue
		}
		ids := b.active[p]
		if ids == nil {
			continue
		}
		if _, ok := ids[d.ID]; !ok {
			continue
		}
		if _, ok := touched[p]; !ok {
			e, _ := end(ids)
			touched[p] = before{listed: true, end: e}
		}
		delete(ids, d.ID)
		if len(ids) == 0 {
			delete(b.active, p)
			delete(b.ranges, p)
		}
	}
	for i := range s.New {
		b.add(&s.New[i], at, skipped, touched)
	}
	return b.deltaOf(touched, at)
}

// resync makes every active decision in s the bouncer's, and returns the
// list's change from what it held before.
func (b *Bouncer) resync(s *Stream, at time.Time) (*blacklist.Delta, []string) {
	old := b.active
	b.active = map[netip.Prefix]map[int64]held{}
	b.ranges = map[netip.Prefix]struct{}{}
	for i := range s.New {
		b.add(&s.New[i], at, Skipped{}, nil)
	}
	touched := map[netip.Prefix]before{}
	for p, ids := range old {
		was, _ := end(ids)
		if now := b.active[p]; now == nil {
			touched[p] = before{listed: true, end: was}
		} else if e, _ := end(now); !sameEnd(e, was) {
			touched[p] = before{listed: true, end: was}
		}
	}
	for p := range b.active {
		if old[p] == nil {
			touched[p] = before{}
		}
	}
	return b.deltaOf(touched, at)
}

// deltaOf returns the list's change for the prefixes touched, as they were
// before: the prefixes to remove (those no longer listed, or whose end moved
// earlier) and to add (those new or changed, and every listed prefix
// overlapping one removed, since a removal takes out every address it covers),
// with the additions' scenarios.
func (b *Bouncer) deltaOf(touched map[netip.Prefix]before, at time.Time) (*blacklist.Delta, []string) {
	delta := &blacklist.Delta{}
	readd := map[netip.Prefix]bool{}
	for p, was := range touched {
		ids := b.active[p]
		now, _ := end(ids)
		switch {
		case ids == nil:
			// Gone: remove it, unless it has already ended in the list.
			if was.listed && (was.end.IsZero() || was.end.After(at)) {
				delta.Remove = append(delta.Remove, p)
			}
		case was.listed && !now.IsZero() && earlier(now.Add(endSlack), was.end):
			delta.Remove = append(delta.Remove, p)
			readd[p] = true
		default:
			readd[p] = true
		}
	}
	for _, r := range delta.Remove {
		if r.Bits() == r.Addr().BitLen() {
			for q := range b.ranges {
				if q.Overlaps(r) {
					readd[q] = true
				}
			}
			continue
		}
		for q := range b.active {
			if q.Overlaps(r) {
				readd[q] = true
			}
		}
	}
	var reasons []string
	for p := range readd {
		if ids := b.active[p]; ids != nil {
			e, why := end(ids)
			delta.Add = append(delta.Add, blacklist.Entry{Prefix: p, Expires: e})
			reasons = append(reasons, why)
		}
	}
	return delta, reasons
}

// fetch pulls the decision stream and returns it with the time of its answer.
func (b *Bouncer) fetch(ctx context.Context, startup bool) (*Stream, time.Time, error) {
	u := *b.base
	u.Path = strings.TrimRight(u.Path, "/") + "/v1/decisions/stream"
	q := url.Values{}
	q.Set("startup", fmt.Sprint(startup))
	if len(b.cfg.Origins) > 0 {
		q.Set("origins", strings.Join(b.cfg.Origins, ","))
	}
	if len(b.cfg.ScenariosContaining) > 0 {
		q.Set("scenarios_containing", strings.Join(b.cfg.ScenariosContaining, ","))
	}
	if len(b.cfg.ScenariosNotContaining) > 0 {
		q.Set("scenarios_not_containing", strings.Join(b.cfg.ScenariosNotContaining, ","))
	}
	u.RawQuery = q.Encode()
	shown := u.Redacted()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("crowdsec: GET %s: %w", shown, err)
	}
	req.Header.Set("X-Api-Key", b.key)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tiergate-controld")
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("crowdsec: GET %s: %w", shown, err)
	}
	defer resp.Body.Close()
	at := time.Now()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		reason := "answered " + snippet(body)
		if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized {
			reason = "the API key was refused (api_key_file must hold a key of `cscli bouncers add`): " + snippet(body)
		}
		return nil, time.Time{}, &AnswerError{URL: shown, Status: resp.StatusCode, Reason: reason}
	}
	s, err := DecodeStream(resp.Body, b.cfg.MaxAnswerBytes)
	if err != nil {
		var ae *AnswerError
		if errors.As(err, &ae) {
			ae.URL = shown
		}
		return nil, time.Time{}, err
	}
	return s, at, nil
}
