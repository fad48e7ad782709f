package hsm

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/miekg/pkcs11"
)

// A PKCS#11 module may be initialized only once per process, and its login state is
// per token per process, not per session. So every Backend that uses a module shares
// one loaded, initialized module, and every Backend logged in to a token shares that
// login: the module is finalized when its last Backend closes, and the token is logged
// out when the last Backend logged in to it closes.

// module is a loaded and initialized PKCS#11 library.
type module struct {
	path string
	ctx  *pkcs11.Ctx
	// finalize is false when the library was already initialized by someone else in
	// this process (CKR_CRYPTOKI_ALREADY_INITIALIZED): then it is theirs to finalize.
	finalize bool

	// Guarded by modules.mu.
	refs   int
	logins map[string]*login // token key → the process's login to it
}

// login is the process's login to one token.
type login struct {
	holders int      // Backends relying on it
	pin     [32]byte // SHA-256 of the PIN it was made with
}

var modules struct {
	mu sync.Mutex
	m  map[string]*module
}

// openModule returns the process's instance of the module at path, loading and
// initializing it on first use. Each successful call must be paired with release.
func openModule(path string) (*module, error) {
	key, err := moduleKey(path)
	if err != nil {
		return nil, err
	}
	modules.mu.Lock()
	defer modules.mu.Unlock()
	if m := modules.m[key]; m != nil {
		m.refs++
		return m, nil
	}
	ctx := pkcs11.New(key)
	if ctx == nil {
		return nil, fmt.Errorf("loading PKCS#11 module %s: not a loadable PKCS#11 library", path)
	}
	m := &module{path: key, ctx: ctx, finalize: true, refs: 1, logins: map[string]*login{}}
	if err := ctx.Initialize(); err != nil {
		if !isRV(err, pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED) {
			ctx.Destroy()
			return nil, fmt.Errorf("initializing PKCS#11 module %s: %w", path, err)
		}
		m.finalize = false
	}
	if modules.m == nil {
		modules.m = map[string]*module{}
	}
	modules.m[key] = m
	return m, nil
}

// moduleKey resolves symbolic links, so that two spellings of one library share one
// initialization.
func moduleKey(path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("PKCS#11 module: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("PKCS#11 module %s: %w", path, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	return abs, nil
}

// release drops one reference, finalizing and unloading the module with the last.
func (m *module) release() error {
	modules.mu.Lock()
	defer modules.mu.Unlock()
	m.refs--
	if m.refs > 0 {
		return nil
	}
	delete(modules.m, m.path)
	var err error
	if m.finalize {
		if e := m.ctx.Finalize(); e != nil && !isRV(e, pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED) {
			err = fmt.Errorf("finalizing PKCS#11 module %s: %w", m.path, e)
		}
	}
	m.ctx.Destroy()
	return err
}

// holdLogin records that one more Backend relies on the login to token, made with
// pin. If another Backend of the process logged in to token with a different PIN,
// it returns false: the token accepted the login only because it was already logged
// in, and pin may well be wrong.
func (m *module) holdLogin(token, pin string) bool {
	sum := sha256.Sum256([]byte(pin))
	modules.mu.Lock()
	defer modules.mu.Unlock()
	l := m.logins[token]
	if l == nil {
		m.logins[token] = &login{holders: 1, pin: sum}
		return true
	}
	if subtle.ConstantTimeCompare(l.pin[:], sum[:]) != 1 {
		return false
	}
	l.holders++
	return true
}

// dropLogin records that a Backend no longer relies on the login to token and
// reports whether it was the last, which should then log out.
func (m *module) dropLogin(token string) (last bool) {
	modules.mu.Lock()
	defer modules.mu.Unlock()
	l := m.logins[token]
	if l == nil {
		return false
	}
	if l.holders--; l.holders > 0 {
		return false
	}
	delete(m.logins, token)
	return true
}

// isRV reports whether err is the PKCS#11 return value rv.
func isRV(err error, rv uint) bool {
	var e pkcs11.Error
	return errors.As(err, &e) && uint(e) == rv
}
