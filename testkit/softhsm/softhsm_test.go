package softhsm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/testkit/testenv"
)

func TestCreateAndReopen(t *testing.T) {
	testenv.RequireCommand(t, Util, "softhsm2")
	dir := filepath.Join(t.TempDir(), "state")

	tok, err := CreateToken(dir, "tiergate-test", "so-1234", "user-5678")
	if err != nil {
		t.Fatal(err)
	}
	if tok.ConfPath != filepath.Join(dir, "softhsm2.conf") || tok.Module != DefaultModule ||
		tok.Label != "tiergate-test" || tok.PIN != "user-5678" || tok.Serial == "" {
		t.Fatalf("token = %+v", tok)
	}
	conf, err := os.ReadFile(tok.ConfPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"directories.tokendir = " + filepath.Join(dir, "tokens"),
		"objectstore.backend = file",
		"log.level = ERROR",
	} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("configuration lacks %q:\n%s", want, conf)
		}
	}
	if env := tok.Env(); len(env) != 1 || env[0] != "SOFTHSM2_CONF="+tok.ConfPath {
		t.Errorf("Env() = %q", env)
	}

	if _, err := CreateToken(dir, "tiergate-test", "so-1234", "user-5678"); err == nil ||
		!strings.Contains(err.Error(), "already exists") {
		t.Errorf("second CreateToken: err = %v, want already exists", err)
	}

	again, err := OpenOrCreateToken(dir, "tiergate-test", "so-1234", "user-5678")
	if err != nil {
		t.Fatal(err)
	}
	if again.Serial != tok.Serial {
		t.Errorf("reopened token serial %q, created %q", again.Serial, tok.Serial)
	}

	other, err := OpenOrCreateToken(dir, "second", "so-1234", "user-5678")
	if err != nil {
		t.Fatal(err)
	}
	if other.Serial == tok.Serial {
		t.Errorf("second token has the first one's serial %q", tok.Serial)
	}

	// The token is visible to a child process given Env, with the PIN set.
	if tool, err := exec.LookPath("pkcs11-tool"); err == nil {
		if _, err := os.Stat(DefaultModule); err == nil {
			cmd := exec.Command(tool, "--module", DefaultModule, "--token-label", tok.Label,
				"--login", "--pin", tok.PIN, "--list-objects")
			cmd.Env = append(os.Environ(), tok.Env()...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("pkcs11-tool with the token's environment: %v\n%s", err, out)
			}
		}
	}
}

func TestOpenOrCreateFreshDir(t *testing.T) {
	testenv.RequireCommand(t, Util, "softhsm2")
	tok, err := OpenOrCreateToken(t.TempDir(), "fresh", "so-pin", "user-pin")
	if err != nil {
		t.Fatal(err)
	}
	if tok.Serial == "" {
		t.Errorf("no serial in %+v", tok)
	}
}

func TestBadArguments(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		label, so, user, want string
	}{
		{"", "so-pin", "user-pin", "empty token label"},
		{strings.Repeat("x", 33), "so-pin", "user-pin", "longer than 32"},
		{"l", "", "user-pin", "security officer PIN must be 4 to 255"},
		{"l", "so-pin", "123", "user PIN must be 4 to 255"},
	} {
		_, err := CreateToken(dir, tc.label, tc.so, tc.user)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateToken(%q, %q, %q): err = %v, want %q", tc.label, tc.so, tc.user, err, tc.want)
		}
	}
}

func TestUtilErrorCarriesStderr(t *testing.T) {
	testenv.RequireCommand(t, Util, "softhsm2")
	tok, err := CreateToken(t.TempDir(), "pins", "so-pin", "user-pin")
	if err != nil {
		t.Fatal(err)
	}
	// softhsm2-util refuses a PIN shorter than SoftHSM's minimum of four.
	_, err = tok.util("--init-token", "--free", "--label", "short", "--so-pin", "1", "--pin", "2")
	if err == nil {
		t.Fatal("softhsm2-util accepted a one-digit PIN")
	}
	if !strings.Contains(err.Error(), "PIN") {
		t.Errorf("error %q does not carry softhsm2-util's message", err)
	}
}

func TestParseSlots(t *testing.T) {
	out := `Available slots:
Slot 1652141830
    Slot info:
        Description:      SoftHSM slot ID 0x6279af06
    Token info:
        Serial number:    ddf152b66279af06
        Initialized:      yes
        User PIN init.:   yes
        Label:            t1
Slot 1
    Slot info:
        Description:      SoftHSM slot ID 0x1
    Token info:
        Initialized:      no
        Label:
`
	got := parseSlots([]byte(out))
	if len(got) != 2 {
		t.Fatalf("parsed %d slots, want 2: %+v", len(got), got)
	}
	if got[0] != (slot{id: 1652141830, label: "t1", serial: "ddf152b66279af06", initialized: true}) {
		t.Errorf("slot 0 = %+v", got[0])
	}
	if got[1].initialized || got[1].label != "" {
		t.Errorf("slot 1 = %+v", got[1])
	}
}
