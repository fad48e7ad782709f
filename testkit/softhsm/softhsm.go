// Package softhsm creates SoftHSM2 tokens in a directory of their own, for tests and
// demos that need a real PKCS#11 token without touching the machine's SoftHSM set-up.
//
// SoftHSM finds its token directory through the configuration file named by the
// SOFTHSM2_CONF environment variable, and reads that variable once, when the module is
// initialized (C_Initialize). Child processes get it through Token.Env. A process that
// loads the module itself must call os.Setenv("SOFTHSM2_CONF", t.ConfPath) (or
// Token.Setenv) before the first C_Initialize; later changes are not seen.
package softhsm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultModule is where Debian's softhsm2 package installs the PKCS#11 module.
const DefaultModule = "/usr/lib/softhsm/libsofthsm2.so"

// Util is the name of SoftHSM's token management command.
const Util = "softhsm2-util"

// maxLabelLen is the size of CK_TOKEN_INFO.label.
const maxLabelLen = 32

// SoftHSM's PIN length limits (ulMinPinLen, ulMaxPinLen).
const (
	minPINLen = 4
	maxPINLen = 255
)

// Token is an initialized SoftHSM2 token whose files live under Dir.
type Token struct {
	// Dir holds the configuration file and the token directory.
	Dir string
	// ConfPath is Dir/softhsm2.conf, the value for SOFTHSM2_CONF.
	ConfPath string
	// Module is the PKCS#11 module to load: DefaultModule.
	Module string
	// Label is the token label.
	Label string
	// Serial is the token serial number SoftHSM assigned.
	Serial string
	// PIN is the user PIN.
	PIN string
}

// CreateToken writes dir/softhsm2.conf, creates the token directory dir/tokens and
// initializes a new token labelled label in it with the given security officer and
// user PINs. dir is created if needed. A token with that label already in dir is an
// error; OpenOrCreateToken reuses it instead.
func CreateToken(dir, label, soPIN, userPIN string) (*Token, error) {
	if err := checkArgs(label, soPIN, userPIN); err != nil {
		return nil, err
	}
	t, err := prepare(dir, label, userPIN)
	if err != nil {
		return nil, err
	}
	if _, err := t.find(); err == nil {
		return nil, fmt.Errorf("softhsm: token %q already exists in %s", label, t.Dir)
	} else if !errors.Is(err, errNoToken) {
		return nil, err
	}
	if err := t.initToken(soPIN); err != nil {
		return nil, err
	}
	s, err := t.find()
	if err != nil {
		return nil, fmt.Errorf("softhsm: token %q initialized but not listed: %w", label, err)
	}
	t.Serial = s.serial
	return t, nil
}

// OpenOrCreateToken returns the token labelled label in dir if dir already holds its
// configuration and such a token, and otherwise creates it as CreateToken does. The
// PINs of an existing token are not checked: userPIN is returned as Token.PIN.
func OpenOrCreateToken(dir, label, soPIN, userPIN string) (*Token, error) {
	if err := checkArgs(label, soPIN, userPIN); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, confName)
	if _, err := os.Stat(conf); err == nil {
		t, err := prepare(dir, label, userPIN)
		if err != nil {
			return nil, err
		}
		s, err := t.find()
		if err == nil {
			t.Serial = s.serial
			return t, nil
		}
		if !errors.Is(err, errNoToken) {
			return nil, err
		}
	}
	return CreateToken(dir, label, soPIN, userPIN)
}

// Env returns the environment entries a child process needs to see this token:
// SOFTHSM2_CONF=ConfPath. Append them to os.Environ() for exec.Cmd.Env. They do not
// affect this process: in-process users of the module call Setenv (or os.Setenv)
// before it is initialized.
func (t *Token) Env() []string {
	return []string{"SOFTHSM2_CONF=" + t.ConfPath}
}

