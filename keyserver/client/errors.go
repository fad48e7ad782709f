package client

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Errors a request can end with, besides a *protocol.Error returned by a keyserver
// (match those with errors.Is(err, protocol.ErrNotAuthorized) and friends). Every
// error of a request is an *OpError wrapping one of them.
var (
	// ErrClosed is returned for requests made after, or pending during, Close.
	ErrClosed = errors.New("keyserver client closed")
	// ErrTimeout is returned when an attempt or the whole request ran out of time.
	ErrTimeout = errors.New("keyserver request timed out")
	// ErrUnavailable is returned when no connection to any keyserver is up.
	ErrUnavailable = errors.New("no keyserver connection available")
	// ErrConnectionLost is wrapped by the errors of requests whose connection broke
	// while they were in flight.
	ErrConnectionLost = errors.New("keyserver connection lost")
)

// OpError is the error of a request: the operation, the key it was for and what went
// wrong on the last attempt.
type OpError struct {
	Op       protocol.Op
	Key      protocol.KeyID // zero for operations without a key
	Attempts int            // attempts made on keyservers
	Err      error
}

func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("keyserver ")
	b.WriteString(verb(e.Op))
	b.WriteByte(' ')
	b.WriteString(e.Op.String())
	if hasKey(e.Op) {
		b.WriteString(" key ")
		b.WriteString(e.Key.Short())
		b.WriteString("…")
	}
	if e.Attempts > 1 {
		b.WriteString(" (")
		b.WriteString(strconv.Itoa(e.Attempts))
		b.WriteString(" attempts)")
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *OpError) Unwrap() error { return e.Err }

func verb(op protocol.Op) string {
	switch op {
	case protocol.OpRSASignPKCS1, protocol.OpRSASignPSS, protocol.OpECDSASign, protocol.OpEd25519Sign:
		return "sign"
	case protocol.OpRSADecrypt:
		return "decrypt"
	case protocol.OpPublicKey:
		return "fetch"
	case protocol.OpImportKey:
		return "import"
	case protocol.OpListKeys:
		return "list"
	}
	return "request"
}

func hasKey(op protocol.Op) bool {
	switch op {
	case protocol.OpPublicKey, protocol.OpRSASignPKCS1, protocol.OpRSASignPSS,
		protocol.OpRSADecrypt, protocol.OpECDSASign, protocol.OpEd25519Sign:
		return true
	}
	return false
}

// serverError is an attempt's error with the server it happened on.
type serverError struct {
	addr string
	err  error
}

func (e *serverError) Error() string { return "server " + e.addr + ": " + e.err.Error() }
func (e *serverError) Unwrap() error { return e.err }

// Is makes a server's deadline_exceeded answer an ErrTimeout too: the server
// dropped the request because the deadline this client sent with it had passed,
// which for the caller is the attempt timing out, whichever side noticed first.
func (e *serverError) Is(target error) bool {
	var pe *protocol.Error
	return target == ErrTimeout && errors.As(e.err, &pe) && pe.Code == protocol.CodeDeadlineExceeded
}

// connLostError is the error pending requests get when their connection breaks.
type connLostError struct{ cause error }

func (e *connLostError) Error() string { return ErrConnectionLost.Error() + ": " + e.cause.Error() }

// Is makes the error match ErrConnectionLost, and ErrClosed when the client closed it.
func (e *connLostError) Is(target error) bool {
	return target == ErrConnectionLost || (target == ErrClosed && e.cause == ErrClosed)
}

// outcome classifies how a request or an attempt ended; it is the "result" label of
// the metrics.
type outcome uint8

// The first outcomes are the protocol codes, in wire order.
const (
	outTimeout     outcome = iota + outcome(protocol.MaxCode) + 1 // an attempt or the request ran out of time
	outTransport                                                  // connection lost, write failed
	outFallback                                                   // served by a local Fallback key
	outCanceled                                                   // the caller's context ended
	outClosed                                                     // the client was closed
	outUnavailable                                                // no connection to any server
	outOtherCode                                                  // a code this client does not know
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	outTimeout:     "timeout",
	outTransport:   "transport",
	outFallback:    "fallback",
	outCanceled:    "canceled",
	outClosed:      "closed",
	outUnavailable: "unavailable",
	outOtherCode:   "other",
}

func init() {
	for c := protocol.CodeOK; c <= protocol.MaxCode; c++ {
		outcomeNames[c] = c.String()
	}
}

func (o outcome) String() string { return outcomeNames[o] }

// classify returns the outcome of an attempt's error.
func classify(err error) outcome {
	if err == nil {
		return outcome(protocol.CodeOK)
	}
	return classifyError(err)
}

func classifyError(err error) outcome {
	var pe *protocol.Error
	switch {
	case errors.Is(err, ErrClosed):
		return outClosed
	case errors.Is(err, ErrTimeout):
		return outTimeout
	case errors.Is(err, ErrConnectionLost):
		return outTransport
	case errors.Is(err, ErrUnavailable):
		return outUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return outCanceled
	case errors.As(err, &pe):
		if pe.Code == protocol.CodeDeadlineExceeded {
			// The server dropped it because this client had given up on it.
			return outTimeout
		}
		if pe.Code <= protocol.MaxCode {
			return outcome(pe.Code)
		}
		return outOtherCode
	}
	return outTransport
}

// retryable reports whether an attempt that ended with o may be tried on another
// server (and, when every server failed, served by a fallback key).
func (o outcome) retryable() bool {
	switch o {
	case outTimeout, outTransport, outUnavailable,
		outcome(protocol.CodeKeyNotFound), outcome(protocol.CodeOverloaded), outcome(protocol.CodeInternal):
		return true
	}
	return false
}
