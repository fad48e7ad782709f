package blsync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/internal/promreg"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// FollowerConfig configures a Follower. List and one of Store and Open are
// required.
type FollowerConfig struct {
	// Store is the store to follow, already open; the follower does not close it.
	// Either Store or Open.
	Store *store.Store

	// Open opens the store (agent.NodeConfig.Open): called at start and again, with
	// a backoff from 100ms doubling to 10s, while it fails or after the store is
	// lost; the follower closes what it returned. Either Store or Open.
	Open func(ctx context.Context) (*store.Store, error)

	// Dir keeps the last version of each list applied (<name>.bl in the
	// policy/blacklist binary format, <name>.json its version and SHA-256),
	// written at most every 5s and at the follower's end, loaded at start so a
	// node started while the store is out of reach enforces its last lists.
	// Created when missing. Default none: nothing is kept.
	Dir string

	// List returns the list a name of the store is put in force in, nil for a list
	// the node does not enforce (it is then not fetched). Called from the follower's
	// goroutine. Required.
	List func(name string) *blacklist.List

	// Changed, when set, is called after the versions in force changed (to have the
	// node agent report them: agent.Agent.Report). Default none.
	Changed func()

	// VerifyOnly has the follower fetch and check each version as a node does
	// (the manifest, every chunk's size and SHA-256, every delta decoded and the
	// deltas combined) and count it in force without building it: nothing is
	// swapped into the List (which only says whether a list is followed), Hits
	// are 0, nothing is kept in Dir. For the simulated nodes of bench-blacklist,
	// a hundred in one process, whose lists would not fit in its memory. Default
	// false.
	VerifyOnly bool

	// Logger receives the follower's logs. Default slog.Default().
	Logger *slog.Logger

	// Registerer receives the follower's metrics: tiergate_blsync_version{list}
	// (the version in force) and tiergate_blsync_refused_total{list} (versions
	// refused: a corrupt chunk or delta, a list that does not build). Default
	// none: not registered.
	Registerer prometheus.Registerer
}

// Follower keeps a node's lists in step with the store: it fetches only what
// changed (the deltas since the version in force, or the base when too far
// behind), checks every chunk's SHA-256, builds the new list aside and swaps it
// in. Run runs it.
type Follower struct {
	cfg FollowerConfig
	log *slog.Logger

	mu       sync.Mutex
	versions map[string]int64           // in force, by list
	errs     map[string]string          // the last sync's error, by list
	lists    map[string]*blacklist.List // in force, by list: their hits

	// seen are chunk and delta values the watch delivered, by key, used instead of
	// fetching them again (checked as any other).
	seen      map[string][]byte
	seenBytes int
	// early are the chunks among seen already checked against their name (the
	// SHA-256 of their bytes) and, unless VerifyOnly, decoded (nil with
	// VerifyOnly), as the watch delivered them: a base's chunks arrive before its
	// manifest, whose sync then has only the others left to check.
	early      map[string]*blacklist.Set
	earlyBytes int

	saveMu  sync.Mutex
	saving  map[string]saveReq
	saveSig chan struct{}

	version *prometheus.GaugeVec
	refused *prometheus.CounterVec
}

type saveReq struct {
	version int64
	set     *blacklist.Set
}

// NewFollower returns a follower of cfg.
func NewFollower(cfg FollowerConfig) (*Follower, error) {
	if (cfg.Store == nil) == (cfg.Open == nil) {
		return nil, errors.New("blsync: a follower needs one of Store and Open")
	}
	if cfg.List == nil {
		return nil, errors.New("blsync: a follower needs List")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Follower{cfg: cfg, log: cfg.Logger, versions: map[string]int64{}, errs: map[string]string{}, lists: map[string]*blacklist.List{},
		seen: map[string][]byte{}, early: map[string]*blacklist.Set{}, saving: map[string]saveReq{}, saveSig: make(chan struct{}, 1),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tiergate_blsync_version",
			Help: "The version of each blacklist of the store the node enforces."}, []string{"list"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tiergate_blsync_refused_total",
			Help: "Versions of a blacklist of the store refused (a corrupt chunk or delta, a list that does not build); the version before stays in force."}, []string{"list"}),
	}
	if cfg.Registerer != nil {
		var err error
		if f.version, err = promreg.Register(cfg.Registerer, f.version); err != nil {
			return nil, fmt.Errorf("blsync: registering the metrics: %w", err)
		}
		if f.refused, err = promreg.Register(cfg.Registerer, f.refused); err != nil {
			return nil, fmt.Errorf("blsync: registering the metrics: %w", err)
		}
	}
	return f, nil
}

