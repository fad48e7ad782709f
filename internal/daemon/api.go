package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/tiergate/tiergate/internal/config"
)

// APIError is the one error shape of the daemons' admin APIs, rendered by WriteError
// as the JSON object {"status": 400, "code": "invalid_config", "message": "..."}:
// status repeats the HTTP status, code is a machine-readable reason that clients
// match on, message says what went wrong for a person.
type APIError struct {
	// Status is the HTTP status to answer with. Zero means 500.
	Status int
	// Code is the machine-readable reason, e.g. CodeBadRequest. Empty means
	// CodeInternal.
	Code string
	// Message says what went wrong. When Err is set as well, the message rendered
	// is Message + ": " + Err's; when Message is empty, Err's alone.
	Message string
	// Err is the cause, if any; errors.Is and errors.As see it.
	Err error
	// Details, when not nil, encodes as a JSON object whose members are added to the
	// error object after status, code and message (e.g. the bad lines of an
	// upload).
	Details any
}

// Error codes shared by the admin APIs; each API adds its own.
const (
	CodeBadRequest  = "bad_request" // 400: the request is not what the endpoint takes
	CodeNotFound    = "not_found"   // 404: no such object
	CodeTooLarge    = "too_large"   // 413: the request body is over the endpoint's limit
	CodeInternal    = "internal"    // 500: anything not otherwise described
	CodeUnavailable = "unavailable" // 503: the daemon is stopping or not ready
)

// Errorf returns an APIError of status and code whose message is formatted as
// fmt.Sprintf does. To keep a cause for errors.Is, use Wrap.
func Errorf(status int, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an APIError of status and code whose message is msg followed by err's
// (msg may be empty), with err as its cause.
func Wrap(status int, code, msg string, err error) *APIError {
	return &APIError{Status: status, Code: code, Message: msg, Err: err}
}

func (e *APIError) Error() string {
	switch {
	case e.Err == nil:
		return e.Message
	case e.Message == "":
		return e.Err.Error()
	}
	return e.Message + ": " + e.Err.Error()
}

func (e *APIError) Unwrap() error { return e.Err }

// status returns e's HTTP status, 500 when unset.
func (e *APIError) status() int {
	if e.Status == 0 {
		return http.StatusInternalServerError
	}
	return e.Status
}

// MarshalJSON writes {"status","code","message"} and Details' members.
func (e *APIError) MarshalJSON() ([]byte, error) {
	code := e.Code
	if code == "" {
		code = CodeInternal
	}
	base, err := json.Marshal(struct {
		Status  int    `json:"status"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{e.status(), code, e.Error()})
	if err != nil || e.Details == nil {
		return base, err
	}
	more, err := json.Marshal(e.Details)
	if err != nil {
		return nil, fmt.Errorf("encoding the error's details: %w", err)
	}
	more = bytes.TrimSpace(more)
	if len(more) < 2 || more[0] != '{' {
		return nil, fmt.Errorf("the error's details encode as %.20s, not a JSON object", more)
	}
	if len(more) == 2 { // {}
		return base, nil
	}
	out := append(base[:len(base)-1:len(base)-1], ',')
	return append(out, more[1:]...), nil
}

// WriteJSON answers with status and v as indented JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// WriteError answers with err in the APIError shape: an APIError (or an error
// wrapping one) as itself, a request body over its http.MaxBytesReader limit as 413
// too_large, anything else as 500 internal with err's text.
func WriteError(w http.ResponseWriter, err error) {
	w.Header().Set("Cache-Control", "no-store")
	e := AsAPIError(err)
	WriteJSON(w, e.status(), e)
}

// AsAPIError returns the APIError err is or wraps, or one describing err as WriteError
// renders it.
func AsAPIError(err error) *APIError {
	var e *APIError
	if errors.As(err, &e) {
		return e
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &APIError{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge,
			Message: fmt.Sprintf("the request body is over %d bytes", tooBig.Limit)}
	}
	return &APIError{Status: http.StatusInternalServerError, Code: CodeInternal, Err: err}
}

// Handler is an admin-API handler that returns its error instead of writing it: a
// non-nil error is answered by WriteError. A handler that has begun its answer must
// not return an error (it could no longer be sent).
type Handler func(w http.ResponseWriter, r *http.Request) error

// ServeHTTP runs h and writes its error, if any.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h(w, r); err != nil {
		WriteError(w, err)
	}
}

// DecodeJSON decodes exactly one JSON value from r into v, refusing unknown fields
// and anything after the value. A value v's type reads as text (an address, a
// duration) that does not parse is reported as a config.FieldError naming its path
// (config.Locate).
func DecodeJSON(r io.Reader, v any) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var syntax *json.SyntaxError
		if !errors.As(err, &syntax) {
			if fe := config.Locate(data, v); fe != nil {
				return fe
			}
		}
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

// DecodeRequest decodes r's JSON body into v as DecodeJSON does, reading at most max
// bytes. A body over the limit is a 413 too_large APIError, a bad one a 400
// bad_request.
func DecodeRequest(w http.ResponseWriter, r *http.Request, max int64, v any) error {
	err := DecodeJSON(http.MaxBytesReader(w, r.Body, max), v)
	if err == nil {
		return nil
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return AsAPIError(tooBig)
	}
	return Wrap(http.StatusBadRequest, CodeBadRequest, "decoding the request body", err)
}
