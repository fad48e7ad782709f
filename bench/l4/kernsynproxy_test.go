package main

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestKernelSynproxy measures the kernel peer briefly: the ruleset loads, the flood
// reaches the proxy, its SYN-ACKs are counted and its core's CPU time is read.
func TestKernelSynproxy(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "nft", "nftables")
	if n := runtime.NumCPU(); n < 2 {
		t.Skipf("needs 2 CPUs, has %d", n)
	}
	res, err := measureKernelSynproxy(context.Background(), 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if res.SynAcks == 0 || res.SynReceived == 0 || res.MppsPerCore <= 0 || res.FloodSent < res.SynReceived || res.SynOnProxyCPU < 0.99 {
		t.Errorf("%+v", *res)
	}
	// Every SYN-ACK the proxy's end sent arrived at the flood's end, give or take those
	// in flight at the two readings.
	if d := int64(res.FloodRx) - int64(res.SynAcks); d < -2000 || d > 2000 {
		t.Errorf("%d SYN-ACKs sent, %d received", res.SynAcks, res.FloodRx)
	}
}

func TestParseKernelCounters(t *testing.T) {
	stat := "entries\t\tsyn_received\tcookie_invalid\tcookie_valid\tcookie_retrans\tconn_reopened\n" +
		"00000000\t0000001a\t00000000\t00000002\t00000000\t00000000\n" +
		"00000000\t00000100\t00000000\t00000000\t00000000\t00000000\n"
	if n, err := parseSynproxyStat(stat); err != nil || len(n) != 2 || n[0] != 0x1a || n[1] != 0x100 {
		t.Errorf("synproxy stat: %d, %v", n, err)
	}
	for _, bad := range []string{"", "entries syn_received\n", "entries other\n0 1\n", "entries syn_received\n0 zz\n", "entries syn_received\n0\n"} {
		if _, err := parseSynproxyStat(bad); err == nil {
			t.Errorf("synproxy stat %q accepted", bad)
		}
	}
	dev := "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n" +
		"    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n" +
		"  ksp0: 7400000  100000    0    0    0     0          0         0  7400000   99990    0    0    0     0       0          0\n"
	if rx, tx, err := readNetDev(dev, "ksp0"); err != nil || rx != 100000 || tx != 99990 {
		t.Errorf("net/dev: %d %d %v", rx, tx, err)
	}
	if _, _, err := readNetDev(dev, "kfl0"); err == nil {
		t.Error("a missing device was found")
	}
	procStat := "cpu  10 0 20 30 0 0 5 0 0 0\ncpu0 4 0 8 15 0 0 2 0 0 0\ncpu1 6 0 12 15 0 1 3 1 0 0\nintr 1\n"
	c, err := parseCPUTimes(procStat, 1)
	if err != nil || c.user != 6 || c.system != 12 || c.idle != 15 || c.irq != 1 || c.softirq != 3 || c.steal != 1 || c.busy() != 23 {
		t.Errorf("cpu1: %+v, %v", c, err)
	}
	if _, err := parseCPUTimes(procStat, 2); err == nil {
		t.Error("cpu2 found")
	}
}
