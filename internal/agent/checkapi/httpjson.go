package checkapi

import (
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// The HTTP API's JSON answers, appended to a buffer as encoding/json would
// write them (same keys, order and escaping), without an encoder, a map or
// a reflection pass per answer.

// appendAnswer appends a's JSON, as encoding/json would write it, to b:
// the admitted answer without an encoder per check. Policy names and
// modes need no escaping (policy.Policy.Validate allows [a-z0-9._-]).
func appendAnswer(b []byte, a checkAnswer) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, a.Allowed)
	b = append(b, `,"policy":"`...)
	b = append(b, a.Policy...)
	b = append(b, `","remaining":`...)
	b = strconv.AppendInt(b, a.Remaining, 10)
	b = append(b, `,"limit":`...)
	if abs := math.Abs(a.Limit); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		j, _ := json.Marshal(a.Limit) // exponent form, as encoding/json writes it
		b = append(b, j...)
	} else {
		b = strconv.AppendFloat(b, a.Limit, 'f', -1, 64)
	}
	b = append(b, `,"reset_ms":`...)
	b = strconv.AppendInt(b, a.ResetMs, 10)
	b = append(b, `,"mode":"`...)
	b = append(b, a.Mode...)
	b = append(b, '"')
	if a.Replayed {
		b = append(b, `,"replayed":true`...)
	}
	if a.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	if a.RetryAfterMs != 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, a.RetryAfterMs, 10)
	}
	if a.Reservation != "" {
		b = append(b, `,"reservation":`...)
		b = appendJSONString(b, a.Reservation)
	}
	return append(b, "}\n"...)
}

// appendProblem appends p's JSON (RFC 9457), as encoding/json writes the
// problem struct.
func appendProblem(b []byte, p problem) []byte {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	if p.Detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, p.Detail)
	}
	if p.Policy != "" {
		b = append(b, `,"policy":`...)
		b = appendJSONString(b, p.Policy)
	}
	if p.RetryAfterMs != 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, p.RetryAfterMs, 10)
	}
	return append(b, "}\n"...)
}

// appendJSONString appends s as a JSON string the way encoding/json
// escapes it: quotes, backslashes and control characters; <, > and & as
// \u003c and so on; U+2028 and U+2029; invalid UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// checkAnswer is the JSON answer of an admitted check.
type checkAnswer struct {
	Allowed      bool    `json:"allowed"`
	Policy       string  `json:"policy"`
	Remaining    int64   `json:"remaining"`
	Limit        float64 `json:"limit"`
	ResetMs      int64   `json:"reset_ms"`
	Mode         string  `json:"mode"`
	Replayed     bool    `json:"replayed,omitempty"`
	Shadow       bool    `json:"shadow,omitempty"`
	RetryAfterMs int64   `json:"retry_after_ms,omitempty"`
	Reservation  string  `json:"reservation,omitempty"`
}

// problem is an RFC 9457 problem detail.
type problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail,omitempty"`
	Policy       string `json:"policy,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}
