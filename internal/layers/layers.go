// Package layers holds the import rules between the tiers; its test checks them.
//
// The rules are [Rules]; [Load] reads the import graph from `go list -deps -test
// -json` and [Check] finds every package that depends on what a rule forbids it,
// directly or through other packages, with the chain of imports that leads there.
package layers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Rule forbids some packages of the module to depend on others.
type Rule struct {
	// Name says what the rule keeps, for the failure message.
	Name string
	// From are the packages the rule binds, as patterns relative to the module
	// ("l4/..." is l4 and everything under it; "cmd/l4d" that package alone).
	From []string
	// Unless are packages among From that the rule does not bind.
	Unless []string
	// To are the packages they must not depend on: patterns relative to the module, or
	// full import paths for other modules (a first element with a dot, as in
	// "github.com/quic-go/...").
	To []string
	// NonStandard forbids, in addition to To, every package outside the standard
	// library.
	NonStandard bool
	// Allow are packages among To that the From packages may depend on after all
	// (and through them on what they import).
	Allow []string
	// Tests extends the rule to the From packages' test files (their imports, and
	// what those depend on); otherwise it binds what the packages link.
	Tests bool
}

// tiers are the packages that make up the tiers and the key server: what the demo
// may use, never the other way round.
var tiers = []string{"l4/...", "l7/...", "policy/...", "certs/...", "keyserver/..."}

// daemons are the tiers' daemons, which run the control plane's node agent.
var daemons = []string{"l4/l4d", "l7/l7d", "keyserver/keyserverd"}

// sharedModels are the packages of the tiers whose models the control plane's model
// (control/model) holds, so that every node links them: leaves, free of the
// servers they configure.
var sharedModels = []string{"l7/listener", "certs/chain"}

// Rules are the import rules of the module.
var Rules = []Rule{
	{
		Name:        "wire, the contract between the tiers, imports the standard library only",
		From:        []string{"wire/..."},
		NonStandard: true,
		Tests:       true,
	},
	{
		Name:  "the L4 tier imports neither the L7 tier nor the key server (but the shared models)",
		From:  []string{"l4/..."},
		To:    []string{"l7/...", "keyserver/..."},
		Allow: sharedModels,
		Tests: true,
	},
	{
		Name:  "policy and certs, which the L4 tier and the control plane will use, do not import the L7 tier",
		From:  []string{"policy/...", "certs/..."},
		To:    []string{"l7/..."},
		Tests: true,
	},
	{
		Name:  "the tiers do not import the demo",
		From:  tiers,
		To:    []string{"internal/demo/...", "demo/..."},
		Tests: true,
	},
	{
		Name: "l4d links no quic-go (QUIC connection IDs are wire's)",
		From: []string{"cmd/l4d"},
		To:   []string{"github.com/quic-go/..."},
	},
	{
		Name:   "the domain packages do not import the control plane, which imports them (but the daemons)",
		From:   tiers,
		Unless: daemons,
		To:     []string{"control/..."},
		Tests:  true,
	},
	{
		Name:  "the daemons use the node's side of the control plane (agent, model, store) only",
		From:  daemons,
		To:    []string{"control/api/...", "control/controld/...", "control/certupload/...", "control/tgctl/..."},
		Tests: true,
	},
	{
		Name:  "the shared models import no server, tier or control plane package",
		From:  sharedModels,
		To:    append([]string{"control/...", "github.com/quic-go/...", "github.com/prometheus/...", "go.etcd.io/..."}, tiers...),
		Allow: sharedModels,
		Tests: true,
	},
}

// Package is one package of the import graph.
type Package struct {
	// Path is the import path.
	Path string
	// Standard is set for a package of the standard library.
	Standard bool
	// Imports are the import paths the package's own files import.
	Imports []string
	// TestImports are those its test files import (in the package or as package
	// path_test), when it has tests.
	TestImports []string
}

// Violation is a package that depends on what a rule forbids it.
type Violation struct {
	// Rule is the rule broken.
	Rule *Rule
	// Chain is the import path from the package bound by the rule to the forbidden
	// one, both included; a test file's import is marked " (test)" on the first.
	Chain []string
}

// line is the violation in one line, paths relative to module.
func (v Violation) line(module string) string {
	chain := make([]string, len(v.Chain))
	for i, p := range v.Chain {
		chain[i] = relative(module, p)
	}
	return fmt.Sprintf("%s imports %s (%s): %s", chain[0], chain[len(chain)-1], strings.Join(chain, " → "), v.Rule.Name)
}

// Report is the violations one per line, paths relative to module, or "" for none.
func Report(module string, vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteString(v.line(module))
		b.WriteByte('\n')
	}
	return b.String()
}

