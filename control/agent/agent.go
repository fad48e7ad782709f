package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/daemon"
)

// StatusPrefix is the prefix of the nodes' status keys: /tiergate/nodes/v1/<node>.
const StatusPrefix = "/tiergate/nodes/v1/"

// StatusTTL is the TTL of the lease a node's status key is written under: the key
// goes away this long after the agent last kept the lease alive (the client keeps it
// alive every third of it).
const StatusTTL = 10 * time.Second

// DefaultHitsInterval is Config.HitsInterval's default.
const DefaultHitsInterval = 5 * time.Second

// Bounds of the backoff between tries of the store.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 10 * time.Second
)

// StatusKey returns the key of node's status.
func StatusKey(node string) string { return StatusPrefix + node }

// SeenPrefix is the prefix of the nodes' seen records: /tiergate/seen/v1/<node>.
// A seen record is the node's status as last written, under no lease: it stays
// when the status key goes away, so a node that stopped reporting is known and
// shown as lost.
const SeenPrefix = "/tiergate/seen/v1/"

// SeenKey returns the key of node's seen record.
func SeenKey(node string) string { return SeenPrefix + node }

// CertInUse is a certificate a node serves.
type CertInUse struct {
	// Name is the certificate's name in the store.
	Name string `json:"name"`
	// Version is the certificate version the node serves.
	Version int `json:"version"`
	// SHA256 is the SHA-256 of the leaf certificate's DER, in hex.
	SHA256 string `json:"sha256"`
}

// Status is what a node reports at StatusKey: an ACK (Error empty) or a NACK.
type Status struct {
	// Node and Role name the node and what it is (l7d, l4d, keyserverd).
	Node string `json:"node"`
	Role string `json:"role"`
	// AppliedRevision is the store revision of the configuration in force; 0 before
	// any was applied.
	AppliedRevision int64 `json:"applied_revision"`
	// RefusedRevision is the revision a NACK refused; 0 for an ACK.
	RefusedRevision int64 `json:"refused_revision,omitempty"`
	// Error says why the snapshot at RefusedRevision was refused; empty for an ACK.
	Error string `json:"error,omitempty"`
	// Address is where the node serves (Config.Address); empty when not given.
	Address string `json:"address,omitempty"`
	// Metrics is where the node's Prometheus metrics are (Config.Metrics): its
	// admin endpoint's host:port, whose /metrics controld's dashboard scrapes, or
	// a full URL; empty when not given.
	Metrics string `json:"metrics,omitempty"`
	// Started is when the agent was made (New): the node's start, for its uptime.
	Started time.Time `json:"started"`
	// Certificates are the certificates the node serves (Config.Certificates).
	Certificates []CertInUse `json:"certificates,omitempty"`
	// Blacklists are the versions of the blacklists the node enforces, by list
	// name (Config.Blacklists, control/blsync's Follower.Versions).
	Blacklists map[string]int64 `json:"blacklists,omitempty"`
	// BlacklistHits are the addresses each blacklist the node enforces refused
	// since the node started, by list name (Config.BlacklistHits), refreshed every
	// Config.HitsInterval.
	BlacklistHits map[string]uint64 `json:"blacklist_hits,omitempty"`
	// Updated is when the status last changed.
	Updated time.Time `json:"updated"`
}

