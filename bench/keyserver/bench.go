package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	tgconfig "github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/hsm"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

type options struct {
	bin            string
	duration       time.Duration
	warmup         time.Duration
	maxOps         int
	levels         []int
	verifyEvery    int
	requestTimeout time.Duration
	cpuProfile     string
	inProcess      bool
	opensslSeconds int
	sessions       int // 0: 4 × GOMAXPROCS
	quietCores     float64
	quietWait      time.Duration
	phases         map[string]bool // nil: all
	out, log       io.Writer
}

// Configurations, as named in the table.
const (
	cfgOpenSSL      = "openssl speed"
	cfgPKCS11Direct = "PKCS#11 direct (SoftHSM)"
	cfgSoftDirect   = "crypto/rsa direct"
	cfgKSPKCS11     = "keyserverd + SoftHSM"
	cfgKSSoftware   = "keyserverd + software"
)

// row is one measured configuration at one level of concurrency.
type row struct {
	config    string // one of the cfg constants
	note      string // tells apart rows of one configuration and level, e.g. "before"
	inFlight  int
	res       *benchkit.Result
	serverCPU bool // res.CPU[clockServer] is the keyserver process's
	verified  int64
}

// The CPU clocks of every measurement, in this order.
const (
	clockSelf    = iota // this process
	clockMachine        // every process on the machine
	clockServer         // the keyserverd process, when there is one
)

type bench struct {
	benchkit.Bench
	o       *options
	f       *fixture
	ksBin   string
	quiet   *slog.Logger
	rows    []*row
	openssl *benchkit.OpenSSLRSA
}

