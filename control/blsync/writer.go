package blsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Defaults of WriterConfig.
const (
	DefaultCompactDeltas = 256
	DefaultCompactBytes  = 16 << 20
	// DefaultQuotaShare is the share of the store's quota a replace may fill.
	DefaultQuotaShare = 0.8
)

// WriterConfig configures a Writer. The zero value of each field means its
// default.
type WriterConfig struct {
	// CompactDeltas is how many deltas a list keeps after its base before they are
	// compacted into a new base (in the background, after the delta that passed it
	// is stored). Default 256.
	CompactDeltas int
	// CompactBytes is how many bytes of deltas a list keeps before they are
	// compacted. Default 16 MiB.
	CompactBytes int64
	// QuotaShare is the share of the store's backend quota in use (history not yet
	// compacted included) past which a replace is refused (store.ErrNoSpace) rather
	// than written: the quota reached would refuse every write of the configuration
	// too. Default 0.8.
	QuotaShare float64
	// Logger receives the writer's logs. Default slog.Default().
	Logger *slog.Logger
}

// Writer writes lists to the store (controld's side). Its methods are safe for
// concurrent use; writes of one list are serialized by the manifest's revision.
type Writer struct {
	cli *clientv3.Client
	cfg WriterConfig
	log *slog.Logger
	now func() time.Time

	mu         sync.Mutex
	bases      map[string]cachedBase // the last base each list was written or read with
	compacting map[string]bool
	wg         sync.WaitGroup
}

type cachedBase struct {
	version int64
	sums    string // the chunks' sums, joined: which base it is
	set     *blacklist.Set
}

// NewWriter returns a Writer of lists in st.
func NewWriter(st *store.Store, cfg WriterConfig) *Writer {
	if cfg.CompactDeltas <= 0 {
		cfg.CompactDeltas = DefaultCompactDeltas
	}
	if cfg.CompactBytes <= 0 {
		cfg.CompactBytes = DefaultCompactBytes
	}
	if cfg.QuotaShare <= 0 || cfg.QuotaShare > 1 {
		cfg.QuotaShare = DefaultQuotaShare
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Writer{cli: st.Client(), cfg: cfg, log: cfg.Logger, now: time.Now,
		bases: map[string]cachedBase{}, compacting: map[string]bool{}}
}

// Wait waits for the compactions running in the background.
func (w *Writer) Wait() { w.wg.Wait() }

// ErrNotFound is the error of a list that does not exist; it matches
// store.ErrNotFound.
var ErrNotFound = store.ErrNotFound

// errConflict is a manifest changed by another writer between its read and the
// write, too often.
var errConflict = fmt.Errorf("blacklist: the list kept changing under the write; try again: %w", store.ErrConflict)

const maxTries = 8

// Show returns a list's manifest and its mod revision.
func (w *Writer) Show(ctx context.Context, name string) (*Manifest, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	m, _, err := readManifest(ctx, w.cli, name, 0)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("blacklist %s: %w", name, ErrNotFound)
	}
	return m, nil
}

