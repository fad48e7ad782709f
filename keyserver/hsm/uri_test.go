package hsm

import (
	"reflect"
	"strings"
	"testing"
)

func uintp(v uint) *uint { return &v }

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want URI
		str  string // canonical String(); "" means in
	}{
		{in: "pkcs11:", want: URI{}},
		{in: "pkcs11:token=edge;object=www-rsa;type=private", want: URI{Token: "edge", Object: "www-rsa", Type: "private"},
			str: "pkcs11:token=edge;object=www-rsa;type=private"},
		{
			in:   "pkcs11:object=my%20key;id=%01%02%ff;serial=DECC0401648;manufacturer=Snake%20Oil,%20Inc.",
			want: URI{Object: "my key", ID: []byte{1, 2, 0xff}, Serial: "DECC0401648", Manufacturer: "Snake Oil, Inc."},
			str:  "pkcs11:manufacturer=Snake%20Oil,%20Inc.;serial=DECC0401648;object=my%20key;id=%01%02%FF",
		},
		{
			// RFC 7512 section 3 examples.
			in: "pkcs11:token=The%20Software%20PKCS%2311%20Softtoken;manufacturer=Snake%20Oil,%20Inc.;model=1.0;" +
				"object=my-certificate;type=cert;id=%69%95%3E%5C%F4%BD%EC%91;serial=",
			want: URI{Token: "The Software PKCS#11 Softtoken", Manufacturer: "Snake Oil, Inc.", Model: "1.0",
				Object: "my-certificate", Type: "cert", ID: []byte{0x69, 0x95, 0x3e, 0x5c, 0xf4, 0xbd, 0xec, 0x91}},
			str: "pkcs11:manufacturer=Snake%20Oil,%20Inc.;model=1.0;token=The%20Software%20PKCS%2311%20Softtoken;" +
				"object=my-certificate;id=%69%95%3E%5C%F4%BD%EC%91;type=cert",
		},
		{
			in:   "pkcs11:object=my-sign-key;type=private?module-name=mypkcs11",
			want: URI{Object: "my-sign-key", Type: "private", ModuleName: "mypkcs11"},
		},
		{
			in:   "pkcs11:object=my-sign-key;type=private?module-path=/mnt/libmypkcs11.so.1",
			want: URI{Object: "my-sign-key", Type: "private", ModulePath: "/mnt/libmypkcs11.so.1"},
		},
		{
			in:   "pkcs11:token=Software%20PKCS%2311%20softtoken;manufacturer=Snake%20Oil,%20Inc.?pin-value=the-pin",
			want: URI{Token: "Software PKCS#11 softtoken", Manufacturer: "Snake Oil, Inc.", PINValue: "the-pin"},
			str:  "pkcs11:manufacturer=Snake%20Oil,%20Inc.;token=Software%20PKCS%2311%20softtoken?pin-value=the-pin",
		},
		{
			in:   "pkcs11:slot-description=Sun%20Metaslot",
			want: URI{SlotDescription: "Sun Metaslot"},
		},
		{
			in:   "pkcs11:library-manufacturer=Snake%20Oil,%20Inc.;library-description=Soft%20Token%20Library;library-version=1.23",
			want: URI{LibraryManufacturer: "Snake Oil, Inc.", LibraryDescription: "Soft Token Library", LibraryVersion: "1.23"},
		},
		{
			in:   "pkcs11:token=A%20name%20with%20a%20substring%20%25%3B;object=my-certificate;type=cert",
			want: URI{Token: "A name with a substring %;", Object: "my-certificate", Type: "cert"},
		},
		{
			in:   "pkcs11:token=Name%20with%20a%20small%20A%20with%20acute:%20%C3%A1;object=my-certificate;type=cert",
			want: URI{Token: "Name with a small A with acute: á", Object: "my-certificate", Type: "cert"},
		},
		{
			in: "pkcs11:slot-id=7;token=t;x-vendor=a?pin-source=file:/etc/pin&x-vendor=b",
			want: URI{SlotID: uintp(7), Token: "t", PINSource: "file:/etc/pin",
				Vendor: []VendorAttr{{Name: "x-vendor", Value: "a"}, {Name: "x-vendor", Value: "b", Query: true}}},
		},
		{
			in:   "PKCS11:token=upper-case%2fscheme",
			want: URI{Token: "upper-case/scheme"},
			str:  "pkcs11:token=upper-case%2Fscheme",
		},
		{in: "pkcs11:object=a=b&c", want: URI{Object: "a=b&c"}},
		{in: "pkcs11:?pin-source=/etc/pin%3Fx", want: URI{PINSource: "/etc/pin?x"}, str: "pkcs11:?pin-source=/etc/pin?x"},
	} {
		u, err := ParseURI(tc.in)
		if err != nil {
			t.Errorf("ParseURI(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(*u, tc.want) {
			t.Errorf("ParseURI(%q) = %+v, want %+v", tc.in, *u, tc.want)
		}
		want := tc.str
		if want == "" {
			want = tc.in
		}
		if got := u.Canonical(); got != want {
			t.Errorf("ParseURI(%q).Canonical() = %q, want %q", tc.in, got, want)
		}
	}
}

func TestParseURIErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `does not begin with "pkcs11:"`},
		{"http://example.com", `does not begin with "pkcs11:"`},
		{"pkcs11:token", `attribute "token" has no value`},
		{"pkcs11:token=a;token=b", `attribute "token" given twice`},
		{"pkcs11:?module-path=a&module-path=b", `attribute "module-path" given twice`},
		{"pkcs11:tokn=a", `unknown path attribute "tokn"`},
		{"pkcs11:token=my-token;vendor-aaa=value-a?x-vendor-bbb=value-b", `unknown path attribute "vendor-aaa"`},
		{"pkcs11:?pin=1234", `unknown query attribute "pin"`},
		{"pkcs11:pin-value=1234", `unknown path attribute "pin-value"`},
		{"pkcs11:?token=a", `unknown query attribute "token"`},
		{"pkcs11:x-=a", `vendor attribute name "x-"`},
		{"pkcs11:x-a.b=a", `vendor attribute name "x-a.b"`},
		{"pkcs11:object=%zz", `bad percent escape "%zz"`},
		{"pkcs11:object=%4", `truncated percent escape`},
		{"pkcs11:type=secret", `type "secret"`},
		{"pkcs11:type=", `type ""`},
		{"pkcs11:slot-id=", `slot-id ""`},
		{"pkcs11:slot-id=-1", `slot-id "-1"`},
		{"pkcs11:slot-id=99999999999999999999999", `slot-id "99999999999999999999999"`},
		{"pkcs11:library-version=1.", `library-version "1."`},
		{"pkcs11:library-version=a", `library-version "a"`},
		{"pkcs11:token=a;;object=b", `attribute "" has no value`},
	} {
		_, err := ParseURI(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURI(%q): err = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{
		"pkcs11:",
		"pkcs11:token=edge;object=www-rsa;type=private",
		"pkcs11:object=my%20key;id=%01%02%ff;serial=DECC0401648",
		"pkcs11:token=The%20Software%20PKCS%2311%20Softtoken;manufacturer=Snake%20Oil,%20Inc.;model=1.0;object=my-certificate;type=cert;id=%69%95%3E%5C%F4%BD%EC%91;serial=",
		"pkcs11:object=my-sign-key;type=private?module-name=mypkcs11",
		"pkcs11:object=my-sign-key;type=private?module-path=/mnt/libmypkcs11.so.1",
		"pkcs11:token=a?pin-value=the-pin&pin-source=file:/etc/pin",
		"pkcs11:library-manufacturer=Snake%20Oil,%20Inc.;library-description=Soft%20Token%20Library;library-version=1.23",
		"pkcs11:slot-id=7;slot-description=Sun%20Metaslot;slot-manufacturer=x;x-vendor=a?x-vendor=b",
		"pkcs11:token=A%20name%20with%20a%20substring%20%25%3B",
		"pkcs11:object=a=b&c",
		"pkcs11:?pin-source=/etc/pin%3Fx",
		"pkcs11:token=a;;object=b",
		"pkcs11:object=%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			return
		}
		canon := u.Canonical()
		u2, err := ParseURI(canon)
		if err != nil {
			t.Fatalf("ParseURI(%q) ok, but its String() %q does not parse: %v", s, canon, err)
		}
		if !reflect.DeepEqual(u, u2) {
			t.Fatalf("round trip of %q through %q: %+v became %+v", s, canon, u, u2)
		}
		if again := u2.Canonical(); again != canon {
			t.Fatalf("String() not stable: %q then %q", canon, again)
		}
	})
}

// TestURIRedaction: a pin-value never shows in String, in Redact of a URI as
// written, or in the errors of ParseURI and New, whatever else is wrong with it.
func TestURIRedaction(t *testing.T) {
	const pin = "s3cr3t-PIN-4711"
	u, err := ParseURI("pkcs11:token=t?pin-value=" + pin + "&module-name=m")
	if err != nil {
		t.Fatal(err)
	}
	if s := u.String(); strings.Contains(s, pin) || !strings.Contains(s, "pin-value="+Redacted) {
		t.Errorf("String() = %q", s)
	}
	if s := u.Canonical(); !strings.Contains(s, "pin-value="+pin) {
		t.Errorf("Canonical() = %q, want the PIN kept", s)
	}
	for _, s := range []string{
		"pkcs11:token=t?pin-value=" + pin,
		"pkcs11:token=t?module-name=m&pin-value=" + pin + "&x-a=b",
		"pkcs11:pin-value=" + pin + ";token=t",
		"pkcs11:token=t?pin%2Dvalue=" + pin,
		"PKCS11:token=t?PIN-VALUE=" + pin,
	} {
		if r := Redact(s); strings.Contains(r, pin) || !strings.Contains(r, Redacted) {
			t.Errorf("Redact(%q) = %q", s, r)
		}
	}
	for _, bad := range []string{
		"pkcs11:token=t;bogus=1?pin-value=" + pin,
		"pkcs11:token=t?pin-value=" + pin + "&pin-value=" + pin,
		"pkcs11:token=%zz?pin-value=" + pin,
		"pkcs11:pin-value=" + pin,
		"pkcs11:token=t?pin-value=" + pin + "&slot-id=x",
		"pkcs11:token=t?pin%2Dvalue=" + pin,
		"http://x?pin-value=" + pin,
	} {
		if _, err := ParseURI(bad); err == nil || strings.Contains(err.Error(), pin) {
			t.Errorf("ParseURI(%q): %v", bad, err)
		}
	}
	for _, cfg := range []Config{
		{URI: "pkcs11:token=no-such-token?pin-value=" + pin + "&module-path=" + DefaultModule},
		{URI: "pkcs11:token=t;bogus=1?pin-value=" + pin},
		{TokenLabel: "t", PIN: "x", Keys: []KeySpec{{URI: "pkcs11:object=k;type=public?pin-value=" + pin}}},
		{TokenLabel: "t", PIN: "x", Keys: []KeySpec{{URI: "pkcs11:object=k;token=other?pin-value=" + pin}}},
	} {
		if _, err := New(cfg); err == nil || strings.Contains(err.Error(), pin) {
			t.Errorf("New(%+v): %v", cfg.Keys, err)
		}
	}
}
