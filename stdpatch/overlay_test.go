package stdpatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// patchDir is the one _go1.N directory and the release it was made from.
func patchDir(t *testing.T) (dir, madeFrom string) {
	t.Helper()
	dirs, err := filepath.Glob("_go1.*")
	if err != nil || len(dirs) != 1 {
		t.Fatalf("patch directories %v, %v: want exactly one", dirs, err)
	}
	b, err := os.ReadFile(filepath.Join(dirs[0], "GOVERSION"))
	if err != nil {
		t.Fatal(err)
	}
	madeFrom = strings.TrimSpace(string(b))
	if !strings.HasPrefix(madeFrom, dirs[0][1:]+".") && madeFrom != dirs[0][1:] {
		t.Fatalf("%s/GOVERSION says %q: not a %s release", dirs[0], madeFrom, dirs[0][1:])
	}
	return dirs[0], madeFrom
}

// fakeGo writes a go command that answers `go env GOROOT` and `go env GOVERSION` with
// root and version, and `go env GOPATH` (asked by the Makefile) with a directory.
func fakeGo(t *testing.T, root, version string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "go")
	script := fmt.Sprintf("#!/bin/sh\n[ \"$1\" = env ] || exit 2\ncase \"$2\" in\nGOROOT) echo %q;;\nGOVERSION) echo %q;;\nGOPATH) echo %q;;\n*) exit 2;;\nesac\n",
		root, version, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// changedRoot returns a Go tree whose patched files differ from the ones the patches
// were made from (or, with missing, are absent).
func changedRoot(t *testing.T, dir string, missing bool) string {
	t.Helper()
	root := t.TempDir()
	if missing {
		return root
	}
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
			files = append(files, path)
		}
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no patched files under %s", dir)
	}
	for _, f := range files {
		orig := filepath.Join(root, "src", strings.TrimPrefix(f, dir+"/"))
		if err := os.MkdirAll(filepath.Dir(orig), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(orig, []byte("package changed\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

type scriptRun struct {
	code           int
	stdout, stderr string
}

func runOverlay(t *testing.T, goCmd string, env ...string) scriptRun {
	t.Helper()
	out := filepath.Join(t.TempDir(), "overlay.json")
	cmd := exec.Command("./overlay.sh", goCmd, out)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := scriptRun{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	if r.stdout != "" {
		if r.stdout != out+"\n" {
			t.Fatalf("overlay.sh printed %q, want the overlay's path", r.stdout)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var o struct{ Replace map[string]string }
		if err := json.Unmarshal(b, &o); err != nil || len(o.Replace) == 0 {
			t.Fatalf("overlay %s: %v, %s", out, err, b)
		}
	}
	return r
}

// TestOverlayScript: overlay.sh applies the patches where the files are the ones they
// were made from, falls back quietly (exit 0, nothing printed) on another Go, and
// fails (exit 3) on the release they were made from when a file is not the one.
func TestOverlayScript(t *testing.T) {
	testenv.RequireCommand(t, "bash", "bash")
	testenv.RequireCommand(t, "sha256sum", "coreutils")
	dir, madeFrom := patchDir(t)
	minor := dir[1:]
	changed, missing := changedRoot(t, dir, false), changedRoot(t, dir, true)

	for _, tc := range []struct {
		name, root, version string
		env                 []string
		code                int
		printed             bool
		stderr              string
	}{
		{"the release, files changed", changed, madeFrom, nil, 3, false, "ERROR: " + madeFrom + " is the Go the patches"},
		{"the release, files missing", missing, madeFrom, nil, 3, false, "SHA-256 missing"},
		{"another release of " + minor + ", files changed", changed, minor + ".99", nil, 0, false, "building with the standard library as it is"},
		{"another minor", changed, "go1.99.0", nil, 0, false, "no patches for go1.99.0"},
		{"STDPATCH_GOROOT names the tree", "/nonexistent", madeFrom, []string{"STDPATCH_GOROOT=" + changed}, 3, false, changed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runOverlay(t, fakeGo(t, tc.root, tc.version), tc.env...)
			if r.code != tc.code || (r.stdout != "") != tc.printed || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d, printed %q, stderr %q; want exit %d, printed %v, stderr with %q",
					r.code, r.stdout, r.stderr, tc.code, tc.printed, tc.stderr)
			}
		})
	}

	// The Go tree in use, where it is the one the patches were made from.
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skipf("go env GOROOT: %v", err)
	}
	t.Run("the files the patches were made from", func(t *testing.T) {
		r := runOverlay(t, fakeGo(t, strings.TrimSpace(string(goroot)), madeFrom))
		if r.code == 3 && !testenv.Strict() {
			t.Skipf("this Go tree is not the one the patches were made from: %s", r.stderr)
		}
		if r.code != 0 || r.stdout == "" {
			t.Errorf("exit %d, printed %q, stderr %q; want the overlay", r.code, r.stdout, r.stderr)
		}
	})
}

// TestMakeFailsWithoutPatch: `make stdpatch-check`, which `make test` and `make unit`
// run first, fails when overlay.sh does, and passes on a Go without patches.
func TestMakeFailsWithoutPatch(t *testing.T) {
	testenv.RequireCommand(t, "make", "make")
	testenv.RequireCommand(t, "bash", "bash")
	testenv.RequireCommand(t, "sha256sum", "coreutils")
	dir, madeFrom := patchDir(t)
	changed := changedRoot(t, dir, false)
	run := func(goCmd string) (string, error) {
		cmd := exec.Command("make", "--no-print-directory", "-C", "..", "stdpatch-check", "GO="+goCmd)
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") && !strings.HasPrefix(kv, "MFLAGS=") {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(fakeGo(t, changed, madeFrom))
	if err == nil || !strings.Contains(out, "stdpatch: ERROR") || !strings.Contains(out, "failing rather than testing without them") {
		t.Errorf("make stdpatch-check with the patched files changed: %v\n%s", err, out)
	}
	if out, err := run(fakeGo(t, changed, "go1.99.0")); err != nil {
		t.Errorf("make stdpatch-check on a Go without patches: %v\n%s", err, out)
	}
}
