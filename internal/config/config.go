// Package config holds what every component's configuration model shares: Duration,
// written as text in YAML and JSON alike; FieldError and Checker, which name a bad
// field by its path in the YAML/JSON form ("pools.l7.members[0].address"); and Decode,
// the strict YAML/JSON decoder. A model is a plain struct with yaml and json tags whose
// zero values mean documented defaults, a Defaults method that fills them in one place
// and a Validate method that reports every problem by path; policy/route's Config is the
// template.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as text ("1.5s", "300ms") in YAML and JSON.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String returns d in time.Duration's form.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration as time.ParseDuration does.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// FieldError is a problem with one field, named by its path in the YAML/JSON form.
type FieldError struct {
	Path string
	Err  error
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }

// Checker collects FieldErrors; its zero value is ready to use.
type Checker struct {
	errs []error
}

// Add records err against path.
func (c *Checker) Add(path string, err error) {
	c.errs = append(c.errs, &FieldError{Path: path, Err: err})
}

// Addf records a formatted problem against path.
func (c *Checker) Addf(path, format string, args ...any) {
	c.Add(path, fmt.Errorf(format, args...))
}

// Nest records err under path: each FieldError in it (joined ones included) gets path
// put in front of its own, anything else is recorded at path. For a sub-model's
// Validate, so its errors name fields from the top.
func (c *Checker) Nest(path string, err error) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			c.Nest(path, e)
		}
		return
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		c.errs = append(c.errs, &FieldError{Path: At(path, fe.Path), Err: fe.Err})
		return
	}
	c.Add(path, err)
}

// Err returns every problem recorded, joined (errors.Join), or nil.
func (c *Checker) Err() error { return errors.Join(c.errs...) }

// At returns the path of field inside base ("" for the top).
func At(base, field string) string {
	switch {
	case base == "":
		return field
	case field == "":
		return base
	}
	return base + "." + field
}

// Index returns the path of element i of the list at base.
func Index(base string, i int) string { return base + "[" + strconv.Itoa(i) + "]" }

// Decode decodes YAML (or JSON, which is YAML) into v, refusing fields the model does
// not have. An empty document leaves v as it is. what names the input in errors.
func Decode(data []byte, what string, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("decoding %s: %w", what, err)
	}
	return nil
}
