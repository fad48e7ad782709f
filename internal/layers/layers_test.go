package layers

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// goTool is the go command: the one running the test, which go test puts first in
// PATH.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("finding the go command: %v", err)
	}
	return p
}

// goList runs the go command with args in the module's root and returns its output.
// GOFLAGS (such as the Makefile's -overlay and -tags) pass through; the network is
// not used: every module must be in the module cache already.
func goList(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// TestRules checks the module's import graph, tests included, against Rules.
func TestRules(t *testing.T) {
	mod := strings.Fields(string(goList(t, ".", "list", "-m", "-f", "{{.Dir}} {{.Path}}")))
	if len(mod) != 2 {
		t.Fatalf("go list -m: %q", mod)
	}
	dir, module := mod[0], mod[1]
	pkgs, err := Load(bytes.NewReader(goList(t, dir, "list", "-deps", "-test", "-json", "./...")))
	if err != nil {
		t.Fatal(err)
	}
	// The rules must have something to bind: a typo in a pattern would pass forever.
	for _, path := range []string{"wire", "l4/packet", "l7", "policy/route", "certs", "keyserver", "cmd/l4d", "control/store"} {
		found := false
		for _, p := range pkgs {
			found = found || p.Path == module+"/"+path
		}
		if !found {
			t.Errorf("go list did not list %s/%s", module, path)
		}
	}
	if vs := Check(module, pkgs, Rules); len(vs) > 0 {
		t.Errorf("%d import rules broken (package imports forbidden (chain): rule):\n%s", len(vs), Report(module, vs))
	}
}

// TestCheck runs the checker on a made-up graph that breaks every rule, directly,
// through other packages or from a test file, beside packages that keep them.
func TestCheck(t *testing.T) {
	const m = "example.com/tg"
	pkgs := []Package{
		// Kept: standard library only, l4 using wire, l7 using l4 and quic-go, a test
		// of l7 using l4, the demo using the tiers.
		{Path: m + "/wire", Imports: []string{"encoding/binary", "errors"}, TestImports: []string{"testing"}},
		{Path: m + "/l4/packet", Imports: []string{m + "/wire"}, TestImports: []string{"github.com/gopacket/gopacket"}},
		{Path: m + "/l7", Imports: []string{m + "/l4/packet", "github.com/quic-go/quic-go", m + "/policy/route"}},
		{Path: m + "/l7/tunnel", Imports: []string{m + "/wire"}, TestImports: []string{m + "/l4/packet", "testing"}},
		{Path: m + "/policy/route", Imports: []string{"net/netip"}},
		{Path: m + "/cmd/l7d", Imports: []string{m + "/l7"}},
		{Path: m + "/internal/demo", Imports: []string{m + "/l7", m + "/l4/packet"}},
		{Path: m + "/demo", Imports: []string{m + "/internal/demo"}},
		{Path: m + "/l7/l7d", Imports: []string{m + "/control/agent", m + "/l7"}},
		{Path: m + "/control/agent", Imports: []string{m + "/control/model"}},
		{Path: m + "/l7/listener", Imports: []string{"net/netip"}},
		{Path: m + "/l4/node", Imports: []string{m + "/l7/listener"}},
		// Broken.
		{Path: m + "/wire/more", Imports: []string{"golang.org/x/sys/unix"}},
		{Path: m + "/wire/tested", Imports: []string{"errors"}, TestImports: []string{"errors", m + "/l4/packet"}},
		{Path: m + "/l4/datapath", Imports: []string{m + "/l4/packet", m + "/internal/glue", m + "/l4/quiccid"}},
		{Path: m + "/internal/glue", Imports: []string{m + "/l7/tunnel"}},
		{Path: m + "/l4/quiccid", Imports: []string{"github.com/quic-go/quic-go"}},
		{Path: m + "/l4/l4d", Imports: []string{m + "/keyserver/client"}, TestImports: []string{m + "/keyserver/client", m + "/demo"}},
		{Path: m + "/keyserver/client", Imports: []string{"crypto/tls"}},
		{Path: m + "/certs", Imports: []string{m + "/l7/tunnel"}},
		{Path: m + "/policy/blacklist", TestImports: []string{m + "/l7"}},
		{Path: m + "/keyserver/keyserverd", Imports: []string{m + "/internal/demo", m + "/control/api"}},
		{Path: m + "/control/api", Imports: []string{m + "/control/model"}},
		{Path: m + "/certs/chain", Imports: []string{m + "/keyserver/client"}},
		{Path: m + "/certs/upload", Imports: []string{m + "/control/store"}},
		{Path: m + "/control/store", Imports: []string{"errors"}},
		{Path: m + "/control/model", Imports: []string{m + "/control/store", m + "/policy/route"}},
		{Path: m + "/l4/agentuse", TestImports: []string{m + "/control/model"}},
		{Path: m + "/cmd/l4d", Imports: []string{m + "/l4/datapath", m + "/l4/l4d"}},
		{Path: "golang.org/x/sys/unix", Imports: []string{"syscall"}},
		{Path: "github.com/quic-go/quic-go", Imports: []string{"crypto/tls"}},
		{Path: "github.com/gopacket/gopacket"},
		{Path: "encoding/binary", Standard: true},
		{Path: "errors", Standard: true},
		{Path: "testing", Standard: true},
		{Path: "net/netip", Standard: true},
		{Path: "crypto/tls", Standard: true},
		{Path: "syscall", Standard: true},
	}
	want := []string{
		"wire/more imports golang.org/x/sys/unix (wire/more → golang.org/x/sys/unix): " + Rules[0].Name,
		"wire/tested (test) imports l4/packet (wire/tested (test) → l4/packet): " + Rules[0].Name,
		"l4/datapath imports l7/tunnel (l4/datapath → internal/glue → l7/tunnel): " + Rules[1].Name,
		"l4/l4d imports keyserver/client (l4/l4d → keyserver/client): " + Rules[1].Name,
		"l4/l4d (test) imports l7 (l4/l4d (test) → demo → internal/demo → l7): " + Rules[1].Name,
		"certs imports l7/tunnel (certs → l7/tunnel): " + Rules[2].Name,
		"policy/blacklist (test) imports l7 (policy/blacklist (test) → l7): " + Rules[2].Name,
		"keyserver/keyserverd imports internal/demo (keyserver/keyserverd → internal/demo): " + Rules[3].Name,
		"l4/l4d (test) imports demo (l4/l4d (test) → demo): " + Rules[3].Name,
		"cmd/l4d imports github.com/quic-go/quic-go (cmd/l4d → l4/datapath → l4/quiccid → github.com/quic-go/quic-go): " + Rules[4].Name,
		"certs/upload imports control/store (certs/upload → control/store): " + Rules[5].Name,
		"l4/agentuse (test) imports control/model (l4/agentuse (test) → control/model): " + Rules[5].Name,
		"keyserver/keyserverd imports control/api (keyserver/keyserverd → control/api): " + Rules[6].Name,
		"certs/chain imports keyserver/client (certs/chain → keyserver/client): " + Rules[7].Name,
	}
	got := strings.Split(strings.TrimSuffix(Report(m, Check(m, pkgs, Rules)), "\n"), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Check found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	kept := append(pkgs[:12:12], pkgs[len(pkgs)-10:]...) // and the other modules
	if vs := Check(m, kept, Rules); len(vs) != 0 {
		t.Errorf("the packages that keep the rules break them:\n%s", Report(m, vs))
	}
}

// TestLoad reads go list's output for a package with in-package and external tests,
// a dependency recompiled for the test, and the test main.
func TestLoad(t *testing.T) {
	const out = `{"ImportPath": "errors", "Standard": true}
{"ImportPath": "m/a", "Imports": ["errors", "m/b"]}
{"ImportPath": "m/b", "Imports": ["errors"]}
{"ImportPath": "m/b [m/a.test]", "ForTest": "m/a", "Imports": ["errors"]}
{"ImportPath": "m/a [m/a.test]", "ForTest": "m/a", "Imports": ["errors", "m/b [m/a.test]", "m/c", "m/c"]}
{"ImportPath": "m/a_test [m/a.test]", "ForTest": "m/a", "Imports": ["m/a [m/a.test]", "m/d"]}
{"ImportPath": "m/a.test", "Imports": ["m/a [m/a.test]", "m/a_test [m/a.test]"]}
`
	pkgs, err := Load(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pkgs {
		got = append(got, fmt.Sprintf("%s std=%v imports=%v test=%v", p.Path, p.Standard, p.Imports, p.TestImports))
	}
	want := []string{
		"errors std=true imports=[] test=[]",
		"m/a std=false imports=[errors m/b] test=[errors m/b m/c m/d]",
		"m/b std=false imports=[errors] test=[]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Load:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := Load(strings.NewReader(`{"ImportPath": "m/x", "Error": {"Err": "no Go files"}}`)); err == nil || !strings.Contains(err.Error(), "no Go files") {
		t.Errorf("a package error: %v", err)
	}
	if _, err := Load(strings.NewReader(`{"ImportPath": `)); err == nil {
		t.Error("cut output: no error")
	}
}
