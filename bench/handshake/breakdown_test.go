package main

import (
	"os/exec"
	"strings"
	"testing"
)

func TestPartOf(t *testing.T) {
	for _, c := range []struct{ sym, dso, want string }{
		{"pvm_irq_enable", "[kernel.kallsyms]", partKernel},
		{"tcp_sendmsg_locked", "[kernel.kallsyms]", partKernel},
		{"crypto/internal/fips140/bigmod.addMulVVW2048", "/work/main/bin/l7d", partPK},
		{"crypto/internal/fips140/edwards25519/field.feMul.abi0", "/work/main/bin/l7d", partPK},
		{"crypto/internal/fips140/aes/gcm.gcmAesEnc.abi0", "/work/main/bin/l7d", partCrypto},
		{"crypto/internal/fips140/sha256.blockSHANI", "/work/main/bin/l7d", partCrypto},
		{"crypto/tls.(*serverHandshakeStateTLS13).sendServerCertificate", "/work/main/bin/l7d", partTLS},
		{"golang.org/x/crypto/cryptobyte.(*Builder).AddBytes", "/work/main/bin/l7d", partTLS},
		{"runtime.mallocgc", "/work/main/bin/l7d", partAlloc},
		{"runtime.(*mheap).allocSpan", "/work/main/bin/l7d", partAlloc},
		{"runtime.gcDrain", "/work/main/bin/l7d", partGC},
		{"runtime.scanObject", "/work/main/bin/l7d", partGC},
		{"runtime.findRunnable", "/work/main/bin/l7d", partSched},
		{"internal/runtime/syscall/linux.Syscall6", "/work/main/bin/l7d", partSched},
		{"internal/poll.(*FD).Read", "/work/main/bin/l7d", partSched},
		{"__vdso_clock_gettime", "[vdso]", partSched},
		{"github.com/valyala/fasthttp.(*Server).serveConn", "/work/main/bin/l7d", partServer},
		{"github.com/tiergate/tiergate/l7.(*listener).serveTCP", "/work/main/bin/l7d", partServer},
		{"main.serveFloorConn", "/tmp/bench-handshake", partServer},
		{"runtime.memmove", "/work/main/bin/l7d", partRuntime},
		{"[unknown]", "/usr/lib/x86_64-linux-gnu/libcrypto.so.3", partCrypto},
		{"[unknown]", "/usr/lib/x86_64-linux-gnu/libssl.so.3", partTLS},
		{"_int_malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6", partAlloc},
		{"__strcmp_evex", "/usr/lib/x86_64-linux-gnu/libc.so.6", partRuntime},
		{"[unknown]", "/usr/sbin/nginx", partServer},
		{"[unknown]", "[unknown]", partOther},
	} {
		if got := partOf(c.sym, c.dso); got != c.want {
			t.Errorf("partOf(%q, %q) = %s, want %s", c.sym, c.dso, got, c.want)
		}
	}
}

func TestParseSamples(t *testing.T) {
	in := strings.Join([]string{
		"        ffffffff8133c9e3 native_set_pmd ([kernel.kallsyms])",
		"                  425e5b runtime.mallocgc (/work/main/bin/l7d)",
		"                  499744 crypto/tls.(*Conn).readRecordOrCCS (/work/main/bin/l7d)",
		"            7f1a2b3c4d5e [unknown] (/usr/lib/x86_64-linux-gnu/libcrypto.so.3)",
		"not a sample line",
		"",
	}, "\n")
	bd, err := parseSamples(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if bd.samples != 4 || bd.parts[partKernel] != 1 || bd.parts[partAlloc] != 1 || bd.parts[partTLS] != 1 || bd.parts[partCrypto] != 1 {
		t.Fatalf("parsed %d samples by part %v, want 4: one kernel, alloc, tls, crypto", bd.samples, bd.parts)
	}
}

// TestProfile samples a process that hashes (openssl speed): perf runs, its samples
// are read back, and most of them are in libcrypto. (Not this test's own process:
// go test links it without symbols.)
func TestProfile(t *testing.T) {
	dir := t.TempDir()
	if ok, why := perfUsable(dir); !ok {
		t.Skipf("perf cannot sample here: %s", why)
	}
	cmd := exec.Command("openssl", "speed", "-seconds", "1", "-bytes", "16384", "sha256")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := startProfile(dir, "openssl", []int{cmd.Process.Pid})
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("openssl speed: %v", err)
	}
	bd, err := p.stop(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if bd.samples < 300 {
		t.Fatalf("%d samples of about 0.9 s of CPU at %d/s", bd.samples, breakdownRate)
	}
	if share := float64(bd.parts[partCrypto]) / float64(bd.samples); share < 0.5 {
		t.Errorf("hashing took %.0f%% of the samples (%v), want most", 100*share, bd.parts)
	}
}