// Versions returns the version of each list in force, by name: what the node
// enforces (for agent.Config.Blacklists).
func (f *Follower) Versions() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.versions)
}

// Hits returns, by list in force, the addresses its List refused since the node
// started (blacklist.List.Hits of every source): for control/agent's
// Config.BlacklistHits.
func (f *Follower) Hits() map[string]uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]uint64, len(f.lists))
	for name, l := range f.lists {
		out[name] = l.Hits(blacklist.SourcePacket) + l.Hits(blacklist.SourceHeader) + l.Hits("")
	}
	return out
}

// Errors returns, by list, why the last version of the store could not be put in
// force (a corrupt chunk, say): the version before stays. Lists in step are not in
// it.
func (f *Follower) Errors() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.errs)
}

// Run follows the store until ctx is done, and returns ctx's error. It first
// loads the lists kept in Dir.
func (f *Follower) Run(ctx context.Context) error {
	f.loadDir()
	var wg sync.WaitGroup
	wg.Add(1)
	sctx, stopSaver := context.WithCancel(context.WithoutCancel(ctx))
	go func() { defer wg.Done(); f.saver(sctx) }()
	defer func() { stopSaver(); wg.Wait() }()
	var wait time.Duration
	for ctx.Err() == nil {
		st := f.cfg.Store
		if st == nil {
			var err error
			if st, err = f.cfg.Open(ctx); err != nil {
				if ctx.Err() != nil {
					break
				}
				f.log.Warn("blsync: opening the store", "err", err)
				if agent.Backoff(ctx, &wait) != nil {
					break
				}
				continue
			}
		}
		err := f.follow(ctx, st.Client())
		if f.cfg.Store == nil {
			st.Close()
		}
		if ctx.Err() != nil {
			break
		}
		if f.cfg.Store != nil && f.cfg.Store.Client().Ctx().Err() != nil {
			return fmt.Errorf("blsync: %w", store.ErrClosed)
		}
		f.log.Warn("blsync: following the blacklists", "err", err)
		if agent.Backoff(ctx, &wait) != nil {
			break
		}
	}
	return ctx.Err()
}

// maxSeenBytes bounds the values the watch delivered that are kept for a
// manifest to come.
const maxSeenBytes = 2 * MaxChunks * MaxChunkBytes

// retryEvery is how often a list whose last sync failed is tried again.
const retryEvery = 5 * time.Second

// follow reads every manifest, syncs each list, then watches for changes.
func (f *Follower) follow(ctx context.Context, cli *clientv3.Client) error {
	resp, err := cli.Get(ctx, Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("listing the blacklists: %w", wrapErr(err))
	}
	rev := resp.Header.Revision
	for _, kv := range resp.Kvs {
		if name, ok := manifestName(string(kv.Key)); ok && f.cfg.List(name) != nil {
			f.syncNow(ctx, cli, name, rev)
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(retryEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			for name := range f.Errors() {
				f.syncNow(ctx, cli, name, 0)
			}
		case wr, ok := <-wch:
			if !ok {
				return errors.New("the watch ended")
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watching the blacklists: %w", wrapErr(err))
			}
			changed := map[string]int64{}
			for _, ev := range wr.Events {
				key := string(ev.Kv.Key)
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				if name, ok := manifestName(key); ok {
					if f.cfg.List(name) != nil {
						changed[name] = ev.Kv.ModRevision
					}
					continue
				}
				if name, ok := listOf(key); ok && f.cfg.List(name) != nil {
					f.seen[key] = ev.Kv.Value
					f.seenBytes += len(ev.Kv.Value)
					f.checkEarly(key, ev.Kv.Value)
				}
			}
			for name, r := range changed {
				f.syncNow(ctx, cli, name, r)
			}
			if f.seenBytes+f.earlyBytes > maxSeenBytes { // values whose manifest never came
				clear(f.seen)
				clear(f.early)
				f.seenBytes, f.earlyBytes = 0, 0
			}
		}
	}
}

// listOf returns the list a chunk or delta key is of.
func listOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return "", false
	}
	name, _, ok := strings.Cut(rest, "/")
	return name, ok
}

