package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
)

// Files in an embedded store's data directory.
const (
	socketName = "etcd.sock"
	etcdSubdir = "etcd"
	lockName   = "lock"
	memberName = "tiergate"
)

// pageSize is the most keys one range request reads; larger lists are read in
// pages at one revision.
const pageSize = 1000

// Store is the cluster configuration in etcd. Its methods are safe for concurrent
// use.
type Store struct {
	cli      *clientv3.Client
	etcd     *embed.Etcd // nil for an external etcd
	lock     *os.File    // the embedded data directory's lock
	log      *slog.Logger
	cfg      Config
	closing  *atomic.Bool
	closeMu  sync.Mutex
	closed   bool
	maxTries int

	grpcMu sync.Mutex
	grpcs  []*grpc.Server // the embedded etcd's, one per client listener

	// watchStarted, when set (by tests), is called with the cancel function of every
	// etcd watch a Watch starts.
	watchStarted func(cancel context.CancelFunc)
}

// Open opens the store that cfg describes: it starts the embedded etcd (waiting
// for it to be ready, within cfg.StartTimeout) or connects to the external one
// (within cfg.DialTimeout), and checks that etcd answers.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Defaults()
	s := &Store{log: cfg.Logger, cfg: cfg, closing: new(atomic.Bool), maxTries: 10}
	endpoints := cfg.Endpoints
	if len(endpoints) == 0 {
		ep, err := s.startEmbedded(ctx)
		if err != nil {
			return nil, err
		}
		endpoints = []string{ep}
	}
	ccfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: cfg.DialTimeout.D(),
		Logger:      newZapLogger(s.log, "etcd-client", s.closing),
		Context:     context.Background(),
	}
	if cfg.PasswordFile != "" {
		pw, err := readPassword(cfg.PasswordFile)
		if err != nil {
			s.stopEmbedded()
			return nil, err
		}
		ccfg.Username, ccfg.Password = cfg.Username, pw
	}
	if cfg.CertFile != "" || cfg.CAFile != "" {
		tlsInfo := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		tc, err := tlsInfo.ClientConfig()
		if err != nil {
			s.stopEmbedded()
			return nil, fmt.Errorf("store: TLS to etcd: %w", err)
		}
		ccfg.TLS = tc
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		s.stopEmbedded()
		return nil, fmt.Errorf("store: connecting to etcd at %v: %w", endpoints, err)
	}
	s.cli = cli
	// The client connects lazily: ask for something, within the dial timeout, so a
	// wrong address or certificate fails Open rather than the first request.
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout.D())
	defer cancel()
	if _, err := cli.Get(pctx, headKey); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: reaching etcd at %v: %w", endpoints, err)
	}
	return s, nil
}

// readPassword returns the first line of the file at path.
func readPassword(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("store: etcd password: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return "", fmt.Errorf("store: etcd password: %s is empty", path)
	}
	return line, nil
}

// startEmbedded starts the embedded etcd in cfg.Dir and returns its client URL.
func (s *Store) startEmbedded(ctx context.Context) (string, error) {
	dir := absDir(s.cfg.Dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("store: creating the data directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("store: data directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", fmt.Errorf("store: data directory lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return "", fmt.Errorf("store: data directory %s is in use by another process: %w", dir, err)
	}
	s.lock = lock
	// A socket left by a process that died; the lock says none uses it now.
	sock := filepath.Join(dir, socketName)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.unlock()
		return "", fmt.Errorf("store: removing a stale socket: %w", err)
	}
	clientURL := url.URL{Scheme: "unix", Path: sock}
	// The one member is named and addressed as etcd requires, but nothing listens
	// on its peer URL: a single member never dials its own.
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:2380"}

	ec := embed.NewConfig()
	ec.Name = memberName
	ec.Dir = filepath.Join(dir, etcdSubdir)
	ec.ListenClientUrls = []url.URL{clientURL}
	if s.cfg.ListenClientURL != "" {
		u, err := url.Parse(s.cfg.ListenClientURL)
		if err != nil { // Validate parsed it
			s.unlock()
			return "", fmt.Errorf("store: listen_client_url: %w", err)
		}
		u.Path = ""
		ec.ListenClientUrls = append(ec.ListenClientUrls, *u)
	}
	ec.AdvertiseClientUrls = []url.URL{clientURL}
	ec.ListenPeerUrls = nil
	ec.AdvertisePeerUrls = []url.URL{peerURL}
	ec.InitialCluster = memberName + "=" + peerURL.String()
	ec.InitialClusterToken = "tiergate"
	ec.EnableGRPCGateway = false
	ec.AutoCompactionMode = embed.CompactorModeRevision
	ec.AutoCompactionRetention = strconv.FormatInt(s.cfg.CompactionRetention, 10)
	ec.QuotaBackendBytes = s.cfg.QuotaBackendBytes
	ec.SnapshotCount = s.cfg.SnapshotCount
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(s.log, "etcd", s.closing))
	ec.ServiceRegister = func(g *grpc.Server) {
		s.grpcMu.Lock()
		s.grpcs = append(s.grpcs, g)
		s.grpcMu.Unlock()
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		s.unlock()
		return "", fmt.Errorf("store: starting the embedded etcd in %s: %w", ec.Dir, err)
	}
	s.etcd = e
	timer := time.NewTimer(s.cfg.StartTimeout.D())
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		s.stopEmbedded()
		return "", fmt.Errorf("store: the embedded etcd failed to start: %w", err)
	case <-timer.C:
		s.stopEmbedded()
		return "", fmt.Errorf("store: the embedded etcd was not ready within %v", s.cfg.StartTimeout)
	case <-ctx.Done():
		s.stopEmbedded()
		return "", fmt.Errorf("store: starting the embedded etcd: %w", ctx.Err())
	}
	s.log.Info("embedded etcd ready", "dir", ec.Dir, "socket", sock, "client_urls", strings.Join(s.ClientURLs(), " "),
		"quota_backend_bytes", ec.QuotaBackendBytes, "compaction_retention_revisions", s.cfg.CompactionRetention)
	return clientURL.String(), nil
}

