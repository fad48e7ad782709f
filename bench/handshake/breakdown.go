package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The CPU breakdown: where each server's CPU goes in each matrix row, from Linux
// perf's samples of the server's processes (perf record -a -e cpu-clock, every CPU,
// no call graphs; see startProfile), sorted into parts by the sampled function and the object it is
// in. Read with the floor rows, it says where a floor comes from (the kernel's TCP,
// the key exchange, the runtime) and what l7d adds to it, shape by shape, and what
// the same parts cost nginx. A part's µs per connection is its share of the samples
// times the row's server CPU per connection (the figure the targets are read with).
//
// Debian's OpenSSL libraries carry no symbols for their internals: nginx's libcrypto
// is one part (all its crypto: RSA, X25519, AES-GCM, hashes), its public-key share
// is in the report beside (openssl speed).

// Parts of a server's CPU, in report order.
const (
	partKernel    = "kernel"
	partPK        = "pk_crypto"      // Go: RSA, X25519/ECDH
	partCrypto    = "crypto"         // Go: AES-GCM, hashes, HKDF; nginx: all of libcrypto
	partTLS       = "tls"            // crypto/tls, x509, asn1, cryptobyte; libssl
	partSched     = "sched_syscalls" // Go's scheduler, netpoller, timers, syscall entry
	partAlloc     = "alloc"          // Go's allocator; libc malloc
	partGC        = "gc"             // Go's garbage collector
	partRuntime   = "runtime_other"  // the rest of Go's runtime; the rest of libc
	partServer    = "server"         // HTTP and the server's own code: fasthttp, net/http, l7d, nginx
	partOther     = "other"
	breakdownRate = 997 // samples a second of CPU
)

var breakdownParts = []string{partKernel, partPK, partCrypto, partTLS, partSched, partAlloc, partGC, partRuntime, partServer, partOther}

var (
	rePK      = regexp.MustCompile(`fips140/(rsa|bigmod|edwards25519|nistec|ecdh)|^crypto/(rsa|ecdh|ecdsa|ed25519|internal/fips140/ecdh)|^math/big|curve25519|x25519`)
	reCrypto  = regexp.MustCompile(`^crypto/(internal/fips140/(aes|sha|hmac|hkdf|tls13|tls12|subtle|drbg)|aes|sha|hmac|hkdf|cipher|subtle|internal/(boring|sysrand|randutil|entropy)|rand)|^vendor/golang.org/x/crypto|^golang.org/x/crypto`)
	reTLS     = regexp.MustCompile(`^crypto/(tls|x509)|^encoding/asn1|cryptobyte`)
	reGC      = regexp.MustCompile(`^runtime\.(gc|scan|mark|greyobject|findObject|sweep|bgsweep|wbBuf|tryDeferToSpanScan|.*[Ss]tackMap|findfunc|step|funcdata|pcvalue|.*unwinder|spanInlineMarkBits|.*moveInlineMarks|.*spanSet|typePointers|heapSetType|.*[Ss]cavenge)|^internal/runtime/gc|^runtime\.\(\*(gcWork|gcControllerState|gcBits|mspan\)\.(sweep|refill|moveInlineMarks|initHeapBits|typePointers))`)
	reAlloc   = regexp.MustCompile(`^runtime\.(mallocgc|malloc|newobject|newarray|makeslice|growslice|makemap|rawstring|rawbyteslice|slicebytetostring|concatstring|memclr|nextFree|.*mcache|.*mcentral|.*mheap|.*mspan|.*fixalloc|.*pageAlloc|heapBits|.*allocSpan|deductAssistCredit|persistentalloc)|^runtime\.\(\*(mcache|mcentral|mheap|mspan|fixalloc|pageAlloc|pageCache)\)`)
	reSched   = regexp.MustCompile(`^runtime\.(schedule|findRunnable|park_m|goready|ready|runq|globrunq|netpoll|notesleep|notewakeup|futex|mPark|stopm|startm|wakep|gopark|goexit|casgstatus|resetspinning|checkTimers|runtimer|runOneTimer|stealWork|mcall|gogo|execute|lock|unlock|usleep|osyield|sysmon|nanotime|exitsyscall|entersyscall|reentersyscall|handoffp|acquirep|releasep|sem|chan|select|sellock|selunlock|.*[Tt]imer|newproc|malg|gfget|gfput|systemstack|goschedIfBusy|gosched|mstart|procyield|poll_runtime|pollWork|injectglist|readyWithTime|send|recv|closechan|getempty|mput|mget|pidle)|^runtime\.\(\*(timer|timers|waitq|pollDesc|pollCache|lfstack)\)|^internal/runtime/syscall|^syscall\.|^internal/poll|^runtime/internal/syscall|^os\.|^net\.`)
	reServer  = regexp.MustCompile(`fasthttp|tiergate|^net/http|^main\.|^bufio|^net/textproto|^github\.com/prometheus`)
	reRuntime = regexp.MustCompile(`^runtime|^aeshash|^internal/|^sync|^memeqbody|^indexbyte|^strings|^bytes|^strconv|^unicode|^fmt|^sort|^slices|^maps|^reflect|^context|^time\.|^log|^errors|^io|^encoding/binary`)
)

