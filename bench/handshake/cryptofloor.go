package main

import (
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// cryptoCosts are the public-key operations of a TLS 1.3 full handshake with an
// RSA-2048 certificate and X25519, on the server's side, in µs of one core: the part
// of a connection's CPU no server can do without, measured in Go (this process, one
// locked thread, its CPU time, the least of several batches) and in OpenSSL (`openssl speed`, the
// library nginx runs with). Everything else a handshake computes (HKDF, the
// transcript's hash, AES-GCM on a few small records) costs a few tens of µs.
type cryptoCosts struct {
	GoX25519Pair      float64 `json:"go_x25519_keygen_and_shared_us"`
	GoRSASign         float64 `json:"go_rsa2048_pss_sign_us"`
	OpenSSLX25519Pair float64 `json:"openssl_x25519_keygen_and_shared_us"` // 2 × a derive: each one scalar multiplication
	OpenSSLRSASign    float64 `json:"openssl_rsa2048_sign_us"`
	OpenSSLVersion    string  `json:"openssl_version,omitempty"`
}

// measureGoCrypto measures Go's costs.
func measureGoCrypto(key *rsa.PrivateKey) (*cryptoCosts, error) {
	c := &cryptoCosts{}
	curve := ecdh.X25519()
	peer, err := curve.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	x, err := leastPerOp(10, 50, func() error {
		k, err := curve.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		_, err = k.ECDH(peer.PublicKey())
		return err
	})
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256([]byte("transcript"))
	opts := &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}
	r, err := leastPerOp(10, 5, func() error {
		_, err := key.Sign(rand.Reader, digest[:], opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	c.GoX25519Pair, c.GoRSASign = round(us(x), 1), round(us(r), 1)
	return c, nil
}

// measureCrypto measures the costs; an OpenSSL figure that could not be had is 0.
func measureCrypto(ctx context.Context, key *rsa.PrivateKey) (*cryptoCosts, error) {
	c, err := measureGoCrypto(key)
	if err != nil {
		return nil, err
	}
	if rsaRow, err := benchkit.OpenSSLSpeedRSA(ctx, 2048, 1, 1); err == nil && rsaRow.SignPerSec > 0 {
		c.OpenSSLRSASign = round(1e6/rsaRow.SignPerSec, 1)
		c.OpenSSLVersion = rsaRow.OpenSSLVersion
	}
	if out, err := exec.CommandContext(ctx, "openssl", "speed", "-seconds", "1", "ecdhx25519").Output(); err == nil {
		if ops, err := parseSpeedX25519(string(out)); err == nil {
			c.OpenSSLX25519Pair = round(2*1e6/ops, 1)
		}
	}
	return c, nil
}

// leastPerOp runs op n times per batch, batches times, on one locked thread, and
// returns the least thread CPU time per op of a batch: CPU time, since the machine
// is shared and wall time would count others' turns.
func leastPerOp(batches, n int, op func() error) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	best := time.Duration(1 << 62)
	for range batches {
		start := threadCPU()
		for range n {
			if err := op(); err != nil {
				return 0, err
			}
		}
		best = min(best, (threadCPU()-start)/time.Duration(n))
	}
	return best, nil
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
func threadCPU() time.Duration {
	var ts syscall.Timespec
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3 /* CLOCK_THREAD_CPUTIME_ID */, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// parseSpeedX25519 reads the derives per second from `openssl speed ecdhx25519`:
//
//	                             op      op/s
//	253 bits ecdh (X25519)   0.0000s  28823.5
func parseSpeedX25519(out string) (float64, error) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "(X25519)") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("openssl speed ecdhx25519: %q: no rate", line)
		}
		return v, nil
	}
	return 0, fmt.Errorf("openssl speed ecdhx25519: no X25519 row")
}