// Config is an agent's configuration. Node, Apply and one of Store and Open are
// required.
type Config struct {
	// Store is the store the agent reads, already open; the agent does not close it.
	// When it is closed, Run returns. Either Store or Open.
	Store *store.Store

	// Open opens the store: the agent calls it at start, and again, with a backoff
	// from 100ms doubling to 10s, while it fails or after the store it returned was
	// closed; the agent closes what it returned when Run returns. Either Store or
	// Open.
	Open func(ctx context.Context) (*store.Store, error)

	// Node is the node's name, unique in the cluster: its status key is
	// StatusKey(Node). A store name (store.CheckName). Required.
	Node string

	// Role is what the node is ("l7d", "l4d", "keyserverd"), reported in its status.
	// Default none.
	Role string

	// Address is where the node serves, reported in its status: its service or
	// admin address, host:port. Default none.
	Address string

	// Metrics is where the node's metrics are, reported in its status: its admin
	// endpoint's host:port (its /metrics) or the full URL of its metrics. Default
	// none (a scraper then tries Address).
	Metrics string

	// Certificates returns the certificates the node serves, reported in its
	// status. It is called at each write of the status; after the node's
	// certificates changed other than by an Apply, Agent.Report writes them. It
	// must be safe to call from the agent's goroutines. Default none.
	Certificates func() []CertInUse

	// Blacklists returns the versions of the blacklists the node enforces, by list
	// name (control/blsync's Follower.Versions), reported in its status. It is
	// called at each write of the status; Agent.Report writes them after they
	// changed. It must be safe to call from the agent's goroutines. Default none.
	Blacklists func() map[string]int64

	// BlacklistHits returns the hits of each blacklist the node enforces since it
	// started, by list name (control/blsync's Follower.Hits), reported in its
	// status. It is called every HitsInterval and at each write of the status; the
	// status is written again when they changed. It must be safe to call from the
	// agent's goroutines. Default none.
	BlacklistHits func() map[string]uint64

	// HitsInterval is how often BlacklistHits is read and, when the hits changed,
	// the status written again: hits change with every refused client, so they are
	// not written as they come. Default 5s.
	HitsInterval time.Duration

	// CacheFile keeps the last snapshot applied, with its revision, so that a start
	// while the store cannot be reached applies it. Default none: nothing is kept,
	// and such a start waits for the store.
	CacheFile string

	// Apply puts a checked snapshot at revision rev in force (the daemon's
	// prepare/commit path). On error nothing of it must be in force: the agent
	// reports a NACK and the configuration applied before stays. Calls are one at a
	// time. Required.
	Apply func(ctx context.Context, snap *model.Snapshot, rev int64) error

	// Logger receives the agent's logs. Default slog.Default().
	Logger *slog.Logger

	// Registerer registers the agent's metrics. Default none: not registered.
	Registerer prometheus.Registerer
}

// Agent keeps a node's configuration in step with the store. Run runs it.
type Agent struct {
	cfg Config
	log *slog.Logger
	met *metrics

	// objs is the state the watch has built, by key (kind/name); applied is the
	// revision of the snapshot last put in force, 0 for none.
	objs    map[string]store.Object
	applied int64
	// objsMu guards objs and pending, the revision objs are at: the watch writes
	// them, the goroutine that applies reads them.
	objsMu  sync.Mutex
	pending int64
	// checker checks each snapshot, reusing the objects unchanged since the last.
	checker model.Checker
	// saving is the latest snapshot applied and not yet in the cache file; save
	// has a value when there is one.
	saving atomic.Pointer[store.Snapshot]
	save   chan struct{}
	// lastTried is the revision last checked (applied or refused), so a snapshot
	// read again after an outage is not applied twice.
	lastTried int64

	// cur is the store in use, nil while there is none.
	cur atomic.Pointer[store.Store]

	mu      sync.Mutex
	status  Status
	changed chan struct{} // a value when status changed and is not yet written
}

