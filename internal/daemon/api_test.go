package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/internal/config"
)

// decodeError reads an answer's JSON object and checks its content type.
func decodeError(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("answer %q: %v", rec.Body, err)
	}
	return m
}

func TestWriteError(t *testing.T) {
	cause := fs.ErrNotExist
	for _, tc := range []struct {
		name   string
		err    error
		status int
		want   map[string]any
	}{
		{"api error", &APIError{Status: 404, Code: CodeNotFound, Message: `no rule "x"`},
			404, map[string]any{"status": 404.0, "code": "not_found", "message": `no rule "x"`}},
		{"with cause", Wrap(409, "restart_required", "reload refused", errors.New("dpdk differs")),
			409, map[string]any{"status": 409.0, "code": "restart_required", "message": "reload refused: dpdk differs"}},
		{"cause only", &APIError{Status: 400, Code: CodeBadRequest, Err: cause},
			400, map[string]any{"status": 400.0, "code": "bad_request", "message": cause.Error()}},
		{"wrapped", fmt.Errorf("changing: %w", Errorf(503, CodeUnavailable, "stopping %d", 1)),
			503, map[string]any{"status": 503.0, "code": "unavailable", "message": "stopping 1"}},
		{"plain error", errors.New("disk on fire"),
			500, map[string]any{"status": 500.0, "code": "internal", "message": "disk on fire"}},
		{"zero api error", &APIError{Message: "?"},
			500, map[string]any{"status": 500.0, "code": "internal", "message": "?"}},
		{"too large", &http.MaxBytesError{Limit: 10},
			413, map[string]any{"status": 413.0, "code": "too_large", "message": "the request body is over 10 bytes"}},
		{"details", &APIError{Status: 422, Code: "invalid_list", Message: "2 bad lines",
			Details: struct {
				BadLines int   `json:"bad_lines"`
				Lines    []int `json:"lines"`
			}{2, []int{3, 9}}},
			422, map[string]any{"status": 422.0, "code": "invalid_list", "message": "2 bad lines",
				"bad_lines": 2.0, "lines": []any{3.0, 9.0}}},
		{"empty details", &APIError{Status: 400, Code: "x", Message: "m", Details: map[string]int{}},
			400, map[string]any{"status": 400.0, "code": "x", "message": "m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WriteError(rec, tc.err)
			if rec.Code != tc.status {
				t.Errorf("status %d, want %d", rec.Code, tc.status)
			}
			got := decodeError(t, rec)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("body %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAPIErrorUnwrap(t *testing.T) {
	err := Wrap(400, CodeBadRequest, "decoding", fs.ErrPermission)
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("errors.Is does not see the cause of %v", err)
	}
	if _, err := json.Marshal(&APIError{Details: []int{1}}); err == nil {
		t.Errorf("details that are not an object encoded")
	}
}

func TestHandler(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET /ok", Handler(func(w http.ResponseWriter, r *http.Request) error {
		WriteJSON(w, http.StatusOK, map[string]string{"a": "b"})
		return nil
	}))
	mux.Handle("GET /missing", Handler(func(w http.ResponseWriter, r *http.Request) error {
		return Errorf(http.StatusNotFound, CodeNotFound, "no %s", "thing")
	}))
	mux.Handle("GET /broken", Handler(func(w http.ResponseWriter, r *http.Request) error {
		return errors.New("broken")
	}))
	for _, tc := range []struct {
		path   string
		status int
		body   string
	}{
		{"/ok", 200, `"a": "b"`},
		{"/missing", 404, `"code": "not_found"`},
		{"/broken", 500, `"message": "broken"`},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s: %d %q, want %d with %q", tc.path, rec.Code, rec.Body, tc.status, tc.body)
		}
	}
}

func TestDecodeRequest(t *testing.T) {
	type body struct {
		A int `json:"a"`
	}
	for _, tc := range []struct {
		in     string
		status int // 0: decoded
		msg    string
	}{
		{`{"a": 1}`, 0, ""},
		{`{"b": 1}`, 400, `unknown field "b"`},
		{`{"a": 1} {}`, 400, "data after the JSON value"},
		{`[`, 400, "decoding the request body"},
		{`{"a": 1` + strings.Repeat(" ", 100) + `}`, 413, "over 64 bytes"},
	} {
		rec := httptest.NewRecorder()
		var v body
		err := DecodeRequest(rec, httptest.NewRequest("PUT", "/x", strings.NewReader(tc.in)), 64, &v)
		if tc.status == 0 {
			if err != nil || v.A != 1 {
				t.Errorf("%q: %v %+v", tc.in, err, v)
			}
			continue
		}
		e := AsAPIError(err)
		if e.Status != tc.status || !strings.Contains(e.Error(), tc.msg) {
			t.Errorf("%q: %d %v, want %d with %q", tc.in, e.Status, err, tc.status, tc.msg)
		}
	}
}

// TestDecodeNamesBadValues: a value read as text (an address) that does not parse is
// reported by its path, in JSON bodies and YAML files alike.
func TestDecodeNamesBadValues(t *testing.T) {
	type rule struct {
		VIP netip.Addr `yaml:"vip" json:"vip"`
	}
	type file struct {
		Rules []rule `yaml:"rules" json:"rules"`
	}
	var f file
	err := DecodeJSON(strings.NewReader(`{"rules": [{"vip": "192.0.2.1"}, {"vip": "www"}]}`), &f)
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Path != "rules[1].vip" || !strings.Contains(err.Error(), `"www"`) {
		t.Errorf("JSON: %v", err)
	}
	if err := DecodeJSON(strings.NewReader(`{"rules": [{"vip": "www"}`), &f); errors.As(err, &fe) || err == nil {
		t.Errorf("JSON cut short: %v", err)
	}
	err = DecodeYAML([]byte("rules:\n  - vip: 192.0.2.1\n  - vip: www\n"), "f.yaml", &f)
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), `configuration f.yaml: rules[1].vip: line 3: "www"`) {
		t.Errorf("YAML: %v", err)
	}
}