// Lists returns the manifest of every list, by name.
func (w *Writer) Lists(ctx context.Context) ([]*Manifest, error) {
	resp, err := w.cli.Get(ctx, Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("listing the blacklists: %w", err)
	}
	var out []*Manifest
	for _, kv := range resp.Kvs {
		name, ok := manifestName(string(kv.Key))
		if !ok {
			continue
		}
		m, _, err := readManifest(ctx, w.cli, name, resp.Header.Revision)
		if err != nil {
			return nil, err
		}
		if m != nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// manifestName returns the list's name of a manifest key.
func manifestName(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "/manifest")
	return name, ok && CheckName(name) == nil
}

// readManifest reads a list's manifest at rev (0: now): nil when there is none,
// and its mod revision.
func readManifest(ctx context.Context, cli *clientv3.Client, name string, rev int64) (*Manifest, int64, error) {
	var opts []clientv3.OpOption
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := cli.Get(ctx, ManifestKey(name), opts...)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the manifest of blacklist %s: %w", name, wrapErr(err))
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	m, err := DecodeManifest(name, resp.Kvs[0].Value)
	if err != nil {
		return nil, 0, err
	}
	return m, resp.Kvs[0].ModRevision, nil
}

// Read returns a list as it is now, whole, and its manifest.
func (w *Writer) Read(ctx context.Context, name string) (*blacklist.Set, *Manifest, error) {
	if err := CheckName(name); err != nil {
		return nil, nil, err
	}
	resp, err := w.cli.Get(ctx, ManifestKey(name))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the manifest of blacklist %s: %w", name, wrapErr(err))
	}
	if len(resp.Kvs) == 0 {
		return nil, nil, fmt.Errorf("blacklist %s: %w", name, ErrNotFound)
	}
	m, err := DecodeManifest(name, resp.Kvs[0].Value)
	if err != nil {
		return nil, nil, err
	}
	s, err := w.load(ctx, m, resp.Header.Revision)
	return s, m, err
}

// load builds the list of m from the store at rev, its base from the cache when
// it holds it.
func (w *Writer) load(ctx context.Context, m *Manifest, rev int64) (*blacklist.Set, error) {
	key := sumsOf(m.Base.Chunks)
	w.mu.Lock()
	c, ok := w.bases[m.Name]
	w.mu.Unlock()
	var base *blacklist.Set
	if ok && c.sums == key {
		base = c.set
	} else {
		var err error
		if base, err = fetchBase(ctx, w.cli, m, rev); err != nil {
			return nil, err
		}
		w.remember(m, base)
	}
	ds, err := fetchDeltas(ctx, w.cli, m.Name, m.Deltas.From, m.Deltas.To, rev)
	if err != nil {
		return nil, err
	}
	return applyDeltas(m.Name, base, ds)
}

func (w *Writer) remember(m *Manifest, base *blacklist.Set) {
	w.mu.Lock()
	w.bases[m.Name] = cachedBase{version: m.Base.Version, sums: sumsOf(m.Base.Chunks), set: base}
	w.mu.Unlock()
}

func sumsOf(cs []ChunkRef) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.SHA256)
	}
	return b.String()
}