// symbolParts sort Go's functions, the first that matches.
var symbolParts = []struct {
	re   *regexp.Regexp
	part string
}{
	{rePK, partPK}, {reTLS, partTLS}, {reCrypto, partCrypto}, {reGC, partGC}, {reAlloc, partAlloc},
	{reSched, partSched}, {reServer, partServer}, {reRuntime, partRuntime},
}

// partOf sorts one sample by its function and object.
func partOf(sym, dso string) string {
	switch {
	case strings.Contains(dso, "kernel"):
		return partKernel
	case dso == "[vdso]":
		return partSched // the clock read without a system call
	case strings.Contains(dso, "libcrypto"):
		return partCrypto
	case strings.Contains(dso, "libssl"):
		return partTLS
	case strings.Contains(dso, "libc.so") || strings.Contains(dso, "libpthread") || strings.Contains(dso, "ld-linux"):
		if strings.Contains(sym, "malloc") || strings.Contains(sym, "free") || strings.HasPrefix(sym, "_int_") {
			return partAlloc
		}
		return partRuntime
	case strings.HasSuffix(dso, "/nginx") || dso == "nginx":
		return partServer
	}
	for _, r := range symbolParts {
		if r.re.MatchString(sym) {
			return r.part
		}
	}
	return partOther
}

// breakdown is a row's samples by part.
type breakdown struct {
	parts   map[string]int
	samples int
}

// perfLine is one sample as `perf script -F ip,sym,dso` prints it:
// "  ffffffff8133c9e3 native_set_pmd ([kernel.kallsyms])".
var perfLine = regexp.MustCompile(`^\s*[0-9a-f]+\s+(.*?)\s*\((.*)\)\s*$`)

// parseSamples reads perf script's output into a breakdown.
func parseSamples(r io.Reader) (*breakdown, error) {
	bd := &breakdown{parts: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := perfLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		bd.parts[partOf(m[1], m[2])]++
		bd.samples++
	}
	return bd, sc.Err()
}

// profiler records one row's samples of a server's processes.
type profiler struct {
	cmd  *exec.Cmd
	file string
	pids string // the processes whose samples are read, comma-separated
	errb bytes.Buffer
}

// perfRecord is perf record's command line up to the output file, as the rows
// run it (startProfile) and perfUsable tries it.
func perfRecord() []string {
	return []string{"record", "-q", "-a", "-e", "cpu-clock", "-F", strconv.Itoa(breakdownRate), "-o"}
}

// perfUsable reports whether perf can sample here as the rows do (every CPU), and
// if not, why.
func perfUsable(dir string) (bool, string) {
	path, err := exec.LookPath("perf")
	if err != nil {
		return false, "perf not found (Debian package linux-perf)"
	}
	f := filepath.Join(dir, "perf-probe.data")
	defer os.Remove(f)
	out, err := exec.Command(path, append(perfRecord(), f, "--", "true")...).CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("perf record: %v: %s", err, tail(string(out), 200))
	}
	return true, ""
}

// startProfile starts perf on every CPU; stop ends it and reads the samples of
// pids. perf samples the whole machine (a timer on each CPU) rather than the
// processes' threads: following threads puts perf's event switch in each of their
// context switches, which costs a server that sleeps and wakes several times a
// connection (one client at a time) a measurable share of the very CPU the row
// measures; the machine-wide timer costs every process the same small share.
func startProfile(dir, tag string, pids []int) (*profiler, error) {
	p := &profiler{file: filepath.Join(dir, "perf-"+tag+".data")}
	ps := make([]string, len(pids))
	for i, pid := range pids {
		ps[i] = strconv.Itoa(pid)
	}
	p.pids = strings.Join(ps, ",")
	p.cmd = exec.Command("perf", append(perfRecord(), p.file)...)
	p.cmd.Stderr = &p.errb
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	// perf opens its events before it samples: give it a moment, so the row's
	// first connections are in the profile.
	time.Sleep(100 * time.Millisecond)
	return p, nil
}

