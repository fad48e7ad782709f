package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseLevels(t *testing.T) {
	got, err := parseLevels("1, 16,256,1024")
	if err != nil || !slices.Equal(got, []int{1, 16, 256, 1024}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "-3", "1,,2", "x"} {
		if _, err := parseLevels(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParsePhases(t *testing.T) {
	got, err := parsePhases("openssl,keyserverd-pkcs11")
	if err != nil || len(got) != 2 || !got["openssl"] || !got["keyserverd-pkcs11"] {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := parsePhases("openssl,nginx"); err == nil || !strings.Contains(err.Error(), `"nginx"`) {
		t.Errorf("unknown phase: %v", err)
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-levels", "0"},
		{"-duration", "0s"},
		{"-phases", "bogus"},
		{"extra"},
		{"-sessions", "-1"},
	} {
		if code := Main(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%v: exit status %d, want 2", args, code)
		}
	}
}
