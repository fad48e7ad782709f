package benchkit

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// OpenSSLRSA is one row of `openssl speed rsaN`.
type OpenSSLRSA struct {
	Bits           int
	SignPerSec     float64
	VerifyPerSec   float64
	Command        string // as run
	OpenSSLVersion string
}

// OpenSSLSpeedRSA runs `openssl speed -seconds S -multi N rsaBITS` (without -multi
// when procs < 2) and returns its summary row. The binary comes from Debian's openssl
// package.
func OpenSSLSpeedRSA(ctx context.Context, bits, seconds, procs int) (*OpenSSLRSA, error) {
	path, err := exec.LookPath("openssl")
	if err != nil {
		return nil, fmt.Errorf("openssl not found (Debian package openssl): %w", err)
	}
	args := []string{"speed", "-seconds", strconv.Itoa(max(seconds, 1))}
	if procs > 1 {
		args = append(args, "-multi", strconv.Itoa(procs))
	}
	args = append(args, "rsa"+strconv.Itoa(bits))
	cmd := exec.CommandContext(ctx, path, args...)
	out, err := cmd.Output()
	command := "openssl " + strings.Join(args, " ")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", command, err)
	}
	r, err := ParseOpenSSLSpeedRSA(string(out), bits)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", command, err)
	}
	r.Command = command
	if v, err := exec.CommandContext(ctx, path, "version").Output(); err == nil {
		r.OpenSSLVersion = strings.TrimSpace(string(v))
	}
	return r, nil
}

// ParseOpenSSLSpeedRSA reads the summary table of `openssl speed rsaN` output:
//
//	                  sign    verify    sign/s verify/s
//	rsa 2048 bits 0.000248s 0.000016s   4029.5  61274.0
//
// OpenSSL 3.2 and later add encryption columns; the rates are found by the
// header's column names.
func ParseOpenSSLSpeedRSA(out string, bits int) (*OpenSSLRSA, error) {
	var header []string
	prefix := []string{"rsa", strconv.Itoa(bits), "bits"}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && f[0] == "sign" {
			header = f
			continue
		}
		if len(f) < len(prefix) || f[0] != prefix[0] || f[1] != prefix[1] || f[2] != prefix[2] || header == nil {
			continue
		}
		vals := f[len(prefix):]
		if len(vals) != len(header) {
			return nil, fmt.Errorf("row %q has %d values under %d column names", sc.Text(), len(vals), len(header))
		}
		r := &OpenSSLRSA{Bits: bits}
		for i, name := range header {
			var dst *float64
			switch name {
			case "sign/s":
				dst = &r.SignPerSec
			case "verify/s":
				dst = &r.VerifyPerSec
			default:
				continue
			}
			v, err := strconv.ParseFloat(vals[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s value %q: %w", name, vals[i], err)
			}
			*dst = v
		}
		if r.SignPerSec <= 0 {
			return nil, fmt.Errorf("no sign/s column in %q", sc.Text())
		}
		return r, nil
	}
	return nil, fmt.Errorf("no \"rsa %d bits\" summary row in the output", bits)
}
