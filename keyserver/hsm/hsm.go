// Package hsm is keyserverd's PKCS#11 key backend: private keys stay in a token (an
// HSM, or SoftHSM2 in development and tests) and every signature or decryption is a
// call into the token.
//
// # Sessions and login
//
// PKCS#11 login state belongs to the application and the token, not to a session: once
// one session logs in, every session the process has on that token may use private
// keys. A Backend therefore keeps one read-write session that logs in and is used for
// finding and importing objects, and a pool of read-only operation sessions that never
// log in themselves. An operation takes a session from the pool, runs
// C_SignInit+C_Sign (or C_DecryptInit+C_Decrypt) with the key's private object handle,
// which was found once when the key was loaded, and returns the session. Nothing is
// searched and nobody logs in on the operation path.
//
// A module is initialized once per process whatever the number of Backends using it,
// and finalized when the last one closes; likewise the token is logged out only when
// the last Backend logged in to it closes.
//
// # Keys
//
// A key is a CKO_PRIVATE_KEY object; its public key comes from the CKO_PUBLIC_KEY
// object with the same CKA_ID (for RSA, failing that, from the private key's own
// modulus and exponent). Served are RSA of at least 2048 bits (CKM_RSA_PKCS for
// PKCS #1 v1.5 signatures over a DigestInfo and for decryption, CKM_RSA_PKCS_PSS),
// ECDSA on P-256 and P-384 (CKM_ECDSA, the raw r||s result re-encoded as ASN.1 DER)
// and Ed25519 (CKK_EC_EDWARDS keys, CKM_EDDSA), each only if the token offers its
// mechanism. Keys are named, as everywhere in keyserverd, by the SHA-256 of their
// SubjectPublicKeyInfo; Import stores that ID as CKA_ID.
//
// # Recovery
//
// Tokens lose sessions and logins: a network HSM restarts, a USB token is replugged,
// another library in the process calls C_CloseAllSessions. When an operation fails with
// a session, login, handle or device error, the Backend checks the login session (and
// reopens it and logs in again if needed), replaces the operation session, finds the
// key's object again if its handle went stale, and retries the operation once.
// Recovery is serialized, so a burst of failing operations recovers the login once;
// sessions from before a lost login are replaced as they are next taken from the pool.
// Recoveries counts the operations that needed it.
package hsm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/miekg/pkcs11"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// DefaultModule is the PKCS#11 module used when none is configured: SoftHSM2 as
// installed by Debian's softhsm2 package. Production configurations name their HSM
// vendor's module.
const DefaultModule = "/usr/lib/softhsm/libsofthsm2.so"

// Config selects a module, a token in it, how to log in and which keys to serve. The
// token is chosen by exactly one of TokenLabel, TokenSerial, Slot and URI (or else by
// a key URI's token attributes); the PIN comes from exactly one of PINFile, PINEnv and
// PIN, or else from a URI's pin-source or pin-value. It is the model of keyserverd's
// pkcs11 section, with the same names in YAML and JSON; Logger is a program's. Every
// field's zero value means the default its comment gives; Validate checks what can be
// checked without the module, naming fields by path ("keys[1].id"), and New the rest.
type Config struct {
	// Module is the path of the PKCS#11 library. Default: the module-path (or
	// module-name) of URI or a key URI, else DefaultModule.
	Module string `yaml:"module" json:"module,omitempty"`

	// URI is an RFC 7512 pkcs11: URI naming the token by its path attributes (token,
	// serial, manufacturer, model, slot-id, ...), and optionally the module
	// (module-path, module-name) and PIN (pin-source, pin-value). Default: none.
	URI string `yaml:"uri" json:"uri,omitempty"`
	// TokenLabel selects the token whose label is this. Default: none.
	TokenLabel string `yaml:"token_label" json:"token_label,omitempty"`
	// TokenSerial selects the token whose serial number is this. Default: none.
	TokenSerial string `yaml:"token_serial" json:"token_serial,omitempty"`
	// Slot selects the token in the slot with this ID. Slot IDs may change when
	// tokens are added or removed; prefer TokenLabel or TokenSerial. Default: none.
	Slot *uint `yaml:"slot" json:"slot,omitempty"`

	// PIN is the user PIN itself. Discouraged: the configuration becomes a secret.
	// Default: none.
	PIN string `yaml:"pin" json:"pin,omitempty"`
	// PINFile is a file holding the user PIN; a trailing line ending is removed.
	// Default: none.
	PINFile string `yaml:"pin_file" json:"pin_file,omitempty"`
	// PINEnv is the name of an environment variable holding the user PIN. Default:
	// none.
	PINEnv string `yaml:"pin_env" json:"pin_env,omitempty"`

	// Keys selects the private keys to serve. Default (empty): every private key on
	// the token whose type the backend supports; others are logged and skipped.
	Keys []KeySpec `yaml:"keys" json:"keys,omitempty"`

	// AllowExtractable serves keys whose value can leave the token (CKA_EXTRACTABLE
	// true, or CKA_SENSITIVE false: made by a tool that did not protect them), with
	// a warning. Default false: such a key is refused: one that Keys names fails
	// New, one found by listing every key is skipped with an error logged. Either
	// way it is counted (ExtractableKeys). Keys imported by Import are sensitive and
	// non-extractable.
	AllowExtractable bool `yaml:"allow_extractable" json:"allow_extractable,omitempty"`

	// Sessions is the number of operation sessions, which bounds the operations in
	// flight on the token. Default: 4 × GOMAXPROCS, capped below the token's
	// maximum session count when it announces one, and at least 1.
	Sessions int `yaml:"sessions" json:"sessions,omitempty"`

	// Logger receives the backend's logs. Default slog.Default().
	Logger *slog.Logger `yaml:"-" json:"-"`
}