// Check returns every package of module (its import path) in pkgs that depends on
// what one of rules forbids it, with the shortest chain of imports that leads there,
// in the order of rules and then of package paths. pkgs must hold every package
// reachable from the module's, as `go list -deps` gives them.
func Check(module string, pkgs []Package, rules []Rule) []Violation {
	graph := make(map[string]*Package, len(pkgs))
	var paths []string
	for i := range pkgs {
		graph[pkgs[i].Path] = &pkgs[i]
		paths = append(paths, pkgs[i].Path)
	}
	slices.Sort(paths)
	var out []Violation
	for r := range rules {
		rule := &rules[r]
		forbidden := func(p *Package) bool {
			if match(module, rule.Allow, p.Path) {
				return false
			}
			return rule.NonStandard && !p.Standard || match(module, rule.To, p.Path)
		}
		for _, path := range paths {
			if !match(module, rule.From, path) || match(module, rule.Unless, path) || !strings.HasPrefix(path, module) {
				continue
			}
			start := graph[path]
			if chain := search(graph, start, start.Imports, forbidden); chain != nil {
				out = append(out, Violation{Rule: rule, Chain: chain})
			}
			// Test files add imports of their own; those the package has were walked.
			testOnly := slices.DeleteFunc(slices.Clone(start.TestImports), func(imp string) bool {
				return slices.Contains(start.Imports, imp)
			})
			if rule.Tests && len(testOnly) > 0 {
				if chain := search(graph, start, testOnly, forbidden); chain != nil {
					chain[0] += " (test)"
					out = append(out, Violation{Rule: rule, Chain: chain})
				}
			}
		}
	}
	return out
}

// search walks the graph breadth first from the imports first of start and returns
// the shortest chain from start to a forbidden package, or nil. The standard library
// is not walked into: it imports nothing outside itself.
func search(graph map[string]*Package, start *Package, first []string, forbidden func(*Package) bool) []string {
	parent := map[string]string{start.Path: ""}
	queue := []string{}
	visit := func(from string, imports []string) []string {
		for _, imp := range imports {
			if _, seen := parent[imp]; seen {
				continue
			}
			parent[imp] = from
			p := graph[imp]
			if p == nil {
				p = &Package{Path: imp} // not listed: judged by its path alone
			}
			if forbidden(p) {
				var chain []string
				for at := imp; at != ""; at = parent[at] {
					chain = append(chain, at)
				}
				slices.Reverse(chain)
				return chain
			}
			if !p.Standard {
				queue = append(queue, imp)
			}
		}
		return nil
	}
	if chain := visit(start.Path, first); chain != nil {
		return chain
	}
	for len(queue) > 0 {
		at := queue[0]
		queue = queue[1:]
		if p := graph[at]; p != nil {
			if chain := visit(at, p.Imports); chain != nil {
				return chain
			}
		}
	}
	return nil
}

// match reports whether path matches one of patterns (see Rule.From and Rule.To).
func match(module string, patterns []string, path string) bool {
	for _, pat := range patterns {
		full := pat
		if first, _, _ := strings.Cut(pat, "/"); !strings.Contains(first, ".") {
			full = module + "/" + pat
		}
		if base, ok := strings.CutSuffix(full, "/..."); ok {
			if path == base || strings.HasPrefix(path, base+"/") {
				return true
			}
		} else if path == full {
			return true
		}
	}
	return false
}

// relative is path relative to module when it is in it.
func relative(module, path string) string {
	if rest, ok := strings.CutPrefix(path, module+"/"); ok {
		return rest
	}
	return path
}

// listed is the part of a `go list -json` entry Load reads.
type listed struct {
	ImportPath string
	Standard   bool
	Imports    []string
	ForTest    string
	Error      *struct{ Err string }
}

// Load reads the JSON stream of `go list -deps -test -json` into packages: one per
// import path, a test variant's imports (the package's own test files, or its
// path_test package) folded into its TestImports, test mains left out.
func Load(r io.Reader) ([]Package, error) {
	dec := json.NewDecoder(r)
	byPath := map[string]*Package{}
	var order []string
	get := func(path string) *Package {
		p := byPath[path]
		if p == nil {
			p = &Package{Path: path}
			byPath[path] = p
			order = append(order, path)
		}
		return p
	}
	for {
		var l listed
		if err := dec.Decode(&l); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list output: %w", err)
		}
		if l.Error != nil {
			return nil, fmt.Errorf("go list: package %s: %s", l.ImportPath, l.Error.Err)
		}
		path := variantOf(l.ImportPath)
		imports := make([]string, 0, len(l.Imports))
		for _, imp := range l.Imports {
			imports = append(imports, variantOf(imp))
		}
		slices.Sort(imports)
		imports = slices.Compact(imports)
		switch {
		case strings.HasSuffix(l.ImportPath, ".test") && !strings.Contains(l.ImportPath, " "):
			// The generated test main.
		case l.ForTest != "" && (path == l.ForTest || path == l.ForTest+"_test"):
			p := get(l.ForTest)
			p.TestImports = append(p.TestImports, imports...)
			slices.Sort(p.TestImports)
			p.TestImports = slices.Compact(slices.DeleteFunc(p.TestImports, func(s string) bool { return s == l.ForTest }))
		case l.ForTest != "":
			// A dependency recompiled for a test: the same imports as the package.
			p := get(path)
			p.Standard = l.Standard
			if p.Imports == nil {
				p.Imports = imports
			}
		default:
			p := get(path)
			p.Standard, p.Imports = l.Standard, imports
		}
	}
	if len(order) == 0 {
		return nil, errors.New("go list listed no packages")
	}
	out := make([]Package, 0, len(order))
	for _, path := range order {
		out = append(out, *byPath[path])
	}
	return out, nil
}

// variantOf is the import path of a package variant: "p [q.test]" is p.
func variantOf(path string) string {
	p, _, _ := strings.Cut(path, " ")
	return p
}
