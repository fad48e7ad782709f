package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// failoverFigures are those integration's TestL4ClusterFailover writes to the file
// named by TIERGATE_FAILOVER_OUT (its FailoverResult).
type failoverFigures struct {
	Conns            int     `json:"conns"`
	ConnsByProto     string  `json:"conns_by_proto"`
	HoldTimeS        float64 `json:"hold_time_s"`
	RouteDropS       float64 `json:"route_drop_s"`
	FailoverS        float64 `json:"failover_s"`
	StalledP50S      float64 `json:"stalled_p50_s"`
	Stalled          int     `json:"stalled_conns"`
	SurvivedPct      float64 `json:"long_conns_survived_pct"`
	LongReqFailed    int     `json:"long_requests_failed"`
	NewConnFailed    int     `json:"new_conn_requests_failed"`
	NewConnFailedOut int     `json:"new_conn_failed_outside_window"`
	RejoinS          float64 `json:"rejoin_s"`
	BFDIntervalMs    float64 `json:"bfd_interval_ms"`
	BFDMultiplier    int     `json:"bfd_multiplier"`
}

// failover runs the LD-loss scenario on the router topology (bird2, two l4d on
// net_af_packet with session sync, three l7d, a client namespace) with conns long
// connections: integration's TestL4ClusterFailover, run by `go test` as a child
// (it needs root, bird2 and DPDK's headers, as the test does), with BFD at interval
// bfd between the router and the LDs ("off": none). The child's log lines go to
// out. Its figures are returned even when the test failed (a long connection
// broke), with the failure as the error.
func failover(conns int, bfd string, out io.Writer) (*failoverFigures, error) {
	dir, err := os.MkdirTemp("", "bench-l4-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "failover.json")
	cmd := exec.Command("go", "test", "-count=1", "-v", "-timeout", "10m", "-run", "^TestL4ClusterFailover$",
		"github.com/tiergate/tiergate/integration")
	cmd.Env = append(os.Environ(), "TIERGATE_FAILOVER_CONNS="+strconv.Itoa(conns), "TIERGATE_FAILOVER_OUT="+file,
		"TIERGATE_FAILOVER_BFD="+bfd)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("go test: %w", err)
	}
	var tail []string
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "l4failover_test.go:") && !strings.Contains(line, "ip route:") {
			fmt.Fprintln(out, "  "+strings.TrimSpace(line))
		}
		tail = append(tail, line)
		if len(tail) > 60 {
			tail = tail[1:]
		}
	}
	runErr := cmd.Wait()
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("the LD-loss test wrote no figures (%v): %v\n%s", runErr, err, strings.Join(tail, "\n"))
	}
	var f failoverFigures
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("the LD-loss test's figures: %w: %s", err, data)
	}
	if runErr != nil {
		return &f, fmt.Errorf("the LD-loss test failed (%v):\n%s", runErr, strings.Join(tail, "\n"))
	}
	return &f, nil
}