// New returns an agent for cfg; Run starts it.
func New(cfg Config) (*Agent, error) {
	if (cfg.Store == nil) == (cfg.Open == nil) {
		return nil, errors.New("agent: one of Store and Open is required")
	}
	if err := store.CheckName(cfg.Node); err != nil {
		return nil, fmt.Errorf("agent: node: %w", err)
	}
	if cfg.Apply == nil {
		return nil, errors.New("agent: Apply is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	met, err := newMetrics(cfg.Registerer, cfg.Node)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &Agent{
		cfg:     cfg,
		log:     log.With("node", cfg.Node),
		met:     met,
		status:  Status{Node: cfg.Node, Role: cfg.Role, Address: cfg.Address, Metrics: cfg.Metrics, Started: now, Updated: now},
		changed: make(chan struct{}, 1),
		save:    make(chan struct{}, 1),
	}, nil
}

// Status returns the agent's status as it reports it.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

// Report writes the status again if the certificates Config.Certificates returns
// changed since it was last written: for a node whose certificates change other
// than by an Apply (a file reload). It returns at once; the write follows.
func (a *Agent) Report() {
	certs := a.refreshCertificates()
	if a.refreshBlacklists() || certs {
		a.signal()
	}
}

// refreshBlacklists takes the versions from Config.Blacklists into the status and
// reports whether they changed.
func (a *Agent) refreshBlacklists() bool {
	if a.cfg.Blacklists == nil {
		return false
	}
	bl := a.cfg.Blacklists()
	a.mu.Lock()
	defer a.mu.Unlock()
	if maps.Equal(bl, a.status.Blacklists) {
		return false
	}
	a.status.Blacklists = maps.Clone(bl)
	a.status.Updated = time.Now()
	return true
}

// refreshHits takes the hits from Config.BlacklistHits into the status and
// reports whether they changed.
func (a *Agent) refreshHits() bool {
	if a.cfg.BlacklistHits == nil {
		return false
	}
	hits := a.cfg.BlacklistHits()
	a.mu.Lock()
	defer a.mu.Unlock()
	if maps.Equal(hits, a.status.BlacklistHits) {
		return false
	}
	a.status.BlacklistHits = maps.Clone(hits)
	a.status.Updated = time.Now()
	return true
}

// refreshCertificates takes the certificates from Config.Certificates into the
// status and reports whether they changed.
func (a *Agent) refreshCertificates() bool {
	if a.cfg.Certificates == nil {
		return false
	}
	certs := a.cfg.Certificates()
	a.mu.Lock()
	defer a.mu.Unlock()
	if slices.Equal(certs, a.status.Certificates) {
		return false
	}
	a.status.Certificates = slices.Clone(certs)
	a.status.Updated = time.Now()
	return true
}

// signal says the status is to be written.
func (a *Agent) signal() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// setStatus records an ACK (err nil) of rev or a NACK of rev with err.
func (a *Agent) setStatus(rev int64, err error) {
	a.mu.Lock()
	a.status.AppliedRevision = a.applied
	a.status.RefusedRevision, a.status.Error = 0, ""
	if err != nil {
		a.status.RefusedRevision, a.status.Error = rev, err.Error()
	}
	a.status.Updated = time.Now()
	a.mu.Unlock()
	a.refreshCertificates()
	a.signal()
}

// Run runs the agent until ctx is done: it applies the configuration in the store,
// and every change to it, and reports its status. It returns ctx's error, or an
// error when Config.Store was closed. At return the status key is deleted (its
// lease revoked); the configuration in force stays.
func (a *Agent) Run(ctx context.Context) error {
	var (
		st      *store.Store
		wg      sync.WaitGroup
		stopRep context.CancelFunc
		wait    time.Duration
		first   = true
	)
	sctx, stopSaver := context.WithCancel(context.WithoutCancel(ctx))
	saved := make(chan struct{})
	go func() {
		defer close(saved)
		a.saver(sctx)
	}()
	defer func() {
		stopSaver()
		<-saved
	}()
	stopReporter := func() {
		if stopRep != nil {
			stopRep()
			wg.Wait()
			stopRep = nil
		}
	}
	defer func() {
		stopReporter()
		a.cur.Store(nil)
		if st != nil && a.cfg.Open != nil {
			st.Close()
		}
	}()
	for {
		if st == nil {
			var err error
			st, err = a.open(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				a.log.Warn("agent: opening the store", "err", err)
				if first {
					first = false
					a.applyCache(ctx)
				}
				if err := Backoff(ctx, &wait); err != nil {
					return err
				}
				continue
			}
			a.cur.Store(st)
			rctx, cancel := context.WithCancel(ctx)
			stopRep = cancel
			wg.Add(1)
			go func(cli *clientv3.Client) {
				defer wg.Done()
				a.report(rctx, cli)
			}(st.Client())
		}
		if !first {
			a.met.reconnects.Inc()
		}
		err := a.session(ctx, st)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, store.ErrClosed) {
			stopReporter()
			a.cur.Store(nil)
			if a.cfg.Open == nil {
				return fmt.Errorf("agent: %w", err)
			}
			st.Close()
			st = nil
		}
		a.log.Warn("agent: reading the store", "err", err)
		if first {
			first = false
			if a.applied == 0 {
				a.applyCache(ctx)
			}
		}
		if err := Backoff(ctx, &wait); err != nil {
			return err
		}
	}
}

