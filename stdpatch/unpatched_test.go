//go:build !tiergate_stdpatch

package stdpatch

import (
	"runtime"
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
