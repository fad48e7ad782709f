package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestFlags: bad flags exit 2 naming them.
func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-entries", "0"}, {"-deltas", "0"}, {"-agents", "-1"}, {"-delta-entries", "0"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := Main(args, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%v: exit %d, %q", args, code, errb.String())
		}
	}
}

// TestSmallRun runs the push and delta phases on a small list, three simulated
// nodes and the real cluster, and checks the JSON line: every figure measured,
// every node counted, and the l4 figure null when its phase is skipped.
func TestSmallRun(t *testing.T) {
	testenv.RequireFile(t, softhsm.DefaultModule, "softhsm2")
	testenv.RequireCommand(t, "softhsm2-util", "softhsm2")
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin+"/", "github.com/tiergate/tiergate/cmd/controld",
		"github.com/tiergate/tiergate/cmd/keyserverd", "github.com/tiergate/tiergate/cmd/l7d").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var out, errb bytes.Buffer
	code := Main([]string{"-bin", bin, "-entries", "50000", "-agents", "3", "-deltas", "3", "-delta-entries", "100", "-skip-l4", "-timeout", "1m"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var s summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("the last line: %v\n%s", err, out.String())
	}
	if s.PushToAppliedS == nil || *s.PushToAppliedS <= 0 || s.DeltaP99Ms == nil || *s.DeltaP99Ms <= 0 || s.StoreMiB == nil || *s.StoreMiB <= 0 ||
		s.L4Ratio != nil || s.Agents != 3 || s.L7d != 2 || len(s.PushL7AppliedS) != 2 || s.Chunks < 1 {
		t.Errorf("summary %+v\n%s", s, out.String())
	}
	if *s.PushToAppliedS < *s.PushStoredS || *s.PushToAppliedS < *s.PushAgentsLastS {
		t.Errorf("the last node applied at %vs, before the push was stored (%vs) or the last agent applied (%vs)", *s.PushToAppliedS, *s.PushStoredS, *s.PushAgentsLastS)
	}
	if met := s.Targets["l4_mpps_with_1m_blacklist_ratio"]; met != nil {
		t.Errorf("the l4 target judged (%v) with its phase skipped", *met)
	}
}