func (p *profiler) stop(ctx context.Context) (*breakdown, error) {
	defer os.Remove(p.file)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		return nil, errors.New("perf record did not stop")
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "perf", "script", "-i", p.file, "-F", "ip,sym,dso", "--pid", p.pids)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	bd, perr := parseSamples(out)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("perf script: %v: %s %s", err, tail(p.errb.String(), 200), tail(errb.String(), 200))
	}
	return bd, perr
}

// breakdownSum is one server's CPU in one shape by part, µs per connection.
type breakdownSum struct {
	Parts   map[string]float64 `json:"us_per_conn"`
	Samples int                `json:"samples"`
}

// breakdownReport prints and returns the breakdown of each shape and server: the
// samples of its repeats together, scaled to the median server CPU per connection.
func (b *bench) breakdownReport(w io.Writer) map[string]map[string]breakdownSum {
	out := map[string]map[string]breakdownSum{}
	t := benchkit.Table{Header: append([]string{"shape", "server", "CPU µs"}, append(slices.Clone(breakdownParts), "samples")...)}
	last := ""
	for _, sh := range b.o.matrix {
		if _, done := out[sh.name]; done {
			continue
		}
		for _, srv := range b.mrowServers(sh.name) {
			sum := &breakdown{parts: map[string]int{}}
			for _, r := range b.mrows {
				if r.sh.name == sh.name && r.srv.id == srv && r.breakdown != nil {
					for k, v := range r.breakdown.parts {
						sum.parts[k] += v
					}
					sum.samples += r.breakdown.samples
				}
			}
			cpu := b.shapeMedian(sh.name, srv, mclockServer)
			if sum.samples == 0 || cpu == nil {
				continue
			}
			if out[sh.name] == nil {
				out[sh.name] = map[string]breakdownSum{}
			}
			bs := breakdownSum{Parts: map[string]float64{}, Samples: sum.samples}
			cells := []any{sh.name, srv, fmt.Sprintf("%.0f", *cpu)}
			for _, p := range breakdownParts {
				v := round(*cpu*float64(sum.parts[p])/float64(sum.samples), 1)
				bs.Parts[p] = v
				cells = append(cells, fmt.Sprintf("%.0f", v))
			}
			out[sh.name][srv] = bs
			if sh.name != last {
				t.Separator()
				last = sh.name
			}
			t.Row(append(cells, sum.samples)...)
		}
	}
	if len(out) == 0 {
		if b.breakdownWhy != "" {
			fmt.Fprintf(w, "\nCPU breakdown not measured: %s\n", b.breakdownWhy)
		}
		return nil
	}
	fmt.Fprintf(w, "\nWhere the server CPU goes, µs per connection: perf's samples of the server's processes (cpu-clock, %d/s) by\n", breakdownRate)
	fmt.Fprintf(w, "function, the repeats' samples together, times the median server CPU per connection. pk_crypto: RSA, X25519 (Go);\n")
	fmt.Fprintf(w, "crypto: AES-GCM, hashes (Go), all of libcrypto (nginx: no symbols); tls: crypto/tls, x509, asn1 (Go), libssl;\n")
	fmt.Fprintf(w, "sched_syscalls: Go's scheduler, netpoller, timers, syscall entry; alloc: Go's allocator, libc malloc; gc: Go's\n")
	fmt.Fprintf(w, "collector; runtime_other: the rest of Go's runtime and standard library, the rest of libc; server: HTTP and\n")
	fmt.Fprintf(w, "the server's own code (fasthttp, l7d, the floor's, nginx)\n")
	t.Fprint(w)
	return out
}

// mrowServers lists the servers measured in shape name, in the order measured.
func (b *bench) mrowServers(name string) []string {
	var out []string
	for _, r := range b.mrows {
		if r.sh.name == name && !slices.Contains(out, r.srv.id) {
			out = append(out, r.srv.id)
		}
	}
	return out
}