// KeySpec selects keys on the token by exactly one of its fields. A configured key
// that matches nothing is an error.
type KeySpec struct {
	// URI is an RFC 7512 pkcs11: URI; its object, id and type (which must be
	// "private" if given) select private keys, all of those it matches. Token
	// attributes in it must agree with the backend's token. Default: none.
	URI string `yaml:"uri" json:"uri,omitempty"`
	// ID is the key's CKA_ID in hex (for keys imported by keyserverd, the key ID:
	// the SHA-256 of the SubjectPublicKeyInfo). It must match exactly one key.
	// Default: none.
	ID string `yaml:"id" json:"id,omitempty"`
	// Label is the key's CKA_LABEL. It must match exactly one key. Default: none.
	Label string `yaml:"label" json:"label,omitempty"`
}

// ErrClosed is returned by operations on a closed Backend or its keys.
var ErrClosed = errors.New("hsm: backend closed")

// MechanismError reports that the token lacks a mechanism a key or operation needs,
// such as CKM_EDDSA for Ed25519 keys. It matches backend.ErrUnsupportedKey.
type MechanismError struct {
	Token     string // token label
	Mechanism string // e.g. "CKM_EDDSA"
	For       string // what needed it, e.g. "Ed25519 keys"
}

func (e *MechanismError) Error() string {
	return fmt.Sprintf("hsm: token %q does not support %s, needed for %s", e.Token, e.Mechanism, e.For)
}

// Unwrap makes errors.Is(err, backend.ErrUnsupportedKey) hold.
func (e *MechanismError) Unwrap() error { return backend.ErrUnsupportedKey }

// Backend serves the keys of one PKCS#11 token. It is safe for concurrent use.
type Backend struct {
	log         *slog.Logger
	mod         *module
	sel         tokenSelector
	pin         string
	tokenLabel  string
	tokenKey    string // identifies the token's login in mod
	needsLogin  bool
	holdsLogin  bool
	mechs       map[uint]bool
	sessionsMax int

	slot atomic.Uint64 // slot ID; may change when the token is reinserted

	// mu guards the login session, the key set and object searches.
	mu        sync.Mutex
	login     pkcs11.SessionHandle
	loginOpen bool
	keys      []*keyObject
	byID      map[protocol.KeyID]*keyObject
	closed    bool

	// recoverMu serializes recovery. Lock order: recoverMu, then mu.
	recoverMu sync.Mutex
	// sessEpoch counts losses of the login session: operation sessions opened before
	// the latest are presumed closed along with it.
	sessEpoch atomic.Uint64
	// handleEpoch counts logins after a lost login: object handles found before the
	// latest are presumed stale.
	handleEpoch atomic.Uint64

	pool      chan opSession
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error

	allowExtractable   bool
	extractableRefused atomic.Int64 // keys refused for being extractable
	extractableServed  atomic.Int64 // extractable keys served (AllowExtractable)

	recoveries atomic.Uint64
	finds      atomic.Uint64 // C_FindObjectsInit calls
	logins     atomic.Uint64 // C_Login calls
}

