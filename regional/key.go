package regional

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Key layout. Every key of one (policy, identity) pair shares the hash tag
// {<policy>:<identity>}, so on Redis Cluster they live in one slot and a
// script may touch all of them:
//
//	rl:{<policy>:<identity>}:v<version>          state (hash, or sorted set for sliding_log)
//	rl:{<policy>:<identity>}:v<version>:m        sliding_log metadata
//	rl:{<policy>:<identity>}:v<version>:i:<key>  a remembered idempotent decision
//
// and one key per store, its birth marker (BornKey, see Fresh and
// Engine.InitStore); on Redis Cluster one per hash slot (SlotBornKey).
//
// The identity is the policy's attributes in order, as name=value joined
// with ',', values percent-escaped so that '{', '}', ':', ',' and '=' never
// appear unescaped. A new config version starts fresh keys; the old ones
// expire after their TTL.
const keyPrefix = "rl:"

// BornKey is the store's birth marker: when the store's memory began, in
// enforcement ms, or 0 for a store its agent found new. It has no TTL; a
// store that loses it has lost everything else too. On Redis Cluster each
// slot has one of its own (SlotBornKey).
const BornKey = keyPrefix + "born"

// Limits on identities and keys.
const (
	// MaxAttributeValueBytes bounds one attribute value before escaping.
	MaxAttributeValueBytes = 256
	// MaxKeyBytes bounds a whole state key.
	MaxKeyBytes = 1024
	// MaxIdempotencyKeyBytes bounds an idempotency key.
	MaxIdempotencyKeyBytes = 128
)

// ErrInvalidIdentity reports a request whose attributes cannot form the
// policy's identity: missing, empty, or oversized.
var ErrInvalidIdentity = errors.New("invalid identity")

// IdentityOf returns the escaped identity of a request under p, or an error
// naming the attribute that is missing, empty or too long.
func (p *Policy) IdentityOf(attrs map[string]string) (string, error) {
	var b strings.Builder
	for i, name := range p.Identity {
		v, ok := attrs[name]
		switch {
		case !ok:
			return "", fmt.Errorf("%w: policy %q needs attribute %q", ErrInvalidIdentity, p.Name, name)
		case v == "":
			return "", fmt.Errorf("%w: attribute %q is empty", ErrInvalidIdentity, name)
		case len(v) > MaxAttributeValueBytes:
			return "", fmt.Errorf("%w: attribute %q is %d bytes, more than %d", ErrInvalidIdentity, name, len(v), MaxAttributeValueBytes)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name)
		b.WriteByte('=')
		escape(&b, v)
	}
	return b.String(), nil
}

// StateKey returns the Redis key of identity under p.
func (p *Policy) StateKey(identity string) (string, error) {
	k := keyPrefix + "{" + p.Name + ":" + identity + "}:v" + strconv.FormatInt(p.Version, 10)
	if len(k) > MaxKeyBytes {
		return "", fmt.Errorf("%w: key for policy %q would be %d bytes, more than %d", ErrInvalidIdentity, p.Name, len(k), MaxKeyBytes)
	}
	return k, nil
}

// ValidIdempotencyKey reports, wrapping ErrInvalidRequest, an idempotency
// key that is not 1-128 printable ASCII characters without spaces.
func ValidIdempotencyKey(idem string) error {
	if len(idem) > MaxIdempotencyKeyBytes {
		return fmt.Errorf("%w: idempotency key is %d bytes, more than %d", ErrInvalidRequest, len(idem), MaxIdempotencyKeyBytes)
	}
	for i := 0; i < len(idem); i++ {
		if c := idem[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: idempotency key must be printable ASCII without spaces", ErrInvalidRequest)
		}
	}
	return nil
}

// idempotencyKey returns the key remembering a decision for idem, or an
// error if idem is not valid.
func idempotencyKey(stateKey, idem string) (string, error) {
	if err := ValidIdempotencyKey(idem); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(stateKey)
	b.WriteString(":i:")
	escape(&b, idem)
	return b.String(), nil
}

// escape writes v percent-encoded: bytes other than ASCII letters, digits
// and "-._~/@" become %XX.
func escape(b *strings.Builder, v string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || strings.IndexByte("-._~/@", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}
