// Package sfv writes Structured Field Values for HTTP (RFC 9651, which
// obsoletes RFC 8941) as its section 4.1 serializes them: the parts
// quota-lease's response fields are made of, namely list members
// separated by ", ", String bare items, and Integer and Byte Sequence
// parameters. Each function appends to a buffer and refuses, with an
// error, a value the RFC cannot carry, so a field is either well formed or
// not written at all. It parses nothing: the tests read its output with an
// independent parser.
package sfv

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
)

// MaxInteger is the largest magnitude of an Integer (RFC 9651, 3.3.1: at
// most 15 decimal digits).
const MaxInteger = 999_999_999_999_999

// ListSeparator separates the members of a List (RFC 9651, 4.1.1).
const ListSeparator = ", "

// ErrInvalid is wrapped by every error of this package: a value that has
// no serialization.
var ErrInvalid = errors.New("not a structured field value")

// AppendInteger appends n as an Integer (RFC 9651, 4.1.4).
func AppendInteger(b []byte, n int64) ([]byte, error) {
	if n < -MaxInteger || n > MaxInteger {
		return b, fmt.Errorf("%w: integer %d has more than 15 digits", ErrInvalid, n)
	}
	return strconv.AppendInt(b, n, 10), nil
}

// AppendString appends s as a String (RFC 9651, 4.1.6): quoted, with '"'
// and '\' escaped. A String holds printable ASCII only (%x20-7E); any
// other byte is an error (RFC 9651's Display String would be the way to
// carry Unicode).
func AppendString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return b, fmt.Errorf("%w: string %q has byte %#02x at %d, outside printable ASCII", ErrInvalid, s, c, i)
		}
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"'), nil
}

// AppendByteSequence appends p as a Byte Sequence (RFC 9651, 4.1.8):
// standard base64 with padding between colons. Every byte string has one.
func AppendByteSequence(b []byte, p []byte) []byte {
	b = append(b, ':')
	b = base64.StdEncoding.AppendEncode(b, p)
	return append(b, ':')
}

// AppendParam appends the start of a parameter, ";" key "=", after which
// the caller appends its bare item (RFC 9651, 4.1.1.2). A key is a
// lower-case letter or '*', then lower-case letters, digits and "_-.*"
// (4.1.1.3); any other key is an error.
func AppendParam(b []byte, key string) ([]byte, error) {
	if !validKey(key) {
		return b, fmt.Errorf("%w: parameter key %q", ErrInvalid, key)
	}
	b = append(b, ';')
	b = append(b, key...)
	return append(b, '='), nil
}

func validKey(k string) bool {
	if k == "" || !(isLCAlpha(k[0]) || k[0] == '*') {
		return false
	}
	for i := 1; i < len(k); i++ {
		c := k[i]
		if !isLCAlpha(c) && !('0' <= c && c <= '9') && c != '_' && c != '-' && c != '.' && c != '*' {
			return false
		}
	}
	return true
}

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