func run(ctx context.Context, o *options) error {
	b := &bench{
		o:     o,
		Bench: benchkit.Bench{Log: o.log, BinDir: o.bin, QuietCores: o.quietCores, QuietWait: o.quietWait},
		quiet: slog.New(slog.NewTextHandler(o.log, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	b.ksBin = b.Bin("keyserverd")
	if _, err := os.Stat(b.ksBin); err != nil {
		return fmt.Errorf("keyserverd binary: %w (run `make build`, or pass -bin)", err)
	}
	dir, err := os.MkdirTemp("", "tiergate-bench-keyserver-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	b.Progress("setting up: SoftHSM2 token, RSA-2048 key, certificates, keyserverd import (in %s)", dir)
	if b.f, err = newFixture(dir, b.ksBin, o.sessions); err != nil {
		return err
	}

	// Each keyserverd configuration runs between two runs of its in-process baseline,
	// so that the ratio between them is taken over the same stretch of a shared machine
	// and the two baselines show how much the machine drifted meanwhile.
	for _, p := range phases(b) {
		if o.phases != nil && !o.phases[p.name] {
			continue
		}
		if err := p.run(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.Fail("%s: %v", p.name, err)
		}
	}
	b.report()
	return b.Err()
}

// clientConns is the number of connections the client keeps to keyserverd (the
// client's default).
const clientConns = 2

type phase struct {
	name string
	run  func(context.Context) error
}

// phaseNames lists the phases in the order they run, for -phases.
var phaseNames = []string{"openssl", "pkcs11-direct", "keyserverd-pkcs11", "software-direct", "keyserverd-software"}

func phases(b *bench) []phase {
	direct := func(run func(context.Context, string) error, note string) func(context.Context) error {
		return func(ctx context.Context) error { return run(ctx, note) }
	}
	keyserver := func(kind string) func(context.Context) error {
		return func(ctx context.Context) error { return b.runKeyserver(ctx, kind) }
	}
	return []phase{
		{"openssl", b.runOpenSSL},
		{"pkcs11-direct", direct(b.runPKCS11Direct, noteBefore)},
		{"keyserverd-pkcs11", keyserver(pkcs11Backend)},
		{"pkcs11-direct", direct(b.runPKCS11Direct, noteAfter)},
		{"software-direct", direct(b.runSoftwareDirect, noteBefore)},
		{"keyserverd-software", keyserver(softwareBackend)},
		{"software-direct", direct(b.runSoftwareDirect, noteAfter)},
	}
}

// Notes of the baseline runs around a keyserverd phase.
const (
	noteBefore = "before"
	noteAfter  = "after"
)

func (b *bench) runOpenSSL(ctx context.Context) error {
	if err := b.WaitQuiet(ctx, benchkit.SelfCPU); err != nil {
		return err
	}
	b.Progress("openssl speed -seconds %d -multi %d rsa2048", b.o.opensslSeconds, runtime.NumCPU())
	r, err := benchkit.OpenSSLSpeedRSA(ctx, 2048, b.o.opensslSeconds, runtime.NumCPU())
	if err != nil {
		return err
	}
	b.openssl = r
	return nil
}

// signFunc makes one signature over a SHA-256 digest.
type signFunc func(ctx context.Context, digest []byte) ([]byte, error)

func signerFunc(s crypto.Signer) signFunc {
	return func(_ context.Context, digest []byte) ([]byte, error) {
		return s.Sign(rand.Reader, digest, crypto.SHA256)
	}
}

// measure runs inFlight workers signing distinct digests back to back, verifying a
// sample of the signatures with the public key.
func (b *bench) measure(ctx context.Context, config, note string, inFlight int, sign signFunc, clocks []benchkit.CPUClock) (*row, error) {
	label := config
	if note != "" {
		label += ", " + note
	}
	ours := []benchkit.CPUClock{clocks[clockSelf]}
	if len(clocks) > clockServer {
		ours = append(ours, clocks[clockServer])
	}
	if err := b.WaitQuiet(ctx, ours...); err != nil {
		return nil, err
	}
	b.Progress("%s, %d in flight: %v warm-up, %v measured", label, inFlight, b.o.warmup, b.o.duration)
	var nonce [16]byte
	rand.Read(nonce[:])
	pub := &b.f.key.PublicKey
	every := uint64(b.o.verifyEvery)
	var verified, bad atomic.Int64
	op := func(ctx context.Context, w int, seq uint64) error {
		var in [32]byte
		copy(in[:], nonce[:])
		binary.BigEndian.PutUint64(in[16:], uint64(w))
		binary.BigEndian.PutUint64(in[24:], seq)
		digest := sha256.Sum256(in[:])
		sig, err := sign(ctx, digest[:])
		if err != nil {
			return err
		}
		if seq%every == 0 {
			if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig); err != nil {
				bad.Add(1)
				return fmt.Errorf("signature %d of worker %d does not verify: %w", seq, w, err)
			}
			verified.Add(1)
		}
		return nil
	}
	res, err := benchkit.Run(ctx, benchkit.Load{
		Workers:  inFlight,
		Warmup:   b.o.warmup,
		Duration: b.o.duration,
		MaxOps:   b.o.maxOps,
		Op:       op,
		Clocks:   clocks,
	})
	if err != nil {
		return nil, err
	}
	r := &row{config: config, note: note, inFlight: inFlight, res: res, serverCPU: len(clocks) > clockServer, verified: verified.Load()}
	b.rows = append(b.rows, r)
	b.Progress("  %.1f signs/s, p50 %.3f ms, p99 %.3f ms, %d errors, %d signatures verified, other processes %.2f cores",
		res.Rate(), benchkit.Ms(res.Latencies.Percentile(50)), benchkit.Ms(res.Latencies.Percentile(99)), res.Errors, r.verified, r.otherCores())
	switch {
	case bad.Load() > 0:
		b.Fail("%s at %d in flight: %d signatures did not verify", label, inFlight, bad.Load())
	case res.Errors > 0:
		b.Fail("%s at %d in flight: %d errors, the first: %v", label, inFlight, res.Errors, res.FirstErr)
	case res.Ops == 0:
		b.Fail("%s at %d in flight: no signature completed in the window", label, inFlight)
	case r.verified == 0:
		b.Fail("%s at %d in flight: no signature was verified", label, inFlight)
	}
	if res.CPUErr != nil {
		b.Progress("  reading CPU time: %v", res.CPUErr)
	}
	return r, nil
}

func selfClocks() []benchkit.CPUClock {
	return []benchkit.CPUClock{clockSelf: benchkit.SelfCPU, clockMachine: benchkit.MachineBusyCPU}
}

// ourCores is the CPU this process and keyserverd used, in cores.
func (r *row) ourCores() float64 {
	if r.res.Elapsed <= 0 || len(r.res.CPU) <= clockMachine {
		return 0
	}
	d := r.res.CPU[clockSelf]
	if r.serverCPU {
		d += r.res.CPU[clockServer]
	}
	return d.Seconds() / r.res.Elapsed.Seconds()
}

// cpuPerSign is the CPU this process and keyserverd used per signature.
func (r *row) cpuPerSign() time.Duration {
	d := r.res.CPUPerOp(clockSelf)
	if r.serverCPU {
		d += r.res.CPUPerOp(clockServer)
	}
	return d
}

// otherCores is the CPU every other process on the machine used, in cores.
func (r *row) otherCores() float64 {
	if r.res.Elapsed <= 0 || len(r.res.CPU) <= clockMachine {
		return 0
	}
	return max(r.res.CPU[clockMachine].Seconds()/r.res.Elapsed.Seconds()-r.ourCores(), 0)
}

// openHSM opens the token in this process with the benchmark's session count.
func (b *bench) openHSM() (*hsm.Backend, crypto.Signer, error) {
	hb, err := hsm.New(hsm.Config{
		Module:     b.f.tok.Module,
		TokenLabel: b.f.tok.Label,
		PINFile:    b.f.pinFile,
		Sessions:   b.f.sessions,
		Keys:       []hsm.KeySpec{{Label: keyLabel}},
		Logger:     b.quiet,
	})
	if err != nil {
		return nil, nil, err
	}
	s, err := keyOf(hb, b.f)
	if err != nil {
		hb.Close()
		return nil, nil, err
	}
	return hb, s, nil
}

func keyOf(bk backend.Backend, f *fixture) (crypto.Signer, error) {
	keys, err := bk.Keys()
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if k.ID == f.keyID {
			return k.Signer, nil
		}
	}
	return nil, fmt.Errorf("%s backend does not offer key %s", bk.Name(), f.keyID.Short())
}

// runPKCS11Direct signs through the hsm backend in this process: the token's own
// ceiling with keyserverd's session count, twice as many goroutines as sessions so
// that no session waits for a caller.
func (b *bench) runPKCS11Direct(ctx context.Context, note string) error {
	hb, s, err := b.openHSM()
	if err != nil {
		return err
	}
	defer hb.Close()
	_, err = b.measure(ctx, cfgPKCS11Direct, note, 2*b.f.sessions, signerFunc(s), selfClocks())
	return err
}

// runSoftwareDirect signs with crypto/rsa and the key parsed from its PEM file, one
// goroutine per GOMAXPROCS.
func (b *bench) runSoftwareDirect(ctx context.Context, note string) error {
	pemKey, err := os.ReadFile(b.f.keyPath)
	if err != nil {
		return err
	}
	priv, err := softkey.ParsePEM(pemKey)
	if err != nil {
		return err
	}
	key, ok := priv.(*rsa.PrivateKey)
	if !ok {
		return fmt.Errorf("%s holds a %T", b.f.keyPath, priv)
	}
	_, err = b.measure(ctx, cfgSoftDirect, note, runtime.GOMAXPROCS(0), signerFunc(key), selfClocks())
	return err
}

// runKeyserver starts keyserverd with the given backend and measures every level
// through the client library.
func (b *bench) runKeyserver(ctx context.Context, kind string) (err error) {
	config := cfgKSPKCS11
	if kind == softwareBackend {
		config = cfgKSSoftware
	}
	listen, err := benchkit.FreeAddr()
	if err != nil {
		return err
	}
	clocks := selfClocks()
	var proc *benchkit.Process
	if b.o.inProcess {
		config += " (in-process)"
		stop, err := b.startInProcess(kind, listen)
		if err != nil {
			return err
		}
		defer func() {
			if serr := stop(); serr != nil && err == nil {
				err = serr
			}
		}()
	} else {
		metrics, err := benchkit.FreeAddr()
		if err != nil {
			return err
		}
		cfg, err := b.f.writeConfig(kind, listen, metrics, kind, true)
		if err != nil {
			return err
		}
		proc, err = benchkit.StartProcess("keyserverd ("+kind+")", b.ksBin, []string{"run", "-config", cfg},
			b.f.tok.Env(), filepath.Join(b.f.dir, "keyserverd-"+kind+".log"))
		if err != nil {
			return err
		}
		defer func() {
			if serr := proc.Stop(10 * time.Second); serr != nil && err == nil {
				err = fmt.Errorf("%w; log:\n%s", serr, proc.LogTail(20))
			}
		}()
		if err := proc.WaitHTTP(ctx, nil, "http://"+metrics+"/healthz", 20*time.Second); err != nil {
			return fmt.Errorf("keyserverd did not become healthy: %w; log:\n%s", err, proc.LogTail(20))
		}
		if kind == pkcs11Backend {
			if want := fmt.Sprintf("sessions=%d", b.f.sessions); !strings.Contains(proc.LogTail(50), want) {
				b.Progress("warning: keyserverd's log does not say %s:\n%s", want, proc.LogTail(20))
			}
		}
		clocks = append(clocks, proc.CPU())
	}

	cl, err := client.New(client.Config{
		Servers:        []string{listen},
		TLS:            b.f.clientTLS,
		ConnsPerServer: clientConns,
		RequestTimeout: tgconfig.Duration(b.o.requestTimeout),
		Timeout:        tgconfig.Duration(3 * b.o.requestTimeout),
		Logger:         b.quiet,
	})
	if err != nil {
		return err
	}
	defer cl.Close()
	rk := cl.NewKey(b.f.keyID, &b.f.key.PublicKey)
	sign := func(ctx context.Context, digest []byte) ([]byte, error) {
		return rk.SignContext(ctx, digest, crypto.SHA256)
	}

	if b.o.cpuProfile != "" {
		path := b.o.cpuProfile + "-" + kind + ".pprof"
		pf, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			pf.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			pf.Close()
			b.Progress("CPU profile written to %s", path)
		}()
	}
	for _, n := range b.o.levels {
		if _, err := b.measure(ctx, config, "", n, sign, clocks); err != nil {
			return err
		}
		if proc != nil {
			select {
			case <-proc.Done():
				return proc.Exited()
			default:
			}
		}
	}
	return nil
}

// startInProcess runs the keyserver library in this process (for -inprocess).
func (b *bench) startInProcess(kind, listen string) (stop func() error, err error) {
	var bk backend.Backend
	switch kind {
	case pkcs11Backend:
		hb, _, err := b.openHSM()
		if err != nil {
			return nil, err
		}
		bk = hb
	default:
		sb, err := softkey.New(softkey.Config{Files: []string{b.f.keyPath}})
		if err != nil {
			return nil, err
		}
		bk = sb
	}
	srv, err := keyserver.NewServer(keyserver.Config{
		Addr:     listen,
		TLS:      b.f.serverTLS,
		Backends: []backend.Backend{bk},
		Clients:  []keyserver.ClientRule{{Name: clientName, Keys: []string{"*"}}},
		Logger:   b.quiet,
	})
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		bk.Close()
		return nil, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return errors.Join(srv.Shutdown(ctx), bk.Close())
	}, nil
}