// syncNow syncs a list with its manifest at rev (0: now), recording the outcome.
func (f *Follower) syncNow(ctx context.Context, cli *clientv3.Client, name string, rev int64) {
	f.mu.Lock()
	old, had := f.errs[name]
	f.mu.Unlock()
	err := f.sync(ctx, cli, name, rev)
	if errors.Is(err, store.ErrCompacted) && rev > 0 {
		err = f.sync(ctx, cli, name, 0) // read all at a revision not yet compacted
	}
	f.mu.Lock()
	if err != nil && ctx.Err() == nil {
		f.errs[name] = err.Error()
	} else {
		delete(f.errs, name)
	}
	f.mu.Unlock()
	refused := errors.Is(err, ErrCorrupt) || errors.Is(err, blacklist.ErrTooManyEntries) || errors.Is(err, blacklist.ErrInvalidPrefix)
	switch {
	case err != nil && ctx.Err() == nil && old != err.Error() && refused:
		f.refused.WithLabelValues(name).Inc()
		f.log.Error("blsync: a blacklist version is refused; the one in force stays", "list", name, "version_in_force", f.Versions()[name], "err", err)
	case err != nil && ctx.Err() == nil && old != err.Error():
		f.log.Warn("blsync: a blacklist could not be read; the one in force stays, tried again", "list", name, "version_in_force", f.Versions()[name], "err", err)
	case err == nil && had:
		f.log.Info("blsync: blacklist in step again", "list", name, "version", f.Versions()[name])
	}
}

