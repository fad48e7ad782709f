package hsm

import (
	"encoding/hex"
	"strings"

	"github.com/tiergate/tiergate/internal/config"
)

// Validate checks what of c can be checked without the module and the token, and
// returns every problem, each a *config.FieldError named by its path within c
// ("uri", "keys[1].id", "sessions"): the URIs' syntax, that the token is selected one
// way and the PIN given one way, each key spec, and the session count. A PIN file, a
// PIN variable, a module-name, and whether the token and keys exist are New's to find.
func (c *Config) Validate() error {
	var ck config.Checker
	var cfgURI *URI
	if c.URI != "" {
		u, err := ParseURI(c.URI)
		if err != nil {
			ck.Add("uri", err)
		}
		cfgURI = u
	}
	selected := false
	for _, f := range []struct {
		path string
		set  bool
	}{{"token_label", c.TokenLabel != ""}, {"token_serial", c.TokenSerial != ""}, {"slot", c.Slot != nil}, {"uri", c.URI != ""}} {
		if f.set && selected {
			ck.Addf(f.path, "token_label, token_serial, slot and uri are mutually exclusive: select the token by one of them")
			break
		}
		selected = selected || f.set
	}
	if cfgURI != nil && c.TokenLabel == "" && c.TokenSerial == "" && c.Slot == nil && selectorOf(cfgURI).empty() {
		ck.Addf("uri", "%s names no token (token, serial, slot-id, ...)", cfgURI)
	}
	pins := 0
	for _, f := range []struct{ path, v string }{{"pin_file", c.PINFile}, {"pin_env", c.PINEnv}, {"pin", c.PIN}} {
		if f.v != "" {
			if pins++; pins == 2 {
				ck.Addf(f.path, "pin_file, pin_env and pin are mutually exclusive")
			}
		}
	}
	keyToken := false
	for i, ks := range c.Keys {
		path := config.Index("keys", i)
		n := 0
		for _, s := range []string{ks.URI, ks.ID, ks.Label} {
			if s != "" {
				n++
			}
		}
		switch {
		case n != 1:
			ck.Addf(path, "set exactly one of uri, id and label")
		case ks.URI != "":
			u, err := ParseURI(ks.URI)
			switch {
			case err != nil:
				ck.Add(config.At(path, "uri"), err)
			case u.Type != "" && u.Type != "private":
				ck.Addf(config.At(path, "uri"), "URI %s has type=%s: key URIs name private keys", Redact(ks.URI), u.Type)
			default:
				keyToken = keyToken || !selectorOf(u).empty()
			}
		case ks.ID != "":
			id, err := hex.DecodeString(strings.ReplaceAll(strings.TrimPrefix(strings.ToLower(ks.ID), "0x"), ":", ""))
			if err != nil || len(id) == 0 {
				ck.Addf(config.At(path, "id"), "%q is not hex", ks.ID)
			}
		}
	}
	if !selected && !keyToken {
		ck.Addf("token_label", "no token selected: set token_label, token_serial, slot or uri")
	}
	if c.Sessions < 0 {
		ck.Addf("sessions", "%d: must not be negative", c.Sessions)
	}
	return ck.Err()
}