// open returns the store to use.
func (a *Agent) open(ctx context.Context) (*store.Store, error) {
	if a.cfg.Store != nil {
		return a.cfg.Store, nil
	}
	return a.cfg.Open(ctx)
}

// Backoff waits the next wait of a node's backoff after a failure to reach the
// store: *wait doubles from 100ms to 10s (and is updated), and the time slept is
// half of it to all of it, at random, so that nodes cut off together do not come
// back together. It returns ctx's error if ctx ends first. The agent and the
// blacklists' follower (control/blsync) use it.
func Backoff(ctx context.Context, wait *time.Duration) error {
	*wait = min(max(2**wait, retryMin), retryMax)
	d := *wait/2 + rand.N(*wait/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// session reads a snapshot, applies it, and applies every later revision from the
// watch, until an error.
//
// The watch only records what changed; a goroutine of the session applies the
// latest state each time it is free. Revisions that arrive while a snapshot is
// being applied are so applied together, as the latest of them, rather than one
// after the other: a node behind a burst of writes catches up with one apply.
func (a *Agent) session(ctx context.Context, st *store.Store) error {
	snap, err := st.Snapshot(ctx)
	if err != nil {
		return err
	}
	a.reset(snap)
	kick := make(chan struct{}, 1)
	kick <- struct{}{}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.applier(actx, ctx, kick)
	}()
	defer func() {
		cancel()
		<-done
	}()
	return st.Watch(ctx, snap.Revision, func(b store.Batch) error {
		if b.Reset != nil {
			a.log.Info("agent: the watch fell behind compaction; the state read again", "revision", b.Revision)
			a.reset(b.Reset)
		}
		a.objsMu.Lock()
		for _, ev := range b.Events {
			k := ev.Kind + "/" + ev.Name
			if ev.Deleted {
				delete(a.objs, k)
			} else {
				a.objs[k] = ev.Object
			}
		}
		a.pending = b.Revision
		a.objsMu.Unlock()
		select {
		case kick <- struct{}{}:
		default:
		}
		return nil
	})
}

// reset replaces the state with snap's objects.
func (a *Agent) reset(snap *store.Snapshot) {
	objs := make(map[string]store.Object, snap.Len())
	for _, o := range snap.All() {
		objs[o.Kind+"/"+o.Name] = o
	}
	a.objsMu.Lock()
	a.objs, a.pending = objs, snap.Revision
	a.objsMu.Unlock()
}

// Bounds of the wait before a snapshot that Apply refused is tried again.
const (
	retryApplyMin = time.Second
	retryApplyMax = 30 * time.Second
)

// applier applies the latest state each time kick has a value, until actx is done
// (applying under ctx, so that an apply under way is not cut short). A snapshot
// Apply refused is tried again, with a backoff from 1s doubling to 30s, until it
// is applied or a newer revision comes: Apply may have failed for a while only (a
// keyserver out of reach, an address not yet there). A snapshot that does not
// check is not tried again: it cannot change.
func (a *Agent) applier(actx, ctx context.Context, kick <-chan struct{}) {
	var (
		retry  *time.Timer
		retryC <-chan time.Time
		wait   time.Duration
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		again := false
		select {
		case <-actx.Done():
			return
		case <-kick:
			wait = 0
		case <-retryC:
			again = true
		}
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
		if a.handle(ctx, again) {
			wait = min(max(2*wait, retryApplyMin), retryApplyMax)
			retry = time.NewTimer(wait)
			retryC = retry.C
		}
	}
}

// handle checks and applies the state the watch has built, unless its revision
// was tried already (and again is not set). It reports whether Apply refused it.
func (a *Agent) handle(ctx context.Context, again bool) (applyRefused bool) {
	a.objsMu.Lock()
	rev := a.pending
	if rev < a.lastTried || rev == a.lastTried && !again {
		a.objsMu.Unlock()
		return false
	}
	objs := make([]store.Object, 0, len(a.objs))
	for _, o := range a.objs {
		objs = append(objs, o)
	}
	a.objsMu.Unlock()
	a.lastTried = rev
	ss := store.NewSnapshot(rev, objs)
	if err := a.apply(ctx, ss); err != nil {
		var ae *applyError
		applyRefused = errors.As(err, &ae)
		if !again {
			a.met.nacks.Inc()
		}
		a.log.Warn("agent: configuration refused; the one in force stays", "revision", rev, "applied_revision", a.applied,
			"tried_again", again, "err", err)
		a.setStatus(rev, err)
		return applyRefused
	}
	a.log.Info("agent: configuration applied", "revision", rev, "tried_again", again)
	a.setStatus(rev, nil)
	return false
}

// applyError is a snapshot that checked but that Config.Apply refused.
type applyError struct{ err error }

func (e *applyError) Error() string { return e.err.Error() }
func (e *applyError) Unwrap() error { return e.err }

// apply checks ss as a whole and applies it; once Apply took it, the saver puts it
// in the cache file.
func (a *Agent) apply(ctx context.Context, ss *store.Snapshot) error {
	snap, err := a.check(ss)
	if err != nil {
		return err
	}
	if err := a.cfg.Apply(ctx, snap, ss.Revision); err != nil {
		return &applyError{fmt.Errorf("applying revision %d: %w", ss.Revision, err)}
	}
	a.applied = ss.Revision
	a.met.applied.Set(float64(ss.Revision))
	if a.cfg.CacheFile != "" {
		a.saving.Store(ss)
		select {
		case a.save <- struct{}{}:
		default:
		}
	}
	return nil
}

// saver writes the latest snapshot applied to the cache file, atomically
// (internal/daemon's PrepareFile and Commit), whenever there is a new one, until
// ctx is done; it then writes the last one, if not yet written. It runs beside
// the applying, so that a node applies a revision without waiting for its disk,
// and a burst of revisions is written once, as its latest.
func (a *Agent) saver(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			a.saveLatest()
			return
		case <-a.save:
			a.saveLatest()
		}
		// At most one write per saveEvery: what is applied meanwhile is written
		// next, as the latest.
		t := time.NewTimer(saveEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			a.saveLatest()
			return
		case <-t.C:
		}
	}
}

