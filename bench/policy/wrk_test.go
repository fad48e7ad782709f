package main

import (
	"testing"
	"time"
)

// TestParseWrk reads wrk 4.1's report as Debian's wrk writes it with --latency.
func TestParseWrk(t *testing.T) {
	const out = `Running 3s test @ https://127.0.0.1:34327/1k
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.95ms  521.23us  10.13ms   80.12%
    Req/Sec    16.51k     1.02k   17.80k    70.00%
  Latency Distribution
     50%    1.86ms
     75%    2.10ms
     90%    2.45ms
     99%  912.00us
  49312 requests in 3.00s, 59.34MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 3
Requests/sec:  16430.12
Transfer/sec:     19.77MB
`
	w, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkOutput{requests: 49312, elapsed: 3 * time.Second, non2xx: 3, socketErrors: 3,
		p50: 1860 * time.Microsecond, p99: 912 * time.Microsecond}
	if *w != want {
		t.Errorf("got %+v, want %+v", *w, want)
	}

	// A clean run has neither error line.
	clean := "     50%  100.00us\n     99%    1.00s\n  100 requests in 1.00m, 1MB read\n"
	if w, err := parseWrk(clean); err != nil || w.requests != 100 || w.elapsed != time.Minute || w.non2xx != 0 ||
		w.socketErrors != 0 || w.p50 != 100*time.Microsecond || w.p99 != time.Second {
		t.Errorf("clean run: %+v, %v", w, err)
	}
	for _, bad := range []string{"", "unable to connect to 127.0.0.1:1 Connection refused", "  100 requests in 1.00s, 1MB read\n"} {
		if w, err := parseWrk(bad); err == nil {
			t.Errorf("%q: accepted as %+v", bad, w)
		}
	}
	if got := wrkSeconds(1500 * time.Millisecond); got != "2s" {
		t.Errorf("wrkSeconds(1.5s) = %q", got)
	}
	if got := wrkSeconds(0); got != "1s" {
		t.Errorf("wrkSeconds(0) = %q", got)
	}
}