// opSession is an operation session as kept in the pool. A dead entry holds no
// session; whoever takes it opens a new one.
type opSession struct {
	h     pkcs11.SessionHandle
	epoch uint64
	dead  bool
}

var _ backend.Backend = (*Backend)(nil)

// New checks cfg (Validate), loads the module, finds the token, logs in, loads the
// configured keys and opens the operation sessions.
func New(cfg Config) (*Backend, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("hsm: %w", err)
	}
	b, err := newBackend(&cfg)
	if err != nil {
		return nil, fmt.Errorf("hsm: %w", err)
	}
	return b, nil
}

func newBackend(cfg *Config) (*Backend, error) {
	var cfgURI *URI
	if cfg.URI != "" {
		u, err := ParseURI(cfg.URI)
		if err != nil {
			return nil, err
		}
		cfgURI = u
	}
	specs, err := parseKeySpecs(cfg.Keys)
	if err != nil {
		return nil, err
	}
	var uris, keyURIs []*URI
	if cfgURI != nil {
		uris = append(uris, cfgURI)
	}
	for _, s := range specs {
		if s.uri != nil {
			keyURIs = append(keyURIs, s.uri)
		}
	}
	uris = append(uris, keyURIs...)

	modPath, err := resolveModule(cfg, uris)
	if err != nil {
		return nil, err
	}
	sel, err := newSelector(cfg, cfgURI, keyURIs)
	if err != nil {
		return nil, err
	}
	if cfg.Sessions < 0 {
		return nil, fmt.Errorf("sessions %d: must not be negative", cfg.Sessions)
	}
	pin, pinErr := resolvePIN(cfg, uris)
	if pinErr != nil && !errors.Is(pinErr, ErrNoPIN) {
		return nil, pinErr
	}

	mod, err := openModule(modPath)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		log:   cfg.Logger,
		mod:   mod,
		sel:   sel,
		pin:   pin,
		mechs: map[uint]bool{},
		byID:  map[protocol.KeyID]*keyObject{},
		done:  make(chan struct{}),

		allowExtractable: cfg.AllowExtractable,
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	if err := b.start(cfg, specs, pinErr); err != nil {
		for len(b.pool) > 0 {
			_ = mod.ctx.CloseSession((<-b.pool).h)
		}
		_ = b.teardown()
		return nil, err
	}
	return b, nil
}

