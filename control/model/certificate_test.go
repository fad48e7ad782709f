package model

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/store"
)

func TestCertificateDaysLeft(t *testing.T) {
	c := &Certificate{NotAfter: time.Date(2030, 1, 10, 12, 0, 0, 0, time.UTC)}
	for _, tc := range []struct {
		now  time.Time
		want int
	}{
		{time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC), 9},
		{time.Date(2030, 1, 1, 12, 0, 1, 0, time.UTC), 8},
		{time.Date(2030, 1, 10, 11, 0, 0, 0, time.UTC), 0},
		{time.Date(2030, 1, 10, 12, 0, 0, 0, time.UTC), 0},
		{time.Date(2030, 1, 10, 13, 0, 0, 0, time.UTC), -1},
		{time.Date(2030, 1, 12, 12, 0, 0, 0, time.UTC), -2},
	} {
		if got := c.DaysLeft(tc.now); got != tc.want {
			t.Errorf("DaysLeft at %s = %d, want %d", tc.now, got, tc.want)
		}
	}
}

func TestCertificateVersionKeyAndJSON(t *testing.T) {
	key := CertVersionKey("www", 12)
	if key != "/tiergate/certversions/v1/www/12" || strings.HasPrefix(key, store.Prefix) {
		t.Fatalf("CertVersionKey = %q: want a key outside the nodes' prefix %s", key, store.Prefix)
	}
	c := newCert(t, "www", ecdsaKey(t).Public(), "www.example.com")
	v := CertificateVersion{Certificate: *c, Uploaded: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), UploadedBy: "certs", Keyservers: []string{"198.18.0.1:2407"}}
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate's fields sit beside the upload's, and read back whole.
	var flat map[string]any
	if err := json.Unmarshal(data, &flat); err != nil || flat["key_id"] != c.KeyID || flat["uploaded_by"] != "certs" || flat["version"] != float64(1) {
		t.Fatalf("version JSON: %s", data)
	}
	var back CertificateVersion
	if err := json.Unmarshal(data, &back); err != nil || back.Chain != c.Chain || !back.Uploaded.Equal(v.Uploaded) || back.Validate() != nil {
		t.Fatalf("read back: %+v, %v", back, err)
	}
}