// embeddedStopGrace is how long the embedded etcd's requests in flight are given
// to finish when it stops, before its open streams are cut. The nodes' watches
// never end of their own: etcd's Close waits for them its request timeout (7 s)
// on each client listener in turn, 14 s with the socket and a TCP listener.
const embeddedStopGrace = 2 * time.Second

// stopEmbedded stops the embedded etcd, if any, and releases the data directory.
func (s *Store) stopEmbedded() {
	if s.etcd != nil {
		s.closing.Store(true)
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.etcd.Close()
		}()
		t := time.NewTimer(embeddedStopGrace)
		select {
		case <-done:
		case <-t.C:
			s.grpcMu.Lock()
			gs := slices.Clone(s.grpcs)
			s.grpcMu.Unlock()
			for _, g := range gs {
				g.Stop() // ends the GracefulStop etcd waits on, and the streams
			}
			<-done
		}
		t.Stop()
		s.etcd = nil
	}
	s.unlock()
}

func (s *Store) unlock() {
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
}

// Close closes the client and stops the embedded etcd, if any, which first
// finishes the requests it is serving.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.closing.Store(true)
	var err error
	if s.cli != nil {
		err = s.cli.Close()
		if errors.Is(err, context.Canceled) {
			err = nil
		}
	}
	s.stopEmbedded()
	return err
}

// ClientURLs returns the client URLs of the etcd the Store uses, as other
// processes reach it: for an embedded etcd, the unix socket and the loopback URL
// of Config.ListenClientURL (with the port it got, for port 0); for an external
// one, Config.Endpoints. Nodes are given these as their etcd_endpoints. The
// socket comes first: etcd keeps its listeners in no fixed order.
func (s *Store) ClientURLs() []string {
	if s.etcd == nil {
		return slices.Clone(s.cfg.Endpoints)
	}
	var out []string
	for _, l := range s.etcd.Clients {
		switch a := l.Addr().(type) {
		case *net.UnixAddr:
			out = append(out, "unix://"+a.Name)
		case *net.TCPAddr:
			out = append(out, "http://"+a.String())
		}
	}
	slices.SortStableFunc(out, func(a, b string) int {
		return cmp.Compare(urlRank(a), urlRank(b))
	})
	return out
}

// urlRank orders client URLs: the unix socket before TCP.
func urlRank(u string) int {
	if strings.HasPrefix(u, "unix://") {
		return 0
	}
	return 1
}

// Client returns the etcd client, for what the Store does not wrap (leases).
func (s *Store) Client() *clientv3.Client { return s.cli }

// Settings returns the settings of the etcd the Store uses: for the embedded one,
// as its running server holds them; the quota as the server's status reports it.
func (s *Store) Settings(ctx context.Context) (Settings, error) {
	st := Settings{Embedded: s.etcd != nil, Endpoints: s.cli.Endpoints()}
	if e := s.etcd; e != nil {
		c := &e.Server.Cfg
		st.CompactionMode = c.AutoCompactionMode
		st.CompactionRetention = int64(c.AutoCompactionRetention) // revisions, in revision mode
		st.SnapshotCount = c.SnapshotCount
		st.MaxRequestBytes = c.MaxRequestBytes
	}
	status, err := s.cli.Status(ctx, st.Endpoints[0])
	if err != nil {
		return st, fmt.Errorf("store: status of %s: %w", st.Endpoints[0], err)
	}
	st.QuotaBackendBytes = status.DbSizeQuota
	return st, nil
}

// Get returns the object of kind and name, or ErrNotFound.
func (s *Store) Get(ctx context.Context, kind, name string) (Object, error) {
	return s.get(ctx, kind, name, 0)
}

