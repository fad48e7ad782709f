//go:build !tiergate_stdpatch

package stdpatch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestPatchApplied stands in for TestPatchedX25519 in a build without the patches.
// On the Go release the patches were made from, such a build is a mistake (the
// overlay was not passed, or could not be made): under `make test` it fails, so the
// suite never passes on the standard library as it is where the patch must apply.
// Elsewhere it says that the patches were left out, and why.
func TestPatchApplied(t *testing.T) {
	dir, madeFrom, err := patchesFor(runtime.Version())
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case dir == "":
		t.Skipf("no patches for %s: the standard library as it is", runtime.Version())
	case madeFrom != runtime.Version():
		t.Skipf("the patches in %s were made from %s, this is %s: the standard library as it is", dir, madeFrom, runtime.Version())
	case testenv.Strict():
		t.Fatalf("TIERGATE_REQUIRE_ALL=1 and %s is the Go the patches in %s were made from, but this build did not apply them "+
			"(no -overlay from stdpatch/overlay.sh and -tags=tiergate_stdpatch, which the Makefile passes)", madeFrom, dir)
	default:
		t.Skipf("%s is the Go the patches in %s were made from, but this build did not apply them (make test does)", madeFrom, dir)
	}
}

// patchesFor returns the patch directory for Go release version (_go1.N, "" when
// there is none) and the release its files were made from (its GOVERSION file).
func patchesFor(version string) (dir, madeFrom string, err error) {
	minor := regexp.MustCompile(`^go[0-9]+\.[0-9]+`).FindString(version)
	if minor == "" {
		return "", "", fmt.Errorf("Go version %q: no go1.N in it", version)
	}
	dir = "_" + minor
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return "", "", nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "GOVERSION"))
	if err != nil {
		return "", "", fmt.Errorf("patches in %s: %w", dir, err)
	}
	return dir, strings.TrimSpace(string(b)), nil
}

// TestReadsWithoutPatch shows what TestDrainedReadWaits measures on the standard
// library as it is: about two reads per message, one of which fails with EAGAIN.
func TestReadsWithoutPatch(t *testing.T) {
	t.Logf("%.2f read system calls per round (two messages)", pingPongReads(t, 2000))
}