// Replace makes s the whole list name, as a new base: its chunks are written
// first (those the store does not hold yet), then the manifest, in a transaction
// that requires every chunk it names to exist, then the chunks and deltas no
// longer named are deleted. It returns the list's new version.
func (w *Writer) Replace(ctx context.Context, name string, s *blacklist.Set, who string) (int64, error) {
	if err := CheckName(name); err != nil {
		return 0, err
	}
	if s == nil {
		s = new(blacklist.Builder).Build()
	}
	// Each chunk is written as soon as it is encoded, so that the nodes receive the
	// first (the watch delivers them) while the others are encoded; past the
	// quota's share, those written are deleted and nothing else changes.
	inUse, limit := w.quota(ctx)
	var (
		total   atomic.Int64
		mu      sync.Mutex
		created []string
	)
	chunks, err := encodeChunksEach(s, func(c chunk) error {
		if n := total.Add(int64(len(c.data))); limit > 0 && inUse+n > limit {
			return fmt.Errorf("%d bytes or more would take the store's %d bytes in use past %.0f%% of its quota: %w",
				n, inUse, 100*w.cfg.QuotaShare, store.ErrNoSpace)
		}
		made, err := w.putChunk(ctx, name, c)
		if made {
			mu.Lock()
			created = append(created, ChunkKey(name, c.ref.SHA256))
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		w.dropChunks(name, created)
		return 0, fmt.Errorf("blacklist %s: %w", name, err)
	}
	written := true // the chunks exist: the first commit does not write them again
	for try := 0; try < maxTries; try++ {
		m, rev, err := readManifest(ctx, w.cli, name, 0)
		if err != nil {
			return 0, err
		}
		if m == nil {
			m = &Manifest{Name: name}
		}
		next := &Manifest{Name: name, Version: m.Version + 1, Entries: int64(s.Len()), Updated: w.now().UTC(), Who: who,
			Base: Base{Entries: int64(s.Len()), Bytes: total.Load(), Chunks: make([]ChunkRef, len(chunks))}}
		next.Base.Version = next.Version
		for i, c := range chunks {
			next.Base.Chunks[i] = c.ref
		}
		put := chunks
		if written {
			put = nil
		}
		written = false // a manifest changed meanwhile: its writer may have deleted them
		ok, err := w.commitBase(ctx, next, rev, put, nil)
		if err != nil {
			return 0, err
		}
		if ok {
			w.remember(next, s)
			w.log.Info("blacklist replaced", "list", name, "version", next.Version, "entries", s.Len(), "chunks", len(chunks), "bytes", next.Base.Bytes, "who", who)
			return next.Version, nil
		}
	}
	return 0, errConflict
}

// commitBase writes chunks (those missing) then the manifest next, if the
// manifest is still at rev (0: absent) and every chunk exists; it deletes the
// deltas up to next's base and, after, every chunk next does not name. extra are
// more puts of the manifest's transaction. It reports false when the manifest
// changed.
func (w *Writer) commitBase(ctx context.Context, next *Manifest, rev int64, chunks []chunk, extra []clientv3.Op) (bool, error) {
	name := next.Name
	if err := w.putChunks(ctx, name, chunks); err != nil {
		return false, err
	}
	data, err := jsonMarshal(next)
	if err != nil {
		return false, err
	}
	cmps := []clientv3.Cmp{manifestIs(name, rev)}
	for _, c := range next.Base.Chunks {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(ChunkKey(name, c.SHA256)), ">", 0))
	}
	ops := append([]clientv3.Op{
		clientv3.OpPut(ManifestKey(name), string(data)),
		clientv3.OpDelete(DeltaKey(name, 0), clientv3.WithRange(DeltaKey(name, next.Base.Version+1))),
	}, extra...)
	resp, err := w.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("writing the manifest of blacklist %s: %w", name, wrapErr(err))
	}
	if !resp.Succeeded {
		return false, nil
	}
	if err := w.collect(ctx, name, resp.Header.Revision, next); err != nil {
		w.log.Warn("blacklist: deleting the chunks no longer named", "list", name, "err", err)
	}
	return true, nil
}

// manifestIs compares a manifest's mod revision with rev (0: absent).
func manifestIs(name string, rev int64) clientv3.Cmp {
	if rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(ManifestKey(name)), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(ManifestKey(name)), "=", rev)
}

// putChunks writes the chunks the store does not hold, each in a transaction of
// its own (a chunk is up to 1 MiB, etcd takes 1.5 MiB a request), a few at once.
func (w *Writer) putChunks(ctx context.Context, name string, chunks []chunk) error {
	return parallel(ctx, len(chunks), func(gctx context.Context, i int) error {
		_, err := w.putChunk(gctx, name, chunks[i])
		return err
	})
}

// putChunk writes a chunk unless the store holds it, and reports whether it
// wrote it.
func (w *Writer) putChunk(ctx context.Context, name string, c chunk) (bool, error) {
	key := ChunkKey(name, c.ref.SHA256)
	resp, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(c.data))).Commit()
	if err != nil {
		return false, fmt.Errorf("writing chunk %s of blacklist %s: %w", c.ref.SHA256, name, wrapErr(err))
	}
	return resp.Succeeded, nil
}

