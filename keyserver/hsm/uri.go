package hsm

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// URI is a parsed RFC 7512 PKCS#11 URI such as
//
//	pkcs11:token=edge;object=www-rsa;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/tiergate/pin
//
// Path attributes select a library, slot, token and object; query attributes say how
// to reach the token. An attribute absent from the URI, or present with an empty
// value, matches anything. Vendor attributes (names beginning "x-") are kept but not
// interpreted.
type URI struct {
	// Token is the token label (CK_TOKEN_INFO.label).
	Token string
	// Manufacturer is the token's manufacturer ID.
	Manufacturer string
	// Serial is the token's serial number.
	Serial string
	// Model is the token's model.
	Model string

	// LibraryManufacturer, LibraryDescription and LibraryVersion ("M" or "M.N")
	// describe the module (CK_INFO).
	LibraryManufacturer string
	LibraryDescription  string
	LibraryVersion      string

	// SlotDescription and SlotManufacturer describe the slot (CK_SLOT_INFO).
	SlotDescription  string
	SlotManufacturer string
	// SlotID is the slot ID, nil when absent.
	SlotID *uint

	// Object is the object label (CKA_LABEL).
	Object string
	// ID is the object ID (CKA_ID), nil when absent.
	ID []byte
	// Type is the object class: "public", "private", "cert", "secret-key" or "data".
	Type string

	// PINSource names where the PIN is read from: "file:/path" or a path. A URI that
	// names a program ("|/bin/cmd") is rejected by the backend, not the parser.
	PINSource string
	// PINValue is the PIN itself. Discouraged: the URI then is a secret. String,
	// Redact and every error of this package show it as Redacted.
	PINValue string
	// ModuleName names a module to look for in the system's module directories.
	ModuleName string
	// ModulePath is the module's file.
	ModulePath string

	// Vendor holds the x- attributes, path attributes first, each part in order.
	Vendor []VendorAttr
}

// VendorAttr is a vendor-specific ("x-") attribute of a URI.
type VendorAttr struct {
	Name  string
	Value string
	// Query is set for an attribute of the query part.
	Query bool
}

const uriScheme = "pkcs11:"

// ParseURI parses a PKCS#11 URI (RFC 7512). Values are percent-decoded. An unknown
// attribute that is not a vendor ("x-") attribute, an attribute given twice, a
// malformed percent escape, slot-id or library-version, or an unknown type is an
// error naming it.
func ParseURI(s string) (*URI, error) {
	if len(s) < len(uriScheme) || !strings.EqualFold(s[:len(uriScheme)], uriScheme) {
		return nil, fmt.Errorf("pkcs11 URI %q: does not begin with %q", Redact(s), uriScheme)
	}
	rest := s[len(uriScheme):]
	path, query, _ := strings.Cut(rest, "?")
	u := &URI{}
	seen := map[string]bool{}
	if err := u.parsePart(s, path, ";", false, seen); err != nil {
		return nil, err
	}
	if err := u.parsePart(s, query, "&", true, seen); err != nil {
		return nil, err
	}
	return u, nil
}

func (u *URI) parsePart(s, part, sep string, query bool, seen map[string]bool) error {
	if part == "" {
		return nil
	}
	s = Redact(s) // for errors
	for _, attr := range strings.Split(part, sep) {
		name, raw, ok := strings.Cut(attr, "=")
		if !ok {
			return fmt.Errorf("pkcs11 URI %q: attribute %q has no value", s, attr)
		}
		key := name
		if query {
			key = "?" + name
		}
		if seen[key] {
			return fmt.Errorf("pkcs11 URI %q: attribute %q given twice", s, name)
		}
		seen[key] = true
		v, err := pctDecode(raw)
		if err != nil {
			return fmt.Errorf("pkcs11 URI %q: attribute %q: %w", s, name, err)
		}
		if err := u.set(name, v, query); err != nil {
			return fmt.Errorf("pkcs11 URI %q: %w", s, err)
		}
	}
	return nil
}

func (u *URI) set(name string, v []byte, query bool) error {
	if strings.HasPrefix(name, "x-") {
		if !validVendorName(name[2:]) {
			return fmt.Errorf("vendor attribute name %q: want x- and letters, digits, - or _", name)
		}
		u.Vendor = append(u.Vendor, VendorAttr{Name: name, Value: string(v), Query: query})
		return nil
	}
	var dst *string
	if query {
		switch name {
		case "pin-source":
			dst = &u.PINSource
		case "pin-value":
			dst = &u.PINValue
		case "module-name":
			dst = &u.ModuleName
		case "module-path":
			dst = &u.ModulePath
		default:
			return unknownAttr(name, query)
		}
		*dst = string(v)
		return nil
	}
	switch name {
	case "token":
		dst = &u.Token
	case "manufacturer":
		dst = &u.Manufacturer
	case "serial":
		dst = &u.Serial
	case "model":
		dst = &u.Model
	case "library-manufacturer":
		dst = &u.LibraryManufacturer
	case "library-description":
		dst = &u.LibraryDescription
	case "library-version":
		if !validLibraryVersion(string(v)) {
			return fmt.Errorf("library-version %q: want M or M.N in decimal digits", v)
		}
		dst = &u.LibraryVersion
	case "slot-description":
		dst = &u.SlotDescription
	case "slot-manufacturer":
		dst = &u.SlotManufacturer
	case "slot-id":
		if !allDigits(string(v)) {
			return fmt.Errorf("slot-id %q: want a decimal number", v)
		}
		n, err := strconv.ParseUint(string(v), 10, strconv.IntSize)
		if err != nil {
			return fmt.Errorf("slot-id %q: %w", v, err)
		}
		id := uint(n)
		u.SlotID = &id
		return nil
	case "object":
		dst = &u.Object
	case "id":
		if len(v) > 0 {
			u.ID = v
		}
		return nil
	case "type":
		switch string(v) {
		case "public", "private", "cert", "secret-key", "data":
		default:
			return fmt.Errorf("type %q: want public, private, cert, secret-key or data", v)
		}
		dst = &u.Type
	default:
		return unknownAttr(name, query)
	}
	*dst = string(v)
	return nil
}