// Setenv sets SOFTHSM2_CONF in this process. It must run before the PKCS#11 module is
// first initialized in the process: SoftHSM reads the variable only in C_Initialize.
func (t *Token) Setenv() error {
	return os.Setenv("SOFTHSM2_CONF", t.ConfPath)
}

const confName = "softhsm2.conf"

var errNoToken = errors.New("no such token")

func checkArgs(label, soPIN, userPIN string) error {
	switch {
	case label == "":
		return errors.New("softhsm: empty token label")
	case len(label) > maxLabelLen:
		return fmt.Errorf("softhsm: token label %q is longer than %d bytes", label, maxLabelLen)
	}
	for _, p := range []struct{ name, pin string }{{"security officer", soPIN}, {"user", userPIN}} {
		if len(p.pin) < minPINLen || len(p.pin) > maxPINLen {
			return fmt.Errorf("softhsm: %s PIN must be %d to %d bytes long, not %d",
				p.name, minPINLen, maxPINLen, len(p.pin))
		}
	}
	return nil
}

// prepare makes dir absolute, writes the configuration and creates the token
// directory.
func prepare(dir, label, userPIN string) (*Token, error) {
	if dir == "" {
		return nil, errors.New("softhsm: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("softhsm: %w", err)
	}
	tokens := filepath.Join(abs, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		return nil, fmt.Errorf("softhsm: creating token directory: %w", err)
	}
	t := &Token{
		Dir:      abs,
		ConfPath: filepath.Join(abs, confName),
		Module:   DefaultModule,
		Label:    label,
		PIN:      userPIN,
	}
	conf := fmt.Sprintf("# SoftHSM2 configuration for the tokens in this directory.\n"+
		"directories.tokendir = %s\n"+
		"objectstore.backend = file\n"+
		"log.level = ERROR\n", tokens)
	if err := os.WriteFile(t.ConfPath, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("softhsm: writing configuration: %w", err)
	}
	return t, nil
}

func (t *Token) initToken(soPIN string) error {
	_, err := t.util("--init-token", "--free", "--label", t.Label, "--so-pin", soPIN, "--pin", t.PIN)
	if err != nil {
		return fmt.Errorf("softhsm: initializing token %q in %s: %w", t.Label, t.Dir, err)
	}
	return nil
}

// util runs softhsm2-util with this token's configuration and returns its standard
// output. A failure carries the command's standard error.
func (t *Token) util(args ...string) ([]byte, error) {
	path, err := exec.LookPath(Util)
	if err != nil {
		return nil, fmt.Errorf("%s not found (Debian package softhsm2): %w", Util, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), t.Env()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if msg != "" {
			return nil, fmt.Errorf("%s %s: %w: %s", Util, args[0], err, msg)
		}
		return nil, fmt.Errorf("%s %s: %w", Util, args[0], err)
	}
	return stdout.Bytes(), nil
}

// slot is one entry of `softhsm2-util --show-slots`.
type slot struct {
	id          uint64
	label       string
	serial      string
	initialized bool
}

// find returns the initialized token labelled t.Label, or errNoToken.
func (t *Token) find() (slot, error) {
	out, err := t.util("--show-slots")
	if err != nil {
		return slot{}, fmt.Errorf("softhsm: listing tokens in %s: %w", t.Dir, err)
	}
	for _, s := range parseSlots(out) {
		if s.initialized && s.label == t.Label {
			return s, nil
		}
	}
	return slot{}, fmt.Errorf("softhsm: token %q in %s: %w", t.Label, t.Dir, errNoToken)
}

// parseSlots reads the output of `softhsm2-util --show-slots`.
func parseSlots(out []byte) []slot {
	var (
		slots []slot
		cur   *slot
	)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "Slot "); ok {
			id, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				continue
			}
			slots = append(slots, slot{id: id})
			cur = &slots[len(slots)-1]
			continue
		}
		if cur == nil {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "Label":
			cur.label = v
		case "Serial number":
			cur.serial = v
		case "Initialized":
			cur.initialized = v == "yes"
		}
	}
	return slots
}