// saveEvery spaces the cache file's writes: the file is read only to start while
// the store is out of reach, and the last snapshot is written when Run returns.
const saveEvery = time.Second

// saveLatest writes the snapshot waiting to be saved, if any.
func (a *Agent) saveLatest() {
	ss := a.saving.Swap(nil)
	if ss == nil {
		return
	}
	pending, err := daemon.PrepareFile(a.cfg.CacheFile, 0o600, func(w io.Writer) error {
		_, err := w.Write(encodeCache(ss))
		return err
	})
	if err == nil {
		err = pending.Commit()
	}
	if err != nil {
		a.log.Warn("agent: saving the snapshot in the cache file", "revision", ss.Revision, "err", err)
	}
}

// check decodes ss into the model and checks it whole (model.Checker: what did not
// change since the snapshot checked before is not decoded and validated again).
func (a *Agent) check(ss *store.Snapshot) (*model.Snapshot, error) {
	snap, err := a.checker.Check(ss)
	if err != nil {
		return nil, fmt.Errorf("checking revision %d: %w", ss.Revision, err)
	}
	return snap, nil
}

// encodeCache returns ss as the cache file holds it (cache, in JSON), the objects'
// values as they are: they are JSON already (the store takes no other), and
// encoding/json would check and compact each of them again.
func encodeCache(ss *store.Snapshot) []byte {
	objs := ss.All()
	size := 64
	for _, o := range objs {
		size += len(o.Kind) + len(o.Name) + len(o.Value) + 128
	}
	b := make([]byte, 0, size)
	b = append(b, `{"revision":`...)
	b = strconv.AppendInt(b, ss.Revision, 10)
	b = append(b, `,"objects":[`...)
	for i, o := range objs {
		if i > 0 {
			b = append(b, ',')
		}
		kind, _ := json.Marshal(o.Kind)
		name, _ := json.Marshal(o.Name)
		b = append(append(append(b, `{"Kind":`...), kind...), `,"Name":`...)
		b = append(append(b, name...), `,"Value":`...)
		if len(o.Value) == 0 {
			b = append(b, "null"...)
		} else {
			b = append(b, o.Value...)
		}
		b = strconv.AppendInt(append(b, `,"ModRevision":`...), o.ModRevision, 10)
		b = strconv.AppendInt(append(b, `,"CreateRevision":`...), o.CreateRevision, 10)
		b = strconv.AppendInt(append(b, `,"Version":`...), o.Version, 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

// cache is the cache file's content.
type cache struct {
	Revision int64          `json:"revision"`
	Objects  []store.Object `json:"objects"`
}

// applyCache applies the cached snapshot, if there is one.
func (a *Agent) applyCache(ctx context.Context) {
	if a.cfg.CacheFile == "" {
		return
	}
	data, err := os.ReadFile(a.cfg.CacheFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			a.log.Warn("agent: reading the cache file", "err", err)
		}
		return
	}
	var c cache
	if err := json.Unmarshal(data, &c); err != nil {
		a.log.Warn("agent: reading the cache file", "file", a.cfg.CacheFile, "err", err)
		return
	}
	ss := store.NewSnapshot(c.Revision, c.Objects)
	snap, err := a.check(ss)
	if err == nil {
		err = a.cfg.Apply(ctx, snap, c.Revision)
	}
	if err != nil {
		a.log.Warn("agent: applying the cached snapshot", "file", a.cfg.CacheFile, "revision", c.Revision, "err", err)
		return
	}
	a.applied = c.Revision
	a.met.applied.Set(float64(c.Revision))
	a.log.Info("agent: the store is out of reach; the cached snapshot applied", "revision", c.Revision)
	a.setStatus(c.Revision, nil)
}

// report writes the status under a lease, again whenever it changes, and takes a
// new lease when the one it had is lost, until ctx is done; it then revokes the
// lease, which deletes the key.
func (a *Agent) report(ctx context.Context, cli *clientv3.Client) {
	var wait time.Duration
	for ctx.Err() == nil {
		err := a.reportLease(ctx, cli)
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("agent: reporting the status", "err", err)
		if Backoff(ctx, &wait) != nil {
			return
		}
	}
}

// reportLease reports under one lease until ctx is done or the lease is lost.
func (a *Agent) reportLease(ctx context.Context, cli *clientv3.Client) error {
	lease, err := cli.Grant(ctx, int64(StatusTTL/time.Second))
	if err != nil {
		return fmt.Errorf("granting a lease: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
		defer cancel()
		if _, err := cli.Revoke(rctx, lease.ID); err != nil && ctx.Err() == nil {
			a.log.Debug("agent: revoking the status lease", "err", err)
		}
	}()
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ka, err := cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		return fmt.Errorf("keeping the lease alive: %w", err)
	}
	key, seen := StatusKey(a.cfg.Node), SeenKey(a.cfg.Node)
	put := func() error {
		a.refreshCertificates()
		a.refreshBlacklists()
		a.refreshHits()
		data, err := json.Marshal(a.Status())
		if err != nil {
			return err
		}
		// The status under the lease and the seen record under none, together.
		if _, err := cli.Txn(ctx).Then(
			clientv3.OpPut(key, string(data), clientv3.WithLease(lease.ID)),
			clientv3.OpPut(seen, string(data)),
		).Commit(); err != nil {
			return fmt.Errorf("writing %s and %s: %w", key, seen, err)
		}
		return nil
	}
	if err := put(); err != nil {
		return err
	}
	var hits <-chan time.Time
	if a.cfg.BlacklistHits != nil {
		every := a.cfg.HitsInterval
		if every <= 0 {
			every = DefaultHitsInterval
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		hits = tick.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-hits:
			if a.refreshHits() {
				a.signal()
			}
		case _, ok := <-ka:
			if !ok {
				return errors.New("the status lease was lost")
			}
		case <-a.changed:
			if err := put(); err != nil {
				select { // written again under the next lease
				case a.changed <- struct{}{}:
				default:
				}
				return err
			}
		}
	}
}