func unknownAttr(name string, query bool) error {
	part := "path"
	if query {
		part = "query"
	}
	return fmt.Errorf("unknown %s attribute %q (vendor attributes begin with \"x-\")", part, name)
}

func validVendorName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func validLibraryVersion(s string) bool {
	if s == "" {
		return true
	}
	major, minor, dot := strings.Cut(s, ".")
	return allDigits(major) && (!dot || allDigits(minor))
}

func pctDecode(s string) ([]byte, error) {
	if strings.IndexByte(s, '%') < 0 {
		return []byte(s), nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			out = append(out, c)
			continue
		}
		if i+2 >= len(s) {
			return nil, fmt.Errorf("truncated percent escape %q", s[i:])
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("bad percent escape %q", s[i:i+3])
		}
		out = append(out, hi<<4|lo)
		i += 2
	}
	return out, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Redacted stands for a pin-value wherever a URI is shown.
const Redacted = "REDACTED"

// String returns the URI in its canonical form (Canonical) with a pin-value shown as
// Redacted, so that logs and errors never hold the PIN.
func (u *URI) String() string {
	if u.PINValue == "" {
		return u.Canonical()
	}
	r := *u
	r.PINValue = Redacted
	return r.Canonical()
}

// Redact returns a pkcs11: URI as written (parsed or not) with the value of every
// pin-value attribute, however its name is escaped, replaced by Redacted: what
// errors and logs may show of a configured URI.
func Redact(s string) string {
	var b strings.Builder
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != ';' && s[i] != '&' && s[i] != '?' {
			continue
		}
		attr := s[start:i]
		if name, _, ok := strings.Cut(attr, "="); ok {
			if n, err := pctDecode(name); err == nil && strings.EqualFold(strings.TrimPrefix(string(n), uriScheme), "pin-value") ||
				strings.Contains(strings.ToLower(name), "pin-value") {
				attr = name + "=" + Redacted
			}
		}
		b.WriteString(attr)
		if i < len(s) {
			b.WriteByte(s[i])
		}
		start = i + 1
	}
	return b.String()
}

// Canonical returns the URI in the canonical form ParseURI reads back, pin-value
// included: path attributes in RFC 7512 order, then vendor path attributes, then
// the query. The id is always percent-encoded in full, other values only where RFC
// 7512 requires it. Do not log it: String is for showing.
func (u *URI) Canonical() string {
	var b strings.Builder
	b.WriteString(uriScheme)
	sep := ""
	path := func(name, v string) {
		if v == "" {
			return
		}
		b.WriteString(sep)
		b.WriteString(name)
		b.WriteByte('=')
		pctEncode(&b, []byte(v), false)
		sep = ";"
	}
	path("library-manufacturer", u.LibraryManufacturer)
	path("library-description", u.LibraryDescription)
	path("library-version", u.LibraryVersion)
	path("slot-manufacturer", u.SlotManufacturer)
	path("slot-description", u.SlotDescription)
	if u.SlotID != nil {
		path("slot-id", strconv.FormatUint(uint64(*u.SlotID), 10))
	}
	path("manufacturer", u.Manufacturer)
	path("model", u.Model)
	path("serial", u.Serial)
	path("token", u.Token)
	path("object", u.Object)
	if len(u.ID) > 0 {
		b.WriteString(sep)
		b.WriteString("id=")
		for _, c := range u.ID {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
		sep = ";"
	}
	path("type", u.Type)
	for _, a := range u.Vendor {
		if !a.Query {
			b.WriteString(sep)
			b.WriteString(a.Name)
			b.WriteByte('=')
			pctEncode(&b, []byte(a.Value), false)
			sep = ";"
		}
	}
	sep = "?"
	query := func(name, v string) {
		if v == "" {
			return
		}
		b.WriteString(sep)
		b.WriteString(name)
		b.WriteByte('=')
		pctEncode(&b, []byte(v), true)
		sep = "&"
	}
	query("pin-source", u.PINSource)
	query("pin-value", u.PINValue)
	query("module-name", u.ModuleName)
	query("module-path", u.ModulePath)
	for _, a := range u.Vendor {
		if a.Query {
			b.WriteString(sep)
			b.WriteString(a.Name)
			b.WriteByte('=')
			pctEncode(&b, []byte(a.Value), true)
			sep = "&"
		}
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

// pctEncode writes v percent-encoding every byte outside RFC 7512's pk11-pchar (path)
// or pk11-qchar (query) set.
func pctEncode(b *strings.Builder, v []byte, query bool) {
	for _, c := range v {
		if unreserved(c) || bytes.IndexByte([]byte(":[]@!$'()*+,="), c) >= 0 ||
			(!query && c == '&') || (query && (c == '/' || c == '?' || c == '|' || c == ';')) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xf])
	}
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
