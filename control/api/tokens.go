package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/store"
)

// Role is what a token may do.
type Role string

// Roles of API tokens. Every role reads; writes are by kind (Role.CanWrite).
const (
	// RoleAdmin does everything, tokens included.
	RoleAdmin Role = "admin"
	// RoleCertOperator writes certificates and their bindings.
	RoleCertOperator Role = "cert-operator"
	// RolePolicyOperator writes listeners, routing, pools and the L4 objects.
	RolePolicyOperator Role = "policy-operator"
	// RoleRiskEngine writes blacklists (/v1/blacklists, blacklists.go) and reads.
	RoleRiskEngine Role = "risk-engine"
	// RoleViewer reads.
	RoleViewer Role = "viewer"
)

// Roles lists every role.
var Roles = []Role{RoleAdmin, RoleCertOperator, RolePolicyOperator, RoleRiskEngine, RoleViewer}

// writers says which role, besides admin, writes each kind of the model.
var writers = map[string]Role{
	"listeners": RolePolicyOperator, "routing": RolePolicyOperator, "pools": RolePolicyOperator,
	"l4-rules": RolePolicyOperator, "l4-pools": RolePolicyOperator, "l4-bgp": RolePolicyOperator,
	"certificates": RoleCertOperator, "cert-bindings": RoleCertOperator,
}

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool {
	for _, x := range Roles {
		if r == x {
			return true
		}
	}
	return false
}

// CanWrite reports whether r may write objects of kind.
func (r Role) CanWrite(kind string) bool {
	return r == RoleAdmin || (r != "" && writers[kind] == r)
}

// TokenPrefix is the etcd prefix of the tokens: /tiergate/auth/v1/tokens/<name>. It
// is outside store.Prefix, so the snapshots and watches the nodes read never hold
// them.
const TokenPrefix = "/tiergate/auth/v1/tokens/"

// Token is a stored token: its name, role and the SHA-256 of its secret, never
// the secret.
type Token struct {
	// Name identifies the token in audit logs.
	Name string `json:"name"`
	// Role is what it may do.
	Role Role `json:"role"`
	// Hash is the hex SHA-256 of the token's 32 random bytes.
	Hash string `json:"hash,omitempty"`
	// Created is when it was made.
	Created time.Time `json:"created"`
}

// ErrTokenExists is CreateToken's error for a name already taken.
var ErrTokenExists = errors.New("a token of that name exists")

// Tokens keeps the API tokens in etcd beside the store's objects.
type Tokens struct {
	c *clientv3.Client
}

// NewTokens returns the tokens kept through st's etcd client.
func NewTokens(st *store.Store) *Tokens { return &Tokens{c: st.Client()} }

// Create makes a token name with role and returns its plaintext,
// "<name>.<64 hex digits>", which is not kept: only its hash is stored.
func (t *Tokens) Create(ctx context.Context, name string, role Role) (string, error) {
	if err := store.CheckName(name); err != nil {
		return "", fmt.Errorf("token name: %w", err)
	}
	if !role.Valid() {
		return "", fmt.Errorf("role %q: want one of %v", role, Roles)
	}
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", err
	}
	sum := sha256.Sum256(secret[:])
	val, err := json.Marshal(Token{Name: name, Role: role, Hash: hex.EncodeToString(sum[:]), Created: time.Now().UTC()})
	if err != nil {
		return "", err
	}
	key := TokenPrefix + name
	resp, err := t.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return "", fmt.Errorf("storing token %s: %w", name, err)
	}
	if !resp.Succeeded {
		return "", fmt.Errorf("token %s: %w", name, ErrTokenExists)
	}
	return name + "." + hex.EncodeToString(secret[:]), nil
}

// List returns every token, without its hash.
func (t *Tokens) List(ctx context.Context) ([]Token, error) {
	resp, err := t.c.Get(ctx, TokenPrefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("listing tokens: %w", err)
	}
	out := make([]Token, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var tok Token
		if err := json.Unmarshal(kv.Value, &tok); err != nil {
			return nil, fmt.Errorf("token %s: %w", kv.Key, err)
		}
		tok.Hash = ""
		out = append(out, tok)
	}
	return out, nil
}

// Delete removes the token name; it reports whether there was one.
func (t *Tokens) Delete(ctx context.Context, name string) (bool, error) {
	if store.CheckName(name) != nil {
		return false, nil
	}
	resp, err := t.c.Delete(ctx, TokenPrefix+name)
	if err != nil {
		return false, fmt.Errorf("deleting token %s: %w", name, err)
	}
	return resp.Deleted > 0, nil
}

// Authenticate returns the token whose plaintext is presented, or ok false. The
// hashes are compared in constant time.
func (t *Tokens) Authenticate(ctx context.Context, presented string) (tok Token, ok bool, err error) {
	i := strings.LastIndexByte(presented, '.')
	if i <= 0 {
		return Token{}, false, nil
	}
	name, secretHex := presented[:i], presented[i+1:]
	secret, err := hex.DecodeString(secretHex)
	if err != nil || len(secret) != 32 || store.CheckName(name) != nil {
		return Token{}, false, nil
	}
	resp, err := t.c.Get(ctx, TokenPrefix+name)
	if err != nil {
		return Token{}, false, fmt.Errorf("reading token %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return Token{}, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &tok); err != nil {
		return Token{}, false, fmt.Errorf("token %s: %w", name, err)
	}
	want, err := hex.DecodeString(tok.Hash)
	if err != nil {
		return Token{}, false, fmt.Errorf("token %s: bad hash: %w", name, err)
	}
	sum := sha256.Sum256(secret)
	if subtle.ConstantTimeCompare(sum[:], want) != 1 {
		return Token{}, false, nil
	}
	return tok, true, nil
}

// Any reports whether any token exists.
func (t *Tokens) Any(ctx context.Context) (bool, error) {
	resp, err := t.c.Get(ctx, TokenPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("counting tokens: %w", err)
	}
	return resp.Count > 0, nil
}