// start does the part of New that needs cleaning up after a failure.
func (b *Backend) start(cfg *Config, specs []keySpec, pinErr error) error {
	ctx := b.mod.ctx
	slot, ti, err := findToken(ctx, b.mod.path, b.sel)
	if err != nil {
		return err
	}
	b.slot.Store(uint64(slot))
	b.tokenLabel = trimField(ti.Label)
	b.tokenKey = trimField(ti.SerialNumber) + "\x00" + b.tokenLabel
	b.needsLogin = ti.Flags&pkcs11.CKF_LOGIN_REQUIRED != 0
	if b.needsLogin && pinErr != nil {
		return fmt.Errorf("token %q needs a login: %w", b.tokenLabel, pinErr)
	}
	if ti.Flags&pkcs11.CKF_USER_PIN_LOCKED != 0 {
		return fmt.Errorf("token %q: the user PIN is locked", b.tokenLabel)
	}

	if ms, err := ctx.GetMechanismList(slot); err == nil {
		for _, m := range ms {
			b.mechs[m.Mechanism] = true
		}
	} else {
		return fmt.Errorf("listing mechanisms of token %q: %w", b.tokenLabel, err)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.openLoginLocked(); err != nil {
		return err
	}
	if b.needsLogin {
		if !b.mod.holdLogin(b.tokenKey, b.pin) {
			return fmt.Errorf("logging in to token %q: wrong PIN (another backend in this process is logged in to the token with a different one)", b.tokenLabel)
		}
		b.holdsLogin = true
	}
	if err := b.loadKeysLocked(specs, slot, ti); err != nil {
		return err
	}

	n := cfg.Sessions
	if n == 0 {
		n = defaultSessions(ti.MaxSessionCount)
	}
	b.sessionsMax = n
	b.pool = make(chan opSession, n)
	for i := 0; i < n; i++ {
		h, err := ctx.OpenSession(slot, pkcs11.CKF_SERIAL_SESSION)
		if err != nil {
			return fmt.Errorf("opening operation session %d of %d on token %q: %w", i+1, n, b.tokenLabel, err)
		}
		b.pool <- opSession{h: h}
	}
	b.log.Info("pkcs11 token ready", "module", b.mod.path, "token", b.tokenLabel,
		"serial", trimField(ti.SerialNumber), "slot", slot, "keys", len(b.keys), "sessions", n)
	return nil
}

// defaultSessions is 4 × GOMAXPROCS, capped to leave the login session room under
// the token's maximum, and at least 1.
func defaultSessions(maxCount uint) int {
	n := 4 * runtime.GOMAXPROCS(0)
	if maxCount != pkcs11.CK_EFFECTIVELY_INFINITE && maxCount != pkcs11.CK_UNAVAILABLE_INFORMATION {
		if limit := int(maxCount) - 1; limit < n {
			n = limit
		}
	}
	return max(n, 1)
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "pkcs11" }

// Keys implements backend.Backend: the keys loaded by New and those imported since.
func (b *Backend) Keys() ([]*backend.Key, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	ks := make([]*backend.Key, len(b.keys))
	for i, k := range b.keys {
		ks[i] = k.key
	}
	return ks, nil
}

// ExtractableKeys returns how many of the token's keys whose value can leave it
// (CKA_EXTRACTABLE true or CKA_SENSITIVE false) New refused, and how many it served
// (Config.AllowExtractable).
func (b *Backend) ExtractableKeys() (refused, served int) {
	return int(b.extractableRefused.Load()), int(b.extractableServed.Load())
}

// Recoveries returns how many operations failed with a session, login, handle or
// device error and were retried after recovery.
func (b *Backend) Recoveries() uint64 { return b.recoveries.Load() }

// Close waits for operations in flight, closes the sessions, logs out of the token if
// no other Backend in the process relies on the login, and releases the module.
// Operations on the backend's keys fail with ErrClosed afterwards.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		close(b.done)
		ctx := b.mod.ctx
		for i := 0; i < b.sessionsMax; i++ {
			s := <-b.pool
			if !s.dead && s.epoch == b.sessEpoch.Load() {
				_ = ctx.CloseSession(s.h)
			}
		}
		b.closeErr = b.teardown()
	})
	return b.closeErr
}

// teardown logs out, closes the login session and releases the module.
func (b *Backend) teardown() error {
	b.mu.Lock()
	b.closed = true
	var errs []error
	if b.holdsLogin {
		b.holdsLogin = false
		if b.mod.dropLogin(b.tokenKey) && b.loginOpen {
			if err := b.mod.ctx.Logout(b.login); err != nil && !isRV(err, pkcs11.CKR_USER_NOT_LOGGED_IN) &&
				!isSessionGone(err) {
				errs = append(errs, fmt.Errorf("logging out of token %q: %w", b.tokenLabel, err))
			}
		}
	}
	if b.loginOpen {
		b.loginOpen = false
		if err := b.mod.ctx.CloseSession(b.login); err != nil && !isSessionGone(err) {
			errs = append(errs, fmt.Errorf("closing session on token %q: %w", b.tokenLabel, err))
		}
	}
	b.mu.Unlock()
	if err := b.mod.release(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hsm: %w", err)
	}
	return nil
}

