package policy

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// An identity names the counted subject of a request under a policy: the
// policy's attributes in order, as name=value joined with ',', values
// percent-escaped (Escape) so that '{', '}', ':', ',' and '=' never appear
// unescaped. Stores may embed it in keys and hash tags as it is.

// MaxAttributeValueBytes bounds one attribute value before escaping.
const MaxAttributeValueBytes = 256

// MaxIdentityBytes bounds a whole identity, escaped: a store key made of a
// policy name, an identity, a shard and a version (at most 1 KiB in
// regional) always fits.
const MaxIdentityBytes = 900

// ErrInvalidIdentity reports a request whose attributes cannot form the
// policy's identity: missing, empty, or oversized.
var ErrInvalidIdentity = errors.New("invalid identity")

// IdentityOf returns the escaped identity of a request under p, or an error
// naming the attribute that is missing, empty or too long.
func (p *Policy) IdentityOf(attrs map[string]string) (string, error) {
	n := 0
	for _, name := range p.Identity {
		n += len(name) + len(attrs[name]) + 2
	}
	var b strings.Builder
	b.Grow(n) // one allocation unless a value needs escaping
	for i, name := range p.Identity {
		v, ok := attrs[name]
		switch {
		case !ok:
			return "", fmt.Errorf("%w: policy %q needs attribute %q", ErrInvalidIdentity, p.Name, name)
		case v == "":
			return "", fmt.Errorf("%w: attribute %q is empty", ErrInvalidIdentity, name)
		case len(v) > MaxAttributeValueBytes:
			return "", fmt.Errorf("%w: attribute %q is %d bytes, more than %d",
				ErrInvalidIdentity, name, len(v), MaxAttributeValueBytes)
		case !utf8.ValidString(v):
			// Refused, not repaired: a decoder mapping invalid bytes to
			// U+FFFD would count distinct byte strings as one identity.
			return "", fmt.Errorf("%w: attribute %q is not valid UTF-8", ErrInvalidIdentity, name)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name)
		b.WriteByte('=')
		Escape(&b, v)
	}
	if b.Len() > MaxIdentityBytes {
		return "", fmt.Errorf("%w: policy %q: the identity is %d bytes escaped, more than %d",
			ErrInvalidIdentity, p.Name, b.Len(), MaxIdentityBytes)
	}
	return b.String(), nil
}

// Escape writes v percent-encoded: bytes other than ASCII letters, digits
// and "-._~/@" become %XX.
func Escape(b *strings.Builder, v string) {
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