// dropChunks deletes the chunks a refused replace wrote, unless the manifest
// names them (another writer's replace then wrote the same).
func (w *Writer) dropChunks(name string, keys []string) {
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, rev, err := readManifest(ctx, w.cli, name, 0)
	if err != nil {
		w.log.Warn("blacklist: deleting the chunks of a refused replace", "list", name, "err", err)
		return
	}
	named := map[string]bool{}
	if m != nil {
		for _, c := range m.Base.Chunks {
			named[ChunkKey(name, c.SHA256)] = true
		}
	}
	var ops []clientv3.Op
	for _, k := range keys {
		if !named[k] {
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := w.cli.Txn(ctx).If(manifestIs(name, rev)).Then(ops[:n]...).Commit(); err != nil {
			w.log.Warn("blacklist: deleting the chunks of a refused replace", "list", name, "err", err)
			return
		}
		ops = ops[n:]
	}
}

// collect deletes the chunks of name that m does not name, while m (at rev) is
// the manifest.
func (w *Writer) collect(ctx context.Context, name string, rev int64, m *Manifest) error {
	keep := make(map[string]bool, len(m.Base.Chunks))
	for _, c := range m.Base.Chunks {
		keep[ChunkKey(name, c.SHA256)] = true
	}
	resp, err := w.cli.Get(ctx, chunkPrefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return wrapErr(err)
	}
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ManifestKey(name)), "=", rev)).Then(ops...).Commit()
		ops = ops[:0]
		return wrapErr(err)
	}
	for _, kv := range resp.Kvs {
		if keep[string(kv.Key)] {
			continue
		}
		ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		if len(ops) == 100 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// quota returns the store's space in use and the share of its quota a replace
// may take it to; limit is 0 when the store does not say (its own quota then
// answers).
func (w *Writer) quota(ctx context.Context) (inUse, limit int64) {
	eps := w.cli.Endpoints()
	if len(eps) == 0 {
		return 0, 0
	}
	st, err := w.cli.Status(ctx, eps[0])
	if err != nil || st.DbSizeQuota <= 0 {
		return 0, 0
	}
	return st.DbSizeInUse, int64(float64(st.DbSizeQuota) * w.cfg.QuotaShare)
}

// Delta changes list name by d (removals, then additions) and returns its new
// version. A list that does not exist is made, empty, first. The delta is stored
// as one record beside the manifest, in the manifest's transaction; one too large
// for that (MaxDeltaBytes) is written as a new base instead.
func (w *Writer) Delta(ctx context.Context, name string, d *blacklist.Delta, who string) (int64, error) {
	return w.DeltaMeta(ctx, name, d, Meta{Who: who})
}

// DeltaMeta is Delta with the reasons of the additions recorded.
func (w *Writer) DeltaMeta(ctx context.Context, name string, d *blacklist.Delta, meta Meta) (int64, error) {
	if err := CheckName(name); err != nil {
		return 0, err
	}
	if d == nil || len(d.Add)+len(d.Remove) == 0 {
		return 0, fmt.Errorf("blacklist %s: an empty delta", name)
	}
	if len(d.Add)+len(d.Remove) > blacklist.MaxEntries {
		return 0, fmt.Errorf("blacklist %s: %w", name, blacklist.ErrTooManyEntries)
	}
	for try := 0; try < maxTries; try++ {
		m, rev, err := readManifest(ctx, w.cli, name, 0)
		if err != nil {
			return 0, err
		}
		if m == nil {
			m = &Manifest{Name: name}
		}
		v := m.Version + 1
		data, err := encodeDelta(v, d, meta, w.now())
		if err != nil {
			return 0, fmt.Errorf("blacklist %s: %w", name, err)
		}
		if len(data) > MaxDeltaBytes {
			return w.replaceBy(ctx, name, d, meta.Who)
		}
		next := *m
		next.Version, next.Updated, next.Who = v, w.now().UTC(), meta.Who
		if next.Deltas.From == 0 {
			next.Deltas.From = v
		}
		next.Deltas.To = v
		next.Deltas.Bytes += int64(len(data))
		next.Entries = max(0, next.Entries+int64(len(d.Add))-int64(len(d.Remove)))
		mdata, err := jsonMarshal(&next)
		if err != nil {
			return 0, err
		}
		resp, err := w.cli.Txn(ctx).If(manifestIs(name, rev)).Then(
			clientv3.OpPut(DeltaKey(name, v), string(data)),
			clientv3.OpPut(ManifestKey(name), string(mdata)),
		).Commit()
		if err != nil {
			return 0, fmt.Errorf("writing delta %d of blacklist %s: %w", v, name, wrapErr(err))
		}
		if !resp.Succeeded {
			continue
		}
		if next.Deltas.Count() >= int64(w.cfg.CompactDeltas) || next.Deltas.Bytes >= w.cfg.CompactBytes {
			w.compactSoon(name)
		}
		return v, nil
	}
	return 0, errConflict
}

// replaceBy writes the list changed by d as a new base.
func (w *Writer) replaceBy(ctx context.Context, name string, d *blacklist.Delta, who string) (int64, error) {
	s, _, err := w.Read(ctx, name)
	if errors.Is(err, ErrNotFound) {
		s, err = new(blacklist.Builder).Build(), nil
	}
	if err != nil {
		return 0, err
	}
	l := blacklist.NewList(name, blacklist.Options{})
	l.Replace(s)
	if err := l.Apply(d); err != nil {
		return 0, err
	}
	return w.Replace(ctx, name, l.Snapshot(), who)
}

// compactSoon compacts a list in the background, unless that is under way.
func (w *Writer) compactSoon(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.compacting[name] {
		return
	}
	w.compacting[name] = true
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer func() {
			w.mu.Lock()
			delete(w.compacting, name)
			w.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := w.Compact(ctx, name); err != nil {
			w.log.Warn("blacklist: compacting the deltas", "list", name, "err", err)
		}
	}()
}

// Compact writes a list's base and deltas as a new base at its version, so that
// its deltas can go. The version stays: the list is the same. Deltas stored
// meanwhile stay after the new base.
func (w *Writer) Compact(ctx context.Context, name string) error {
	resp, err := w.cli.Get(ctx, ManifestKey(name))
	if err != nil {
		return fmt.Errorf("reading the manifest of blacklist %s: %w", name, wrapErr(err))
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("blacklist %s: %w", name, ErrNotFound)
	}
	m, err := DecodeManifest(name, resp.Kvs[0].Value)
	if err != nil {
		return err
	}
	if m.Deltas.Count() == 0 {
		return nil
	}
	s, err := w.load(ctx, m, resp.Header.Revision)
	if err != nil {
		return err
	}
	chunks, err := encodeChunks(s)
	if err != nil {
		return fmt.Errorf("blacklist %s: %w", name, err)
	}
	var total int64
	for _, c := range chunks {
		total += int64(len(c.data))
	}
	at := m.Version
	for try := 0; try < maxTries; try++ {
		cur, rev, err := readManifest(ctx, w.cli, name, 0)
		if err != nil {
			return err
		}
		if cur == nil || cur.Base.Version >= at {
			return nil // replaced or compacted meanwhile
		}
		next := *cur
		next.Base = Base{Version: at, Entries: int64(s.Len()), Bytes: total, Chunks: make([]ChunkRef, len(chunks))}
		for i, c := range chunks {
			next.Base.Chunks[i] = c.ref
		}
		next.Deltas = DeltaRange{}
		next.Entries = int64(s.Len())
		if cur.Version > at { // deltas written since the read stay
			ds, err := fetchDeltaSizes(ctx, w.cli, name, at+1, cur.Version)
			if err != nil {
				return err
			}
			next.Deltas = DeltaRange{From: at + 1, To: cur.Version, Bytes: ds}
			next.Entries = max(0, cur.Entries-m.Entries+int64(s.Len()))
		}
		ok, err := w.commitBase(ctx, &next, rev, chunks, nil)
		if err != nil {
			return err
		}
		if ok {
			w.remember(&next, s)
			w.log.Info("blacklist compacted", "list", name, "base_version", at, "entries", s.Len(), "chunks", len(chunks), "deltas_dropped", m.Deltas.Count())
			return nil
		}
	}
	return errConflict
}

// fetchDeltaSizes returns the bytes of the deltas from..to.
func fetchDeltaSizes(ctx context.Context, cli *clientv3.Client, name string, from, to int64) (int64, error) {
	resp, err := cli.Get(ctx, DeltaKey(name, from), clientv3.WithRange(DeltaKey(name, to+1)))
	if err != nil {
		return 0, wrapErr(err)
	}
	var n int64
	for _, kv := range resp.Kvs {
		n += int64(len(kv.Value))
	}
	return n, nil
}

// fetchBase reads and checks the chunks of m's base at rev and builds them into
// one Set.
func fetchBase(ctx context.Context, cli *clientv3.Client, m *Manifest, rev int64) (*blacklist.Set, error) {
	sets := make([]*blacklist.Set, len(m.Base.Chunks))
	err := parallel(ctx, len(m.Base.Chunks), func(gctx context.Context, i int) error {
		ref := m.Base.Chunks[i]
		resp, err := cli.Get(gctx, ChunkKey(m.Name, ref.SHA256), clientv3.WithRev(rev))
		if err != nil {
			return fmt.Errorf("reading chunk %s of blacklist %s: %w", ref.SHA256, m.Name, wrapErr(err))
		}
		if len(resp.Kvs) == 0 {
			return fmt.Errorf("blacklist %s version %d: chunk %s is missing: %w", m.Name, m.Version, ref.SHA256, ErrCorrupt)
		}
		s, err := decodeChunk(ref, resp.Kvs[0].Value)
		if err != nil {
			return fmt.Errorf("blacklist %s version %d: %w", m.Name, m.Version, err)
		}
		sets[i] = s
		return nil
	})
	if err != nil {
		return nil, err
	}
	return union(sets), nil
}

// union builds the Sets into one.
func union(sets []*blacklist.Set) *blacklist.Set {
	if len(sets) == 1 {
		return sets[0]
	}
	var b blacklist.Builder
	for _, s := range sets {
		for e := range s.All() {
			b.Add(e.Prefix, e.Expires)
		}
	}
	return b.Build()
}

// fetchDeltas reads and decodes the deltas from..to at rev (none when from is 0).
func fetchDeltas(ctx context.Context, cli *clientv3.Client, name string, from, to, rev int64) ([]*blacklist.Delta, error) {
	if from == 0 || from > to {
		return nil, nil
	}
	out := make([]*blacklist.Delta, 0, to-from+1)
	for v := from; v <= to; {
		resp, err := cli.Get(ctx, DeltaKey(name, v), clientv3.WithRange(DeltaKey(name, to+1)), clientv3.WithRev(rev), clientv3.WithLimit(16))
		if err != nil {
			return nil, fmt.Errorf("reading the deltas of blacklist %s from %d: %w", name, v, wrapErr(err))
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) != DeltaKey(name, v) {
				return nil, fmt.Errorf("blacklist %s: delta %d is missing: %w", name, v, ErrCorrupt)
			}
			d, _, err := DecodeDelta(v, kv.Value)
			if err != nil {
				return nil, fmt.Errorf("blacklist %s: %w", name, err)
			}
			out = append(out, d)
			v++
		}
		if len(resp.Kvs) == 0 {
			return nil, fmt.Errorf("blacklist %s: delta %d is missing: %w", name, v, ErrCorrupt)
		}
	}
	return out, nil
}

// applyDeltas returns base changed by ds in order.
func applyDeltas(name string, base *blacklist.Set, ds []*blacklist.Delta) (*blacklist.Set, error) {
	if len(ds) == 0 {
		return base, nil
	}
	d, err := combine(ds)
	if err != nil {
		return nil, fmt.Errorf("blacklist %s: %w", name, err)
	}
	l := blacklist.NewList(name, blacklist.Options{})
	l.Replace(base)
	if err := l.Apply(d); err != nil {
		return nil, err
	}
	return l.Snapshot(), nil
}