// openLoginLocked opens the login session and logs in. b.mu is held.
func (b *Backend) openLoginLocked() error {
	ctx := b.mod.ctx
	slot := uint(b.slot.Load())
	h, err := ctx.OpenSession(slot, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if isRV(err, pkcs11.CKR_TOKEN_WRITE_PROTECTED) {
		h, err = ctx.OpenSession(slot, pkcs11.CKF_SERIAL_SESSION)
	}
	if err != nil {
		return fmt.Errorf("opening session on token %q (slot %d): %w", b.tokenLabel, slot, err)
	}
	b.login, b.loginOpen = h, true
	if b.needsLogin {
		if err := b.doLoginLocked(); err != nil {
			return err
		}
	}
	return nil
}

func (b *Backend) doLoginLocked() error {
	b.logins.Add(1)
	err := b.mod.ctx.Login(b.login, pkcs11.CKU_USER, b.pin)
	switch {
	case err == nil, isRV(err, pkcs11.CKR_USER_ALREADY_LOGGED_IN):
		return nil
	case isRV(err, pkcs11.CKR_PIN_INCORRECT):
		return fmt.Errorf("logging in to token %q: wrong PIN (%w)", b.tokenLabel, err)
	case isRV(err, pkcs11.CKR_PIN_LOCKED):
		return fmt.Errorf("logging in to token %q: the user PIN is locked (%w)", b.tokenLabel, err)
	case isRV(err, pkcs11.CKR_USER_PIN_NOT_INITIALIZED):
		return fmt.Errorf("logging in to token %q: the user PIN is not initialized (%w)", b.tokenLabel, err)
	}
	return fmt.Errorf("logging in to token %q: %w", b.tokenLabel, err)
}

// ensureLoginLocked makes sure the login session is open and logged in, reopening it,
// finding the token again and logging in as needed. b.mu is held.
func (b *Backend) ensureLoginLocked() error {
	ctx := b.mod.ctx
	if b.loginOpen {
		info, err := ctx.GetSessionInfo(b.login)
		if err == nil {
			if !b.needsLogin || info.State == pkcs11.CKS_RO_USER_FUNCTIONS || info.State == pkcs11.CKS_RW_USER_FUNCTIONS {
				return nil
			}
			// Logged out behind our back: private object handles may have gone with it.
			b.handleEpoch.Add(1)
			return b.doLoginLocked()
		}
		b.loginOpen = false
	}
	// The login session is gone, and with it, presumably, every session of the
	// process on this token: do not close them, their handles may be reused.
	b.sessEpoch.Add(1)
	b.handleEpoch.Add(1)
	err := b.openLoginLocked()
	if err != nil && (isDeviceGone(err) || isRV(err, pkcs11.CKR_SLOT_ID_INVALID)) {
		// A reinserted token may sit in another slot.
		slot, _, ferr := findToken(ctx, b.mod.path, b.sel)
		if ferr != nil {
			return fmt.Errorf("%w (looking for the token again: %v)", err, ferr)
		}
		b.slot.Store(uint64(slot))
		err = b.openLoginLocked()
	}
	if err != nil {
		return err
	}
	b.log.Warn("pkcs11 token session recovered", "token", b.tokenLabel, "slot", b.slot.Load())
	return nil
}

// acquire takes an operation session from the pool, replacing one that is dead or
// from before the latest loss of the login session. When ctx ends first, it gives up
// with an error wrapping backend.ErrBusy. Unless the error is ErrClosed or ErrBusy,
// the returned session, dead if it could not be replaced, must be released.
func (b *Backend) acquire(ctx context.Context) (opSession, error) {
	var s opSession
	select {
	case s = <-b.pool:
	case <-b.done:
		return s, ErrClosed
	case <-ctx.Done():
		return s, fmt.Errorf("%w: none of the %d sessions on token %q came free in time (%v)", backend.ErrBusy, b.sessionsMax, b.tokenLabel, context.Cause(ctx))
	}
	select {
	case <-b.done:
		b.pool <- s
		return s, ErrClosed
	default:
	}
	if s.dead || s.epoch != b.sessEpoch.Load() {
		return b.openOpSession()
	}
	return s, nil
}

func (b *Backend) release(s opSession) { b.pool <- s }

func (b *Backend) openOpSession() (opSession, error) {
	epoch := b.sessEpoch.Load()
	slot := uint(b.slot.Load())
	h, err := b.mod.ctx.OpenSession(slot, pkcs11.CKF_SERIAL_SESSION)
	if err != nil {
		return opSession{dead: true}, fmt.Errorf("opening session on token %q (slot %d): %w", b.tokenLabel, slot, err)
	}
	return opSession{h: h, epoch: epoch}, nil
}

// recover restores what err says was lost so that the operation on k may be retried
// with the returned session. The returned session must be released even on error.
func (b *Backend) recover(s opSession, k *keyObject, opErr error) (opSession, error) {
	b.recoveries.Add(1)
	b.recoverMu.Lock()
	defer b.recoverMu.Unlock()

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return s, ErrClosed
	}
	err := b.ensureLoginLocked()
	b.mu.Unlock()
	if err != nil {
		if isSessionGone(opErr) || isDeviceGone(opErr) {
			s = opSession{dead: true}
		}
		return s, fmt.Errorf("recovering from %v: %w", opErr, err)
	}
	if s.dead || isSessionGone(opErr) || isDeviceGone(opErr) || s.epoch != b.sessEpoch.Load() {
		// The old session is not closed: it is gone, and its handle may be reused.
		if s, err = b.openOpSession(); err != nil {
			return s, fmt.Errorf("recovering from %v: %w", opErr, err)
		}
	}
	if isHandleGone(opErr) || isDeviceGone(opErr) {
		k.handle.Store(nil)
	}
	return s, nil
}

