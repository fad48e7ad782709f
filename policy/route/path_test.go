package route

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// percentDecode decodes every %XX of b.
func percentDecode(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == '%' && i+2 < len(b) && isHex(b[i+1]) && isHex(b[i+2]) {
			out = append(out, unhex(b[i+1])<<4|unhex(b[i+2]))
			i += 2
			continue
		}
		out = append(out, b[i])
	}
	return out
}

func TestCheckAndNormalizePath(t *testing.T) {
	const (
		clean        = PathClean
		resolvable   = PathResolvable
		unresolvable = PathUnresolvable
	)
	tests := []struct {
		raw  string
		want PathVerdict
		norm string // NormalizePath's answer; "" when unresolvable
	}{
		{"/", clean, "/"},
		{"/public/index.html", clean, "/public/index.html"},
		{"/public/dir/", clean, "/public/dir/"},
		{"/a%20b/c%3Bd;jsessionid=1/.well-known/x.y", clean, "/a%20b/c%3Bd;jsessionid=1/.well-known/x.y"},
		{"/file..txt/..a/a../.x/x.", clean, "/file..txt/..a/a../.x/x."},
		{"/%41%42", clean, "/%41%42"},
		{"*", clean, "/*"},

		{"/public/..;/admin", resolvable, "/admin"},
		{"/public/..%3b/admin", resolvable, "/admin"},
		{"/public/..;jsessionid=x/admin", resolvable, "/admin"},
		{"/public/.;/admin", resolvable, "/public/admin"},
		{"/public/..%5cadmin", resolvable, "/admin"},
		{"/public/..%5Cadmin", resolvable, "/admin"},
		{"/public/..\\admin", resolvable, "/admin"},
		{"/public\\..\\admin", resolvable, "/admin"},
		{"/public%5c..%5cadmin", resolvable, "/admin"},
		{"/public/%2e%2e/admin", resolvable, "/admin"},
		{"/public/%2E%2e/admin", resolvable, "/admin"},
		{"/public/.%2e/admin", resolvable, "/admin"},
		{"/public/../admin", resolvable, "/admin"},
		{"/public/./admin", resolvable, "/public/admin"},
		{"/public/%2e/admin", resolvable, "/public/admin"},
		{"/public/..", resolvable, "/"},
		{"/public/a/..", resolvable, "/public/"},
		{"/public/.", resolvable, "/public/"},
		{"/../../etc/passwd", resolvable, "/etc/passwd"},
		{"..", resolvable, "/"},
		{"/public%2f..%2fadmin", resolvable, "/admin"},
		{"/public%2Fadmin", resolvable, "/public/admin"},
		{"//admin", resolvable, "/admin"},
		{"/public//admin/", resolvable, "/public/admin/"},
		{"/100%", resolvable, "/100%25"},
		{"/a%zzb/%4", resolvable, "/a%25zzb/%254"},

		{"/public/%00/admin", unresolvable, ""},
		{"/admin%00.html", unresolvable, ""},
		{"/public/%252e%252e/admin", unresolvable, ""},
		{"/public%252fadmin", unresolvable, ""},
		{"/public%255cadmin", unresolvable, ""},
		{"/public/.../admin", unresolvable, ""},
		{"/public/..%20/admin", unresolvable, ""},
		{"/public/. ./admin", unresolvable, ""},
	}
	for _, tt := range tests {
		if got := CheckPath([]byte(tt.raw)); got != tt.want {
			t.Errorf("CheckPath(%q) = %d, want %d", tt.raw, got, tt.want)
		}
		norm, ok := NormalizePath([]byte("x"), []byte(tt.raw))
		switch {
		case tt.want == unresolvable:
			if ok || string(norm) != "x" {
				t.Errorf("NormalizePath(%q) = %q, %v; want false and dst untouched", tt.raw, norm, ok)
			}
		case !ok || string(norm) != "x"+tt.norm:
			t.Errorf("NormalizePath(%q) = %q, %v; want %q", tt.raw, norm[1:], ok, tt.norm)
		}
	}
}

// FuzzNormalizePath: the verdict is deterministic, a path NormalizePath takes comes
// out clean and stays as it is when normalised again, and a clean path that starts
// with '/' is its own normal form.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/public/..;/admin", "/public/..%5cadmin", "/a%2f..%2F%2e%2E/b",
		"//", "/%", "/%2", "/%252e", "/.../", "\\", "/a/./b/../../../c/", "/%00", "/a;b/..;c/.;d"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		v := CheckPath(raw)
		norm, ok := NormalizePath(nil, raw)
		if ok != (v != PathUnresolvable) {
			t.Fatalf("CheckPath(%q) = %d, NormalizePath ok = %v", raw, v, ok)
		}
		if !ok {
			return
		}
		if len(norm) == 0 || norm[0] != '/' {
			t.Fatalf("NormalizePath(%q) = %q, not rooted", raw, norm)
		}
		if got := CheckPath(norm); got != PathClean {
			t.Fatalf("NormalizePath(%q) = %q, which is %d, not clean", raw, norm, got)
		}
		if again, _ := NormalizePath(nil, norm); !bytes.Equal(again, norm) {
			t.Fatalf("NormalizePath(%q) = %q, then %q", raw, norm, again)
		}
		if v == PathClean && len(raw) > 0 && raw[0] == '/' && !bytes.Equal(norm, raw) {
			t.Fatalf("the clean %q normalised to %q", raw, norm)
		}
		// What the router matches on (fasthttp's decoded and resolved path) is what a
		// backend decodes from the path forwarded.
		var u fasthttp.URI
		u.SetPathBytes(norm)
		if got, want := u.Path(), percentDecode(norm); !bytes.Equal(got, want) {
			t.Fatalf("NormalizePath(%q) = %q: the router matches %q, a backend decodes %q", raw, norm, got, want)
		}
	})
}
