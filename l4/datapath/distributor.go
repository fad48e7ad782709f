package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Options are how a Distributor runs, as opposed to what it forwards (Config).
type Options struct {
	// External is the port towards clients and routers. Required.
	External port.Port
	// Internal is the port towards members. Default: External (one port for both).
	Internal port.Port
	// Workers is the number of run-to-completion loops; worker i polls RX queue i
	// of each port and transmits on TX queue i. Every port needs at least Workers
	// RX and TX queues. Worker 0 also transmits the control goroutine's frames
	// (ARP, ND) between bursts. Default 1.
	Workers int
	// Burst is the most packets received at once. Default 32, at most 256.
	Burst int
	// IdleSleep is how long a worker sleeps after 64 empty polls in a row, so an
	// idle LD does not spin. Default 50µs; negative means never sleep (busy poll,
	// what a dedicated core wants).
	IdleSleep time.Duration
	// WorkerInit, when set, is called on each worker's locked OS thread before it
	// polls (for DPDK: register the thread as an lcore); the function it returns
	// is called when the worker stops.
	WorkerInit func(worker int) (cleanup func(), err error)
	// HashSeed seeds the flow hash. LDs of one cluster must share it so that a flow
	// that moves between LDs (ECMP change) keeps its member. Default a fixed value.
	HashSeed uint64
	// Registerer receives the metrics. Default: none registered.
	Registerer prometheus.Registerer
	// Logger receives the logs. Default slog.Default().
	Logger *slog.Logger
}

// ErrClosed is returned by operations on a Distributor that has been shut down.
var ErrClosed = errors.New("datapath: distributor closed")

// Distributor is the L4 load distributor: workers that forward packets between
// the ports, and one control goroutine that owns the configuration, neighbour
// resolution and health checks and publishes immutable snapshots the workers
// read without locks.
type Distributor struct {
	opts    Options
	log     *slog.Logger
	snap    atomic.Pointer[snapshot]
	workers []*worker
	// bl is the blacklists in force (SetBlacklists), nil for none; the workers
	// read it for every packet to a VIP.
	bl atomic.Pointer[[]*blacklist.List]
	// sync is session sync's shared state (sync.go), nil when off.
	sync *syncShared
	// ov is overload protection and the rules' limits (overload.go).
	ov ovShared

	ctlFrames  chan ctlFrame // from workers to the control goroutine
	ctlTx      chan ctlFrame // from the control goroutine to worker 0, to transmit
	ctlResolve chan netip.Addr
	ops        chan func(*control)
	ctl        *control

	// Neighbour table counters, written by the control goroutine.
	neighCount     atomic.Int64
	neighEvictions atomic.Uint64
	neighRefused   atomic.Uint64

	epoch time.Time // origin of the workers' nanosecond clock

	stop      atomic.Bool
	started   atomic.Bool
	startMu   sync.Mutex // orders Run's start after the operations do runs in place
	done      chan struct{}
	runErr    error
	closeOnce sync.Once
	closed    chan struct{}
}

// NewDistributor validates cfg and opts and prepares the workers' tables; Run
// starts forwarding.
func NewDistributor(cfg Config, opts Options) (*Distributor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("datapath: invalid config: %w", err)
	}
	if opts.External == nil {
		return nil, errors.New("datapath: Options.External is required")
	}
	if opts.Internal == nil {
		opts.Internal = opts.External
	}
	if opts.Workers == 0 {
		opts.Workers = 1
	}
	if opts.Burst == 0 {
		opts.Burst = defaultBurst
	}
	if opts.Burst < 1 || opts.Burst > maxBurst {
		return nil, fmt.Errorf("datapath: burst %d is outside 1..%d", opts.Burst, maxBurst)
	}
	if opts.IdleSleep == 0 {
		opts.IdleSleep = 50 * time.Microsecond
	}
	if opts.HashSeed == 0 {
		opts.HashSeed = 0x9e3779b97f4a7c15
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	for _, p := range []port.Port{opts.External, opts.Internal} {
		if p.RxQueues() < opts.Workers || p.TxQueues() < opts.Workers {
			return nil, fmt.Errorf("datapath: port %s has %d RX and %d TX queues; %d workers need as many of each",
				p.Name(), p.RxQueues(), p.TxQueues(), opts.Workers)
		}
	}
	cfg = cfg.withDefaults()
	d := &Distributor{
		opts:       opts,
		log:        opts.Logger,
		ctlFrames:  make(chan ctlFrame, 1024),
		ctlTx:      make(chan ctlFrame, 256),
		ctlResolve: make(chan netip.Addr, 256),
		ops:        make(chan func(*control)),
		done:       make(chan struct{}),
		closed:     make(chan struct{}),
		epoch:      time.Now(),
	}
	ct := cfg.Conntrack
	ct.Capacity = max(1, cfg.Conntrack.Capacity/opts.Workers)
	for i := range opts.Workers {
		t, err := conntrack.New(ct)
		if err != nil {
			return nil, fmt.Errorf("datapath: connection table: %w", err)
		}
		w := &worker{
			d: d, id: i, ext: opts.External, int: opts.Internal,
			onePort: opts.Internal == opts.External, table: t, seed: opts.HashSeed,
			burst: opts.Burst, extMAC: packet.MAC(opts.External.MAC()), intMAC: packet.MAC(opts.Internal.MAC()),
			rx:        make([]port.Buf, opts.Burst),
			pk:        make([]packet.Packet, opts.Burst),
			perr:      make([]error, opts.Burst),
			hash:      make([]uint64, opts.Burst),
			txExt:     make([]port.Buf, 0, opts.Burst),
			txInt:     make([]port.Buf, 0, opts.Burst),
			txExtMeta: make([]counted, 0, opts.Burst),
			txIntMeta: make([]counted, 0, opts.Burst),
			drop:      make([]port.Buf, 0, opts.Burst),
			pub:       new(published),
			txOne:     make([]port.Buf, 1),
			ipid:      uint16(i) << 12,
		}
		d.workers = append(d.workers, w)
	}
	c, err := newControl(d, cfg)
	if err != nil {
		return nil, err
	}
	d.ctl = c
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(&collector{d: d}); err != nil {
			return nil, fmt.Errorf("datapath: registering metrics: %w", err)
		}
	}
	return d, nil
}