// sync puts the list's version of the store in force: the deltas since the
// version in force when the manifest still holds them, else the base and every
// delta after it.
func (f *Follower) sync(ctx context.Context, cli *clientv3.Client, name string, rev int64) error {
	l := f.cfg.List(name)
	if l == nil {
		return nil
	}
	resp, err := cli.Get(ctx, ManifestKey(name), withRev(rev)...)
	if err != nil {
		return fmt.Errorf("reading the manifest: %w", wrapErr(err))
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	m, err := DecodeManifest(name, resp.Kvs[0].Value)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	f.mu.Lock()
	have, known := f.versions[name]
	f.mu.Unlock()
	if known && have == m.Version {
		f.forget(name)
		return nil
	}
	start := time.Now()
	var next *blacklist.Set
	how := "deltas"
	if known && have < m.Version && have >= m.Base.Version {
		ds, err := f.deltas(ctx, cli, name, have+1, m.Version, rev)
		if err != nil {
			return err
		}
		d, err := combine(ds)
		if err != nil {
			return err
		}
		if !f.cfg.VerifyOnly {
			if err := l.Apply(d); err != nil {
				return err
			}
			next = l.Snapshot()
		}
	} else {
		how = "base"
		base, err := f.base(ctx, cli, m, rev)
		if err != nil {
			return err
		}
		ds, err := f.deltas(ctx, cli, name, m.Deltas.From, m.Deltas.To, rev)
		if err != nil {
			return err
		}
		if f.cfg.VerifyOnly {
			if _, err := combine(ds); err != nil {
				return fmt.Errorf("blacklist %s: %w", name, err)
			}
		} else {
			if next, err = applyDeltas(name, base, ds); err != nil {
				return err
			}
			l.Replace(next)
		}
	}
	f.mu.Lock()
	f.versions[name] = m.Version
	if !f.cfg.VerifyOnly {
		f.lists[name] = l
	}
	delete(f.errs, name) // with the version: the two are never seen out of step
	f.mu.Unlock()
	f.version.WithLabelValues(name).Set(float64(m.Version))
	f.forget(name)
	entries := m.Entries
	if next != nil {
		entries = int64(next.Len())
		f.save(name, m.Version, next)
	}
	f.log.Info("blsync: blacklist in force", "list", name, "version", m.Version, "from", have, "by", how, "entries", entries, "took", time.Since(start).Round(time.Millisecond))
	if f.cfg.Changed != nil {
		f.cfg.Changed()
	}
	return nil
}

func withRev(rev int64) []clientv3.OpOption {
	if rev > 0 {
		return []clientv3.OpOption{clientv3.WithRev(rev)}
	}
	return nil
}

// forget drops the values the watch delivered for a list.
func (f *Follower) forget(name string) {
	p := Prefix + name + "/"
	for k, s := range f.early {
		if strings.HasPrefix(k, p) {
			delete(f.early, k)
			if s != nil {
				f.earlyBytes -= s.Bytes()
			}
		}
	}
	for k, v := range f.seen {
		if strings.HasPrefix(k, p) {
			delete(f.seen, k)
			f.seenBytes -= len(v)
		}
	}
}

// base reads m's base: each chunk the watch delivered, else from the store at
// rev, checked and decoded a few at once.
func (f *Follower) base(ctx context.Context, cli *clientv3.Client, m *Manifest, rev int64) (*blacklist.Set, error) {
	sets := make([]*blacklist.Set, len(m.Base.Chunks))
	seen := make([][]byte, len(m.Base.Chunks))
	done := make([]bool, len(m.Base.Chunks))
	for i, ref := range m.Base.Chunks {
		key := ChunkKey(m.Name, ref.SHA256)
		seen[i] = f.seen[key]
		if s, ok := f.early[key]; ok && len(seen[i]) == ref.Bytes {
			sets[i], done[i] = s, true
		}
	}
	err := parallel(ctx, len(m.Base.Chunks), func(ctx context.Context, i int) error {
		if done[i] {
			return nil
		}
		ref, data := m.Base.Chunks[i], seen[i]
		if data == nil {
			resp, err := cli.Get(ctx, ChunkKey(m.Name, ref.SHA256), clientv3.WithRev(rev))
			if err != nil {
				return fmt.Errorf("reading chunk %s: %w", ref.SHA256, wrapErr(err))
			}
			if len(resp.Kvs) == 0 {
				return fmt.Errorf("version %d: chunk %s is missing: %w", m.Version, ref.SHA256, ErrCorrupt)
			}
			data = resp.Kvs[0].Value
		}
		if f.cfg.VerifyOnly {
			if err := checkChunk(ref, data); err != nil {
				return fmt.Errorf("version %d: %w", m.Version, err)
			}
			return nil
		}
		s, err := decodeChunk(ref, data)
		if err != nil {
			return fmt.Errorf("version %d: %w", m.Version, err)
		}
		sets[i] = s
		return nil
	})
	if err != nil || f.cfg.VerifyOnly {
		return nil, err
	}
	return union(sets), nil
}

// checkEarly checks a chunk the watch delivered against its name (its SHA-256)
// and, unless VerifyOnly, decodes it, for the sync of the manifest to come. A
// chunk that fails is left to that sync, which refuses it.
func (f *Follower) checkEarly(key string, data []byte) {
	name, rest, ok := strings.Cut(strings.TrimPrefix(key, Prefix), "/chunks/")
	if !ok || name == "" || !validSum(rest) {
		return
	}
	if old, ok := f.early[key]; ok { // the value it checked is no longer the latest
		delete(f.early, key)
		if old != nil {
			f.earlyBytes -= old.Bytes()
		}
	}
	ref := ChunkRef{SHA256: rest, Bytes: len(data)}
	if f.cfg.VerifyOnly {
		if checkChunk(ref, data) == nil {
			f.early[key] = nil
		}
		return
	}
	s, err := decodeChunk(ref, data)
	if err != nil {
		return
	}
	f.early[key] = s
	f.earlyBytes += s.Bytes()
}

// deltas reads the deltas from..to: those the watch delivered, else from the store.
func (f *Follower) deltas(ctx context.Context, cli *clientv3.Client, name string, from, to, rev int64) ([]*blacklist.Delta, error) {
	if from == 0 || from > to {
		return nil, nil
	}
	out := make([]*blacklist.Delta, 0, to-from+1)
	for v := from; v <= to; v++ {
		data, ok := f.seen[DeltaKey(name, v)]
		if !ok {
			ds, err := fetchDeltas(ctx, cli, name, v, to, rev)
			if err != nil {
				return nil, err
			}
			return append(out, ds...), nil
		}
		d, _, err := DecodeDelta(v, data)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// cacheMeta is the record beside a list kept on disk.
type cacheMeta struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	SHA256  string `json:"sha256"`
	Bytes   int64  `json:"bytes"`
}

// save has the saver write a list's version to Dir.
func (f *Follower) save(name string, v int64, s *blacklist.Set) {
	if f.cfg.Dir == "" {
		return
	}
	f.saveMu.Lock()
	f.saving[name] = saveReq{version: v, set: s}
	f.saveMu.Unlock()
	select {
	case f.saveSig <- struct{}{}:
	default:
	}
}

// saveGap is the least time between two writes of the lists to Dir: a list of
// 10M entries is 17 MiB to encode, hash and write, which a delta a second would
// otherwise cost the node each second. The latest version is written at the
// latest saveGap after it is in force, and at the follower's end.
const saveGap = 5 * time.Second

// saver writes the lists save was given, each its latest, at most every saveGap,
// until ctx is done (then what is left).
func (f *Follower) saver(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			f.flush()
			return
		case <-f.saveSig:
			if wait := saveGap - time.Since(last); !last.IsZero() && wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					f.flush()
					return
				case <-t.C:
				}
			}
			f.flush()
			last = time.Now()
		}
	}
}