// recoverable reports whether err is one recovery may cure.
func recoverable(err error) bool {
	return isSessionGone(err) || isDeviceGone(err) || isHandleGone(err) || isRV(err, pkcs11.CKR_USER_NOT_LOGGED_IN)
}

func isSessionGone(err error) bool {
	return isRV(err, pkcs11.CKR_SESSION_HANDLE_INVALID) || isRV(err, pkcs11.CKR_SESSION_CLOSED)
}

func isDeviceGone(err error) bool {
	return isRV(err, pkcs11.CKR_TOKEN_NOT_PRESENT) || isRV(err, pkcs11.CKR_DEVICE_REMOVED)
}

func isHandleGone(err error) bool {
	return isRV(err, pkcs11.CKR_OBJECT_HANDLE_INVALID) || isRV(err, pkcs11.CKR_KEY_HANDLE_INVALID)
}

// op runs one private-key operation with k on a pooled session: init with mech, then
// the single-part call, retried once after recovery. Waiting for the session ends
// with ctx (backend.ErrBusy); once it has one, the operation runs to its end.
func (b *Backend) op(ctx context.Context, k *keyObject, decrypt bool, mech *pkcs11.Mechanism, in []byte) ([]byte, error) {
	s, err := b.acquire(ctx)
	if errors.Is(err, ErrClosed) || errors.Is(err, backend.ErrBusy) {
		return nil, err
	}
	var out []byte
	if err == nil {
		out, err = b.try(s, k, decrypt, mech, in)
	}
	// A session that could not be opened is recovered from as well: the token may
	// have been reinserted, possibly in another slot.
	if err != nil && (s.dead || recoverable(err)) {
		var rerr error
		if s, rerr = b.recover(s, k, err); rerr != nil {
			err = rerr
		} else {
			out, err = b.try(s, k, decrypt, mech, in)
		}
	}
	b.release(s)
	return out, err
}

func (b *Backend) try(s opSession, k *keyObject, decrypt bool, mech *pkcs11.Mechanism, in []byte) ([]byte, error) {
	h, err := b.handleOf(k)
	if err != nil {
		return nil, err
	}
	ctx := b.mod.ctx
	mechs := []*pkcs11.Mechanism{mech}
	if decrypt {
		if err := ctx.DecryptInit(s.h, mechs, h); err != nil {
			return nil, err
		}
		return ctx.Decrypt(s.h, in)
	}
	if err := ctx.SignInit(s.h, mechs, h); err != nil {
		return nil, err
	}
	return ctx.Sign(s.h, in)
}

// handleOf returns k's private object handle, finding the object again if the
// handle is from before the latest login.
func (b *Backend) handleOf(k *keyObject) (pkcs11.ObjectHandle, error) {
	if h := k.handle.Load(); h != nil && h.epoch == b.handleEpoch.Load() {
		return h.h, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, ErrClosed
	}
	if h := k.handle.Load(); h != nil && h.epoch == b.handleEpoch.Load() {
		return h.h, nil
	}
	return b.refindLocked(k)
}

// trimField strips the blank padding of a CK_*_INFO text field.
func trimField(s string) string {
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == 0) {
		s = s[:len(s)-1]
	}
	return s
}