// Run forwards packets until ctx is done or Shutdown is called. It returns the
// first worker start-up error, or nil after a clean stop.
func (d *Distributor) Run(ctx context.Context) error {
	// Under startMu, so that an operation do runs in place (before Run) has
	// ended before the control goroutine owns the state.
	d.startMu.Lock()
	if !d.started.CompareAndSwap(false, true) {
		d.startMu.Unlock()
		return errors.New("datapath: Run called twice")
	}
	d.startMu.Unlock()
	defer close(d.done)
	var wg sync.WaitGroup
	errc := make(chan error, len(d.workers))
	for _, w := range d.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if d.opts.WorkerInit != nil {
				cleanup, err := d.opts.WorkerInit(w.id)
				if err != nil {
					errc <- fmt.Errorf("datapath: starting worker %d: %w", w.id, err)
					d.stop.Store(true)
					return
				}
				if cleanup != nil {
					defer cleanup()
				}
			}
			w.run(&d.stop, d.opts.IdleSleep)
		}()
	}
	ctlDone := make(chan struct{})
	go func() {
		defer close(ctlDone)
		d.ctl.run(ctx, d.closed)
	}()
	select {
	case <-ctx.Done():
	case <-d.closed:
	case err := <-errc:
		d.runErr = err
	}
	d.stop.Store(true)
	d.closeOnce.Do(func() { close(d.closed) })
	wg.Wait()
	<-ctlDone
	select {
	case err := <-errc:
		if d.runErr == nil {
			d.runErr = err
		}
	default:
	}
	return d.runErr
}

// Shutdown stops the workers and the control goroutine and waits for them, or for
// ctx.
func (d *Distributor) Shutdown(ctx context.Context) error {
	d.closeOnce.Do(func() { close(d.closed) })
	if !d.started.Load() {
		return nil
	}
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// do runs op on the control goroutine (the owner of all control state) and waits
// for it.
func (d *Distributor) do(op func(*control)) error {
	if !d.started.Load() {
		d.startMu.Lock()
		if !d.started.Load() {
			// Not running: no goroutine owns the state yet; the caller is the owner
			// (and Run waits for it to finish before it starts the control goroutine).
			defer d.startMu.Unlock()
			op(d.ctl)
			return nil
		}
		d.startMu.Unlock()
	}
	done := make(chan struct{})
	select {
	case d.ops <- func(c *control) { op(c); close(done) }:
	case <-d.closed:
		return ErrClosed
	}
	select {
	case <-done:
		return nil
	case <-d.closed:
		return ErrClosed
	}
}

// Apply validates cfg and swaps it in atomically: new flows follow it at once;
// existing flows keep their members while those are configured, and while they
// last when their member was removed. New conntrack timeouts apply to each entry
// from its next packet; the capacity is fixed by NewDistributor.
func (d *Distributor) Apply(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("datapath: invalid config: %w", err)
	}
	var err error
	if e := d.do(func(c *control) { err = c.apply(cfg.withDefaults()) }); e != nil {
		return e
	}
	return err
}

// ErrNoMember is returned by SetDrained for a member that is not configured.
var ErrNoMember = errors.New("datapath: no such member")

// SetDrained drains (true) or undrains a member: a drained member gets no new
// flows; its existing flows stay until they end.
func (d *Distributor) SetDrained(pool, member string, drained bool) error {
	var err error
	if e := d.do(func(c *control) { err = c.setDrained(pool, member, drained) }); e != nil {
		return e
	}
	return err
}

// Config returns the configuration in force (defaults filled in).
func (d *Distributor) Config() Config {
	var cfg Config
	_ = d.do(func(c *control) { cfg = c.cfg })
	return cfg
}

// SetBlacklists puts lists in force: a packet to a VIP whose source is on one of them
// is dropped, counted as blacklisted (and as a packet hit of the list that has it,
// blacklist.SourcePacket): no connection-table entry, nothing tunnelled, so a listed
// client never costs a member a handshake. A TCP or UDP packet is looked up when it
// would make a new flow (a SYN, or any packet of a flow not in the table) and when it
// is routed by its QUIC connection ID; fragments and ICMP every time. Packets of flows
// in the table are not looked up, which keeps the established-flow rate: instead,
// when the lists or what they hold change, each worker sweeps its table (a few dozen
// entries per loop, about a second for a million flows under load) and removes the
// flows whose client is now listed, so that their next packet is a new flow, dropped.
// Replies from members are not checked. A list's contents change under it
// (blacklist.List swaps its Set); lists stay in force until the next call. No lists
// (or only nil ones) means no check.
func (d *Distributor) SetBlacklists(lists ...*blacklist.List) {
	var in []*blacklist.List
	for _, l := range lists {
		if l != nil {
			in = append(in, l)
		}
	}
	if len(in) == 0 {
		d.bl.Store(nil)
		return
	}
	d.bl.Store(&in)
}

// Blacklists returns the lists SetBlacklists put in force.
func (d *Distributor) Blacklists() []*blacklist.List {
	if p := d.bl.Load(); p != nil {
		return append([]*blacklist.List(nil), *p...)
	}
	return nil
}
