package certs

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseChain(t *testing.T) {
	p := newPKI(t)
	key := ecKey(t)
	_, leaf := p.leaf(t, leafSpec{cn: "www.example.com", names: []string{"www.example.com"}, key: key})
	other := newPKI(t)
	_, foreign := other.leaf(t, leafSpec{cn: "other", names: []string{"other.example"}, key: key})
	broken := bytes.Clone(leaf)
	broken[len(broken)-1] ^= 0x01 // inside the signature
	inter, root := p.inter.Raw, p.root.DER
	var many [][]byte
	for range MaxChainLen + 1 {
		many = append(many, root)
	}

	tests := []struct {
		name    string
		data    []byte
		wantLen int
		wantErr string
	}{
		{"leaf alone", pemOf("CERTIFICATE", leaf), 1, ""},
		{"leaf and intermediate", pemOf("CERTIFICATE", leaf, inter), 2, ""},
		{"up to the root", pemOf("CERTIFICATE", leaf, inter, root), 3, ""},
		{"with text and a key", append(append([]byte("subject=www\n"), pemOf("CERTIFICATE", leaf, inter)...), keyPEM(t, key)...), 2, ""},
		{"empty", nil, 0, "no PEM certificate found"},
		{"garbage", []byte("this is not PEM\n-----BEGIN garbage"), 0, "no PEM certificate found"},
		{"key only", keyPEM(t, key), 0, "no PEM certificate found"},
		{"bad DER", pemOf("CERTIFICATE", []byte{0x30, 0x03, 1, 2, 3}), 0, "parsing certificate 1"},
		{"other block", append(pemOf("CERTIFICATE", leaf), pemOf("X509 CRL", []byte{1})...), 0, `unexpected PEM block "X509 CRL"`},
		{"issuer first", pemOf("CERTIFICATE", inter, leaf), 0, "wrong chain order"},
		{"root in the middle", pemOf("CERTIFICATE", leaf, root, inter), 0, "wrong chain order"},
		{"broken signature", pemOf("CERTIFICATE", broken, inter), 0, "does not verify"},
		{"issuer left out", pemOf("CERTIFICATE", leaf, root), 0, "list the leaf first"},
		{"foreign issuer of the same name", pemOf("CERTIFICATE", foreign, inter), 0, "does not verify"},
		{"too long", pemOf("CERTIFICATE", many...), 0, "more than 10 certificates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chain, err := ParseChain(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseChain error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(chain) != tt.wantLen {
				t.Fatalf("got %d certificates, want %d", len(chain), tt.wantLen)
			}
			if !bytes.Equal(chain[0].Raw, leaf) {
				t.Error("first certificate is not the leaf")
			}
		})
	}
}

func FuzzParseChain(f *testing.F) {
	p := newPKI(f)
	key := ecKey(f)
	_, leaf := p.leaf(f, leafSpec{cn: "fuzz", names: []string{"fuzz.example"}, key: key})
	f.Add(pemOf("CERTIFICATE", leaf, p.inter.Raw, p.root.DER))
	f.Add(pemOf("CERTIFICATE", p.inter.Raw, leaf))
	f.Add(pemOf("CERTIFICATE", leaf[:len(leaf)/2]))
	f.Add(append(pemOf("CERTIFICATE", leaf), keyPEM(f, key)...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		chain, err := ParseChain(data)
		if err != nil {
			if chain != nil {
				t.Fatal("chain returned with an error")
			}
			return
		}
		if len(chain) == 0 || len(chain) > MaxChainLen {
			t.Fatalf("accepted a chain of %d certificates", len(chain))
		}
		for i := 0; i+1 < len(chain); i++ {
			if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
				t.Fatalf("accepted a chain out of order: %v", err)
			}
		}
		namesOf(chain[0])
	})
}
