package api

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// TestMeasureBlacklist10M pushes a 10M-entry IPv4 list (binary) through the API
// until a real node (agent and follower) applies it, then 10k-entry NDJSON deltas
// until applied, and logs the times. It runs with TIERGATE_BLSYNC_10M=1.
func TestMeasureBlacklist10M(t *testing.T) {
	if os.Getenv("TIERGATE_BLSYNC_10M") == "" {
		t.Skip("set TIERGATE_BLSYNC_10M=1 to measure a 10M push")
	}
	f := newFixture(t)
	n := f.runNode(t, "l7-a")
	r := rand.New(rand.NewPCG(1, 2))
	var b blacklist.Builder
	for i := 0; i < 10_000_000; i++ {
		b.AddAddr(netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())}), time.Time{})
	}
	set := b.Build()
	var buf bytes.Buffer
	if err := blacklist.WriteBinary(&buf, set); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a := f.do(t, f.admin, "PUT", "/v1/blacklists/global", buf.String(), "Content-Type", "application/octet-stream")
	answered := time.Since(start)
	if a.status != http.StatusAccepted {
		t.Fatalf("push: %d %s", a.status, a.body)
	}
	for n.f.Versions()["global"] != 1 {
		if time.Since(start) > 2*time.Minute {
			t.Fatal("not applied within 2 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	applied := time.Since(start)
	if n.list("global").Len() != set.Len() {
		t.Fatalf("the node enforces %d entries, not %d", n.list("global").Len(), set.Len())
	}
	var lat []time.Duration
	for k := 0; k < 20; k++ {
		var body strings.Builder
		for i := 0; i < 10_000; i++ {
			fmt.Fprintf(&body, `{"ip":"%s","duration":"1h"}`+"\n", netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())}))
		}
		start := time.Now()
		a := f.do(t, f.admin, "POST", "/v1/blacklists/global/delta", body.String(), "Content-Type", "application/x-ndjson")
		if a.status != http.StatusOK {
			t.Fatalf("delta: %d %s", a.status, a.body)
		}
		v := int64(k + 2)
		for n.f.Versions()["global"] < v {
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("10M push (%.1f MiB binary): answered %v, applied on the node %v; 10k delta to applied: p50 %v, max of 20 %v",
		float64(buf.Len())/(1<<20), answered.Round(time.Millisecond), applied.Round(time.Millisecond),
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}
