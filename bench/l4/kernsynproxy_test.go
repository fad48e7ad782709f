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
	if res.SynAcks == 0 || res.SynReceived == 0 || res.MppsPerCore <= 0 || res.FloodSent < res.SynReceived {
		t.Errorf("%+v", *res)
	}
	// Every SYN-ACK the proxy's end sent arrived at the flood's end, give or take those
	// in flight at the two readings.
	if d := int64(res.FloodRx) - int64(res.SynAcks); d < -2000 || d > 2000 {
		t.Errorf("%d SYN-ACKs sent, %d received", res.SynAcks, res.FloodRx)
	}
}
