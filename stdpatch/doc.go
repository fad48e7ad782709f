// Package stdpatch holds the tests of the patches Tiergate's build applies to the Go
// standard library, and documents them. The patched files are in _go1.N/ (a copy of
// each standard library file with the change); overlay.sh turns them into a
// `go build -overlay` file, which the Makefile passes to every go command, with the
// build tag tiergate_stdpatch, when the Go in use is the one the files were made
// from. Built any other way, Tiergate uses the standard library as it is.
//
// The patches:
//
//   - crypto/ecdh: X25519 public keys (the server's key share in every TLS 1.3, TLS
//     1.2 ECDHE and QUIC handshake) are computed with edwards25519's precomputed base
//     point table instead of the Montgomery ladder, as BoringSSL and OpenSSL do:
//     about 18 µs instead of 40 here, one of the two X25519 operations of a handshake.
package stdpatch
