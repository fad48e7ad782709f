package blsync

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// FuzzDecodeManifest: any bytes decode to a manifest that holds together, or an
// error; never a panic.
func FuzzDecodeManifest(f *testing.F) {
	m := Manifest{Name: "global", Version: 3, Base: Base{Version: 2, Entries: 1, Bytes: 30,
		Chunks: []ChunkRef{{SHA256: sum([]byte("x")), Entries: 1, Bytes: 30}}}, Deltas: DeltaRange{From: 3, To: 3, Bytes: 40}}
	data, _ := jsonMarshal(&m)
	f.Add(data)
	f.Add([]byte(`{"name":"global","version":0,"base":{"version":0,"chunks":[]},"deltas":{}}`))
	f.Add([]byte(`{"name":"global","version":5,"base":{"version":9}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeManifest("global", data)
		if err != nil {
			return
		}
		if m.Name != "global" || m.Base.Version > m.Version || len(m.Base.Chunks) > MaxChunks {
			t.Fatalf("accepted %+v", m)
		}
		if m.Deltas.Count() != 0 && m.Deltas.To != m.Version {
			t.Fatalf("accepted deltas %+v of version %d", m.Deltas, m.Version)
		}
	})
}

// FuzzDecodeDelta: a stored delta decodes to valid prefixes, or an error.
func FuzzDecodeDelta(f *testing.F) {
	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("198.51.100.7/32"), Expires: time.Unix(2000000000, 0)}},
		Remove: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
	data, _ := encodeDelta(4, d, Meta{Who: "risk", Reasons: []string{"scan"}}, time.Unix(1700000000, 0))
	f.Add(int64(4), data)
	f.Add(int64(1), []byte(`{"version":1,"add":[{"p":"::ffff:1.2.3.4"}],"remove":["1.2.3.4/33"]}`))
	f.Add(int64(1), []byte(`{"version":1,"add":[{"p":"fe80::1%eth0","x":-1}]}`))
	f.Fuzz(func(t *testing.T, v int64, data []byte) {
		d, rec, err := DecodeDelta(v, data)
		if err != nil {
			return
		}
		if rec.Version != v {
			t.Fatalf("version %d for %d", rec.Version, v)
		}
		for _, e := range d.Add {
			if !e.Prefix.IsValid() {
				t.Fatalf("invalid prefix accepted: %v", e)
			}
		}
		for _, p := range d.Remove {
			if !p.IsValid() {
				t.Fatalf("invalid prefix accepted: %v", p)
			}
		}
		l := blacklist.NewList("x", blacklist.Options{})
		if err := l.Apply(d); err != nil {
			t.Fatalf("a decoded delta does not apply: %v", err)
		}
	})
}

// FuzzDecodeChunk: a chunk is refused unless its bytes are its reference's, and
// then decodes or is refused as corrupt.
func FuzzDecodeChunk(f *testing.F) {
	cs, _ := encodeChunks(randomSet(9, 200))
	f.Add(cs[0].data, true)
	f.Add(cs[0].data, false)
	f.Add([]byte("\x89TGBL\r\n\x1a\x00\x01\x00\x00"), true)
	f.Fuzz(func(t *testing.T, data []byte, matching bool) {
		ref := ChunkRef{SHA256: sum(data), Bytes: len(data)}
		if !matching {
			ref.SHA256 = sum(append(bytes.Clone(data), 0))
		}
		s, err := decodeChunk(ref, data)
		if !matching && err == nil {
			t.Fatal("a chunk not matching its hash was accepted")
		}
		if err == nil && s == nil {
			t.Fatal("no set and no error")
		}
	})
}
