package benchkit

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Output of `openssl speed -seconds 1 -multi 2 rsa2048` from OpenSSL 3.0.19 on Debian
// 12, trimmed.
const openssl30 = `Forked child 0
+DT:2048:private:rsa:1
Forked child 1
Got: +F2:2:2048:2468.000000:31438.000000 from 0
Got: +F2:2:2048:1561.538462:29836.000000 from 1
version: 3.0.19
built on: Fri Apr  3 12:29:32 2026 UTC
options: bn(64,64)
CPUINFO: OPENSSL_ia32cap=0xfed83203178bffff:0x18005f42f1bb03a9
                  sign    verify    sign/s verify/s
rsa 2048 bits 0.000248s 0.000016s   4029.5  61274.0
`

// The table of OpenSSL 3.2 and later, with encryption columns.
const openssl32 = `version: 3.2.1
                   sign    verify    encrypt   decrypt   sign/s verify/s  encr./s  decr./s
rsa   512 bits 0.000036s 0.000002s 0.000002s 0.000047s  27548.6 410939.2 396468.0  21301.6
rsa  2048 bits 0.000531s 0.000017s 0.000017s 0.000550s   1882.2  59136.4  57357.9   1817.7
`

func TestParseOpenSSLSpeedRSA(t *testing.T) {
	for _, tc := range []struct {
		name         string
		out          string
		sign, verify float64
		err          string
	}{
		{"3.0 multi", openssl30, 4029.5, 61274.0, ""},
		{"3.2 with encryption columns", openssl32, 1882.2, 59136.4, ""},
		{"no summary", "Doing 2048 bits private rsa's for 1s\n", 0, 0, `no "rsa 2048 bits" summary row`},
		{"row without header", "rsa 2048 bits 0.1s 0.1s 10 10\n", 0, 0, "no \"rsa 2048 bits\""},
		{"short row", "  sign verify sign/s verify/s\nrsa 2048 bits 0.1s 10\n", 0, 0, "2 values under 4 column names"},
		{"bad number", "  sign verify sign/s verify/s\nrsa 2048 bits 0.1s 0.1s x 10\n", 0, 0, `sign/s value "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseOpenSSLSpeedRSA(tc.out, 2048)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.SignPerSec != tc.sign || r.VerifyPerSec != tc.verify {
				t.Errorf("sign/s %v verify/s %v, want %v and %v", r.SignPerSec, r.VerifyPerSec, tc.sign, tc.verify)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       statTimes
		err        bool
	}{
		{"plain", "1234 (keyserverd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 37 12 3 20 0 9 0 100 0 0",
			statTimes{2500 * time.Millisecond, 370 * time.Millisecond, 120 * time.Millisecond, 30 * time.Millisecond}, false},
		{"odd command", "77 (nginx: worker (x)) R 1 77 77 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 0 0",
			statTimes{10 * time.Millisecond, 20 * time.Millisecond, 0, 0}, false},
		{"truncated", "77 (x) R 1 2", statTimes{}, true},
		{"no cutime and cstime", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 2", statTimes{}, true},
		{"not a number", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 2 3 4", statTimes{}, true},
		{"no command", "77 x R", statTimes{}, true},
		{"empty", "", statTimes{}, true},
	} {
		got, err := parseStat(tc.stat)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
	pt := statTimes{2500 * time.Millisecond, 370 * time.Millisecond, 120 * time.Millisecond, 30 * time.Millisecond}
	if pt.own(false) != 2870*time.Millisecond || pt.own(true) != 2500*time.Millisecond ||
		pt.waited(false) != 150*time.Millisecond || pt.waited(true) != 120*time.Millisecond {
		t.Errorf("own %v/%v, waited %v/%v", pt.own(false), pt.own(true), pt.waited(false), pt.waited(true))
	}
}

func TestParseMachineBusy(t *testing.T) {
	got, err := parseMachineBusy("cpu  70011 5 29054 73628 517 3 688 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if want := time.Duration(70011+5+29054+3+688+10) * 10 * time.Millisecond; err != nil || got != want {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	if _, err := parseMachineBusy("intr 1 2 3\n"); err == nil {
		t.Error("no error for a file without a cpu line")
	}
}

func TestSelfCPU(t *testing.T) {
	a, err := SelfCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Spin until 10 ms of CPU are counted; on a busy machine that takes longer than
	// 10 ms of wall time, so only a clock that never advances fails.
	start := time.Now()
	for {
		b, err := SelfCPU()
		if err != nil {
			t.Fatal(err)
		}
		if b-a >= 10*time.Millisecond {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("10 s of spinning counted as %v of CPU", b-a)
		}
	}
}

func TestParseStatPPID(t *testing.T) {
	stat := "1234 (nginx) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 37 12 3 20 0 9 0 100 0 0"
	if ppid, err := parseStatPPID(stat); err != nil || ppid != 1 {
		t.Errorf("ppid %d, %v; want 1", ppid, err)
	}
}

func TestProcessTreeCPU(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	// A parent that waits for a child that spins for a moment, then sleeps.
	cmd := exec.Command(sh, "-c", `sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 5' & wait`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	parent := cmd.Process.Pid
	var kids []int
	for end := time.Now().Add(5 * time.Second); len(kids) == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if kids, err = ChildPIDs(parent); err != nil {
			t.Fatal(err)
		}
	}
	if len(kids) != 1 {
		t.Fatalf("children of the shell: %v, want one", kids)
	}
	defer syscall.Kill(kids[0], syscall.SIGKILL)
	if viaScan, err := childPIDsByScan(parent); err != nil || len(viaScan) != 1 || viaScan[0] != kids[0] {
		t.Errorf("scan found %v, %v; want %v", viaScan, err, kids)
	}
	time.Sleep(300 * time.Millisecond)
	// Read the tree last: CPU clocks only go forward.
	own, err := ProcessCPU(parent)()
	if err != nil {
		t.Fatal(err)
	}
	child, err := ProcessCPU(kids[0])()
	if err != nil {
		t.Fatal(err)
	}
	tree, err := ProcessTreeCPU(parent)()
	if err != nil {
		t.Fatal(err)
	}
	if tree < own+child || child == 0 {
		t.Errorf("tree %v, want at least the parent's %v plus the child's %v (> 0)", tree, own, child)
	}
	userChild, err := ProcessUserCPU(kids[0], false)()
	if err != nil {
		t.Fatal(err)
	}
	userTree, err := ProcessUserCPU(parent, true)()
	if err != nil {
		t.Fatal(err)
	}
	// The child spun in the shell's own code: most of its time is user time.
	if userChild == 0 || userTree < userChild {
		t.Errorf("user time: child %v, tree %v; want the child's > 0 and counted in the tree", userChild, userTree)
	}
	if self, err := ProcessUserCPU(os.Getpid(), true)(); err != nil || self <= 0 {
		t.Errorf("this process's user CPU: %v, %v", self, err)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	l := NewLatencies(d)
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {100, 100}, {0.1, 1}, {99.5, 100}} {
		if got := l.Percentile(tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Latencies(nil).Percentile(50); got != 0 {
		t.Errorf("empty p50 = %v", got)
	}
}

func TestRunCountsOnlyTheWindow(t *testing.T) {
	var calls atomic.Int64
	before := time.Now()
	res, err := Run(context.Background(), Load{
		Workers:  4,
		Warmup:   50 * time.Millisecond,
		Duration: 100 * time.Millisecond,
		Op: func(context.Context, int, uint64) error {
			calls.Add(1)
			time.Sleep(time.Millisecond)
			return nil
		},
		Clocks: []CPUClock{SelfCPU},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops == 0 || int64(res.Ops) >= calls.Load() {
		t.Errorf("%d operations counted of %d made: the warm-up must not count", res.Ops, calls.Load())
	}
	if res.Elapsed != 100*time.Millisecond {
		t.Errorf("window %v, want 100ms", res.Elapsed)
	}
	if d := res.Start.Sub(before); d < 50*time.Millisecond || d > time.Second {
		t.Errorf("window started %v after Run was called, want the 50ms warm-up", d)
	}
	if len(res.CPU) != 1 || res.CPUErr != nil {
		t.Errorf("CPU %v, %v", res.CPU, res.CPUErr)
	}
	if p := res.Latencies.Percentile(50); p < time.Millisecond {
		t.Errorf("p50 %v below the operation's sleep", p)
	}
}

func TestRunBounds(t *testing.T) {
	res, err := Run(context.Background(), Load{
		Workers:  3,
		Duration: 10 * time.Second,
		MaxOps:   50,
		Op:       func(context.Context, int, uint64) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 50 || res.Elapsed >= time.Second {
		t.Errorf("%d operations in %v, want 50 and an early end", res.Ops, res.Elapsed)
	}

	boom := errors.New("boom")
	start := time.Now()
	res, err = Run(context.Background(), Load{
		Workers:   2,
		Duration:  10 * time.Second,
		MaxErrors: 10,
		Op:        func(context.Context, int, uint64) error { return boom },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors < 10 || !errors.Is(res.FirstErr, boom) || time.Since(start) > 5*time.Second {
		t.Errorf("%d errors (%v) after %v: want the load stopped at 10", res.Errors, res.FirstErr, time.Since(start))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = Run(ctx, Load{
		Duration: 10 * time.Second,
		Op: func(ctx context.Context, _ int, _ uint64) error {
			<-ctx.Done()
			return ctx.Err()
		},
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("canceled load returned %v", err)
	}
}

func TestTable(t *testing.T) {
	var tb Table
	tb.Header = []string{"name", "n"}
	tb.Separator() // ignored: no row yet
	tb.Row("alpha", 1)
	tb.Separator()
	tb.Separator() // ignored: follows a separator
	tb.Row("b", 12345)
	var b strings.Builder
	if err := tb.Fprint(&b); err != nil {
		t.Fatal(err)
	}
	want := "name       n\n" +
		"------------\n" +
		"alpha      1\n" +
		"------------\n" +
		"b      12345\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