func (f *Follower) flush() {
	f.saveMu.Lock()
	reqs := f.saving
	f.saving = map[string]saveReq{}
	f.saveMu.Unlock()
	for name, r := range reqs {
		if err := writeCache(f.cfg.Dir, name, r.version, r.set); err != nil {
			f.log.Warn("blsync: keeping the blacklist on disk", "list", name, "version", r.version, "err", err)
		}
	}
}

// writeCache writes a list and its record to dir, the list first.
func writeCache(dir, name string, v int64, s *blacklist.Set) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := blacklist.WriteBinary(&buf, s); err != nil {
		return err
	}
	data := buf.Bytes()
	if err := daemon.WriteFileAtomic(filepath.Join(dir, name+".bl"), 0o600, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}); err != nil {
		return err
	}
	meta, err := json.Marshal(cacheMeta{Name: name, Version: v, SHA256: sum(data), Bytes: int64(len(data))})
	if err != nil {
		return err
	}
	return daemon.WriteFileAtomic(filepath.Join(dir, name+".json"), 0o600, func(w io.Writer) error {
		_, err := w.Write(meta)
		return err
	})
}

// readCache reads a list kept in dir and checks it against its record.
func readCache(dir, name string) (*blacklist.Set, int64, error) {
	meta, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		return nil, 0, err
	}
	var cm cacheMeta
	if err := json.Unmarshal(meta, &cm); err != nil || cm.Name != name {
		return nil, 0, fmt.Errorf("%s.json: not the record of list %s (%v)", name, name, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, name+".bl"))
	if err != nil {
		return nil, 0, err
	}
	if int64(len(data)) != cm.Bytes || sum(data) != cm.SHA256 {
		return nil, 0, fmt.Errorf("%s.bl is not the version %d its record names: %w", name, cm.Version, ErrCorrupt)
	}
	s, err := blacklist.ReadBinary(bytes.NewReader(data))
	if err != nil {
		return nil, 0, fmt.Errorf("%s.bl: %w", name, err)
	}
	return s, cm.Version, nil
}

// loadDir puts in force the lists kept in Dir that the node enforces.
func (f *Follower) loadDir() {
	if f.cfg.Dir == "" || f.cfg.VerifyOnly {
		return
	}
	files, _ := filepath.Glob(filepath.Join(f.cfg.Dir, "*.json"))
	loaded := false
	for _, p := range files {
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		if CheckName(name) != nil {
			continue
		}
		l := f.cfg.List(name)
		if l == nil {
			continue
		}
		s, v, err := readCache(f.cfg.Dir, name)
		if err != nil {
			f.log.Warn("blsync: a blacklist kept on disk is not loaded", "list", name, "err", err)
			continue
		}
		l.Replace(s)
		f.mu.Lock()
		f.versions[name] = v
		f.lists[name] = l
		f.mu.Unlock()
		f.version.WithLabelValues(name).Set(float64(v))
		loaded = true
		f.log.Info("blsync: blacklist loaded from disk", "list", name, "version", v, "entries", s.Len())
	}
	if loaded && f.cfg.Changed != nil {
		f.cfg.Changed()
	}
}