// GetAt returns the object as it was at revision rev: ErrNotFound when it did not
// exist then, ErrCompacted when compaction dropped that revision.
func (s *Store) GetAt(ctx context.Context, kind, name string, rev int64) (Object, error) {
	if rev <= 0 {
		return Object{}, fmt.Errorf("store: revision %d: want a revision above 0", rev)
	}
	return s.get(ctx, kind, name, rev)
}

func (s *Store) get(ctx context.Context, kind, name string, rev int64) (Object, error) {
	if err := checkKey(kind, name); err != nil {
		return Object{}, fmt.Errorf("store: %w", err)
	}
	var opts []clientv3.OpOption
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cli.Get(ctx, Key(kind, name), opts...)
	if err != nil {
		return Object{}, fmt.Errorf("store: reading %s/%s: %w", kind, name, wrapErr(err))
	}
	if len(resp.Kvs) == 0 {
		if rev > 0 {
			return Object{}, fmt.Errorf("store: %s/%s at revision %d: %w", kind, name, rev, ErrNotFound)
		}
		return Object{}, fmt.Errorf("store: %s/%s: %w", kind, name, ErrNotFound)
	}
	return object(kind, name, resp.Kvs[0]), nil
}

// object makes an Object of an etcd key-value.
func object(kind, name string, kv *mvccpb.KeyValue) Object {
	return Object{
		Kind: kind, Name: name, Value: kv.Value,
		ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version,
	}
}

// wrapErr maps etcd's errors to the Store's where they have a meaning of their
// own, keeping etcd's text.
func wrapErr(err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w (%v)", ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrNoSpace):
		return fmt.Errorf("%w (%v)", ErrNoSpace, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("%w (%v)", ErrTooLarge, err)
	}
	return err
}

// List returns the objects of kind, sorted by name, all at one revision, which it
// returns.
func (s *Store) List(ctx context.Context, kind string) ([]Object, int64, error) {
	if err := CheckKind(kind); err != nil {
		return nil, 0, fmt.Errorf("store: %w", err)
	}
	var out []Object
	rev, err := s.rangeAll(ctx, kindPrefix(kind), 0, func(kv *mvccpb.KeyValue) {
		if k, n, ok := splitKey(string(kv.Key)); ok && k == kind {
			out = append(out, object(k, n, kv))
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("store: listing %s: %w", kind, err)
	}
	return out, rev, nil
}

// Snapshot returns every object at the current revision.
func (s *Store) Snapshot(ctx context.Context) (*Snapshot, error) {
	snap, _, err := s.snapshot(ctx)
	return snap, err
}

// snapshot reads every object and the head key's mod revision at one revision.
func (s *Store) snapshot(ctx context.Context) (*Snapshot, int64, error) {
	head, err := s.cli.Get(ctx, headKey)
	if err != nil {
		return nil, 0, fmt.Errorf("store: reading a snapshot: %w", wrapErr(err))
	}
	var headRev int64
	if len(head.Kvs) > 0 {
		headRev = head.Kvs[0].ModRevision
	}
	rev := head.Header.Revision
	snap := &Snapshot{Revision: rev, objects: map[string]map[string]Object{}}
	if _, err := s.rangeAll(ctx, Prefix, rev, func(kv *mvccpb.KeyValue) {
		if k, n, ok := splitKey(string(kv.Key)); ok {
			snap.put(object(k, n, kv))
		}
	}); err != nil {
		return nil, 0, fmt.Errorf("store: reading a snapshot at revision %d: %w", rev, err)
	}
	return snap, headRev, nil
}

// rangeAll calls fn for every key under prefix at revision rev (0: the current
// one), in key order, reading pageSize keys at a time, and returns the revision.
func (s *Store) rangeAll(ctx context.Context, prefix string, rev int64, fn func(*mvccpb.KeyValue)) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	key := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(pageSize), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return 0, wrapErr(err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			fn(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// History returns the revisions of an object, newest first, up to limit of them (0:
// no bound): each as it was after one of its changes, back to its creation or to
// the oldest revision compaction left (the last one then has a Version above 1).
// ErrNotFound when the object does not exist now.
func (s *Store) History(ctx context.Context, kind, name string, limit int) ([]Object, error) {
	cur, err := s.Get(ctx, kind, name)
	if err != nil {
		return nil, err
	}
	out := []Object{cur}
	for o := cur; o.Version > 1 && (limit <= 0 || len(out) < limit); {
		prev, err := s.GetAt(ctx, kind, name, o.ModRevision-1)
		if errors.Is(err, ErrCompacted) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("store: history of %s/%s: %w", kind, name, err)
		}
		out = append(out, prev)
		o = prev
	}
	return out, nil
}

// Compact drops the history before revision rev, as the embedded etcd's
// auto-compaction does on its own; a watch that has not reached rev yet gets a
// reset. For operators and tests.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if _, err := s.cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("store: compacting to revision %d: %w", rev, wrapErr(err))
	}
	return nil
}
