package hsm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/miekg/pkcs11"
)

// moduleDirs are searched, in order, for a module named by a URI's module-name.
var moduleDirs = []string{
	"/usr/lib/x86_64-linux-gnu/pkcs11",
	"/usr/lib/aarch64-linux-gnu/pkcs11",
	"/usr/lib/pkcs11",
	"/usr/lib/softhsm",
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu",
	"/usr/lib",
	"/usr/local/lib",
}

// resolveModule returns the module path from cfg.Module, the module-path or
// module-name of the URIs, or DefaultModule. Conflicting choices are an error.
func resolveModule(cfg *Config, uris []*URI) (string, error) {
	path, from := cfg.Module, "the module setting"
	for _, u := range uris {
		p := u.ModulePath
		if p == "" && u.ModuleName != "" {
			var err error
			if p, err = findModule(u.ModuleName); err != nil {
				return "", err
			}
		}
		if p == "" {
			continue
		}
		if path == "" {
			path, from = p, "URI "+u.String()
			continue
		}
		if !sameFile(path, p) {
			return "", fmt.Errorf("PKCS#11 module %s from %s conflicts with %s from URI %s", path, from, p, u)
		}
	}
	if path == "" {
		path = DefaultModule
	}
	return path, nil
}

func findModule(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, '/') {
		return "", fmt.Errorf("module-name %q: want a bare library name such as softhsm2", name)
	}
	for _, dir := range moduleDirs {
		for _, f := range []string{"lib" + name + ".so", name + ".so"} {
			p := filepath.Join(dir, f)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("module-name %q: no lib%s.so in %s", name, name, strings.Join(moduleDirs, ", "))
}

func sameFile(a, b string) bool {
	if a == b {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// tokenSelector says which token a Backend uses. Empty fields match anything.
type tokenSelector struct {
	desc string // how the token was named, for messages

	label, serial, manufacturer, model string
	slot                               *uint
	slotDescription, slotManufacturer  string
	libManufacturer, libDescription    string
	libVersion                         string
}

// newSelector builds the token selector from exactly one of cfg.TokenLabel,
// cfg.TokenSerial, cfg.Slot and cfg.URI or, when none is set, from the token
// attributes of the first key URI that has any.
func newSelector(cfg *Config, cfgURI *URI, keyURIs []*URI) (tokenSelector, error) {
	n := 0
	for _, set := range []bool{cfg.TokenLabel != "", cfg.TokenSerial != "", cfg.Slot != nil, cfg.URI != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return tokenSelector{}, errors.New("token_label, token_serial, slot and uri are mutually exclusive: select the token by one of them")
	}
	switch {
	case cfg.TokenLabel != "":
		return tokenSelector{desc: fmt.Sprintf("label %q", cfg.TokenLabel), label: cfg.TokenLabel}, nil
	case cfg.TokenSerial != "":
		return tokenSelector{desc: fmt.Sprintf("serial %q", cfg.TokenSerial), serial: cfg.TokenSerial}, nil
	case cfg.Slot != nil:
		s := *cfg.Slot
		return tokenSelector{desc: "slot " + strconv.FormatUint(uint64(s), 10), slot: &s}, nil
	case cfgURI != nil:
		if sel := selectorOf(cfgURI); !sel.empty() {
			return sel, nil
		}
		return tokenSelector{}, fmt.Errorf("uri %s names no token (token, serial, slot-id, ...)", cfgURI)
	}
	for _, u := range keyURIs {
		if sel := selectorOf(u); !sel.empty() {
			return sel, nil
		}
	}
	return tokenSelector{}, errors.New("no token selected: set token_label, token_serial, slot or uri")
}

func selectorOf(u *URI) tokenSelector {
	var sel tokenSelector
	sel.label, sel.serial, sel.manufacturer, sel.model = u.Token, u.Serial, u.Manufacturer, u.Model
	sel.slot = u.SlotID
	sel.slotDescription, sel.slotManufacturer = u.SlotDescription, u.SlotManufacturer
	sel.libManufacturer, sel.libDescription, sel.libVersion = u.LibraryManufacturer, u.LibraryDescription, u.LibraryVersion
	if !sel.empty() {
		tu := URI{
			Token: u.Token, Serial: u.Serial, Manufacturer: u.Manufacturer, Model: u.Model,
			SlotID: u.SlotID, SlotDescription: u.SlotDescription, SlotManufacturer: u.SlotManufacturer,
			LibraryManufacturer: u.LibraryManufacturer, LibraryDescription: u.LibraryDescription,
			LibraryVersion: u.LibraryVersion,
		}
		sel.desc = tu.String()
	}
	return sel
}

func (s tokenSelector) empty() bool {
	return s.label == "" && s.serial == "" && s.manufacturer == "" && s.model == "" && s.slot == nil &&
		s.slotDescription == "" && s.slotManufacturer == "" &&
		s.libManufacturer == "" && s.libDescription == "" && s.libVersion == ""
}

// matchesToken reports whether the token in slot, with info ti, is selected.
func (s tokenSelector) matchesToken(ctx *pkcs11.Ctx, slot uint, ti pkcs11.TokenInfo) bool {
	if s.slot != nil && *s.slot != slot {
		return false
	}
	if !eq(s.label, ti.Label) || !eq(s.serial, ti.SerialNumber) ||
		!eq(s.manufacturer, ti.ManufacturerID) || !eq(s.model, ti.Model) {
		return false
	}
	if s.slotDescription != "" || s.slotManufacturer != "" {
		si, err := ctx.GetSlotInfo(slot)
		if err != nil || !eq(s.slotDescription, si.SlotDescription) || !eq(s.slotManufacturer, si.ManufacturerID) {
			return false
		}
	}
	return true
}

// matchesLibrary reports whether the module's CK_INFO agrees with the selector.
func (s tokenSelector) matchesLibrary(info pkcs11.Info) bool {
	if !eq(s.libManufacturer, info.ManufacturerID) || !eq(s.libDescription, info.LibraryDescription) {
		return false
	}
	if s.libVersion == "" {
		return true
	}
	major, minor, hasMinor := strings.Cut(s.libVersion, ".")
	if major != strconv.Itoa(int(info.LibraryVersion.Major)) {
		return false
	}
	return !hasMinor || minor == strconv.Itoa(int(info.LibraryVersion.Minor))
}

// eq compares a wanted value with a blank-padded CK_*_INFO field. An empty want
// matches anything.
func eq(want, have string) bool {
	return want == "" || want == strings.TrimRight(have, " \x00")
}

// findToken returns the slot holding the one initialized token sel matches.
func findToken(ctx *pkcs11.Ctx, module string, sel tokenSelector) (uint, pkcs11.TokenInfo, error) {
	if sel.libManufacturer != "" || sel.libDescription != "" || sel.libVersion != "" {
		info, err := ctx.GetInfo()
		if err != nil {
			return 0, pkcs11.TokenInfo{}, fmt.Errorf("reading PKCS#11 module %s information: %w", module, err)
		}
		if !sel.matchesLibrary(info) {
			return 0, pkcs11.TokenInfo{}, fmt.Errorf("PKCS#11 module %s (%s %s %d.%d) does not match %s",
				module, strings.TrimSpace(info.ManufacturerID), strings.TrimSpace(info.LibraryDescription),
				info.LibraryVersion.Major, info.LibraryVersion.Minor, sel.desc)
		}
	}
	slots, err := ctx.GetSlotList(true)
	if err != nil {
		return 0, pkcs11.TokenInfo{}, fmt.Errorf("listing slots of PKCS#11 module %s: %w", module, err)
	}
	var (
		found   []uint
		foundTI pkcs11.TokenInfo
		seen    []string
	)
	for _, slot := range slots {
		ti, err := ctx.GetTokenInfo(slot)
		if err != nil || ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED == 0 {
			continue
		}
		seen = append(seen, fmt.Sprintf("%q (serial %s, slot %d)", strings.TrimRight(ti.Label, " "),
			strings.TrimRight(ti.SerialNumber, " "), slot))
		if sel.matchesToken(ctx, slot, ti) {
			found = append(found, slot)
			foundTI = ti
		}
	}
	switch len(found) {
	case 0:
		have := "none"
		if len(seen) > 0 {
			have = strings.Join(seen, ", ")
		}
		return 0, pkcs11.TokenInfo{}, fmt.Errorf("no initialized token with %s in PKCS#11 module %s (tokens: %s)",
			sel.desc, module, have)
	case 1:
		return found[0], foundTI, nil
	}
	return 0, pkcs11.TokenInfo{}, fmt.Errorf("%d tokens match %s in PKCS#11 module %s: select one by serial",
		len(found), sel.desc, module)
}
