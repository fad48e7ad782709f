package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestCertFlags: the cert phase is one of -phases, and -cert-uploads must be
// positive.
func TestCertFlags(t *testing.T) {
	if !slices.Contains(phaseNames, "cert") {
		t.Fatalf("phases %v lack cert", phaseNames)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"-phases", "cert", "-cert-uploads", "0"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "-cert-uploads") {
		t.Errorf("-cert-uploads 0: exit %d, %q", code, errb.String())
	}
}
