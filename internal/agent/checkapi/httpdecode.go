package checkapi

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// decodeCheckBody decodes a POST /v1/check body into in exactly as
// json.Unmarshal does. Bodies in the plain form nearly every client sends
// (the four known keys in lower case, each once; strings without escapes;
// a whole-number cost; no nulls) are decoded by decodePlain without
// encoding/json's reflection and scanner allocations; any other body,
// valid or not, is left to json.Unmarshal, so the two can never disagree.
func decodeCheckBody(data []byte, in *checkBody) error {
	var plain checkBody
	if decodePlain(data, &plain) {
		*in = plain
		return nil
	}
	if err := exactText(data); err != nil {
		return err
	}
	return json.Unmarshal(data, in)
}

// exactText refuses a body whose strings json.Unmarshal would not decode
// exactly: invalid UTF-8, and \u escapes of lone surrogates, which it
// replaces with U+FFFD, so that distinct attribute values would count as
// one identity. Valid values are refused by policy.IdentityOf otherwise;
// this keeps the JSON decoder from hiding them.
func exactText(data []byte) error {
	if !utf8.Valid(data) {
		return errors.New("the body is not valid UTF-8")
	}
	for i := 0; i+1 < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		if data[i+1] != 'u' {
			i++ // an escaped character, perhaps a backslash
			continue
		}
		r, ok := hex4(data[i+2:])
		switch {
		case !ok || r < 0xD800 || r > 0xDFFF:
		case r <= 0xDBFF && len(data) >= i+12 && data[i+6] == '\\' && data[i+7] == 'u':
			if lo, ok := hex4(data[i+8:]); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 11 // a surrogate pair: one character
				continue
			}
			return errors.New("a string holds a lone UTF-16 surrogate escape")
		default:
			return errors.New("a string holds a lone UTF-16 surrogate escape")
		}
		i += 5
	}
	return nil
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// decodePlain decodes data into in and reports true if data is a plain
// body; false means only that it is not (in is then garbage).
func decodePlain(data []byte, in *checkBody) bool {
	d := plainDecoder{data: data}
	if !d.byte('{') {
		return false
	}
	var seen [4]bool
	if d.byte('}') {
		return d.end()
	}
	for {
		key, ok := d.str()
		if !ok || !d.byte(':') {
			return false
		}
		var field int
		switch string(key) {
		case "policy":
			field = 0
		case "attributes":
			field = 1
		case "cost":
			field = 2
		case "idempotency_key":
			field = 3
		default:
			return false
		}
		if seen[field] {
			return false
		}
		seen[field] = true
		switch field {
		case 0, 3:
			v, ok := d.str()
			if !ok {
				return false
			}
			if field == 0 {
				in.Policy = string(v)
			} else {
				in.IdempotencyKey = string(v)
			}
		case 1:
			if !d.attributes(in) {
				return false
			}
		case 2:
			n, ok := d.int()
			if !ok {
				return false
			}
			in.Cost = n
		}
		if d.byte('}') {
			return d.end()
		}
		if !d.byte(',') {
			return false
		}
	}
}

// plainDecoder reads the plain form of a body.
type plainDecoder struct {
	data []byte
	i    int
}

func (d *plainDecoder) space() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// byte consumes c (after whitespace) if it is next.
func (d *plainDecoder) byte(c byte) bool {
	d.space()
	if d.i < len(d.data) && d.data[d.i] == c {
		d.i++
		return true
	}
	return false
}

// end: nothing but whitespace is left.
func (d *plainDecoder) end() bool {
	d.space()
	return d.i == len(d.data)
}

// str reads a string without escapes or control characters, in valid
// UTF-8 (which encoding/json keeps as it is).
func (d *plainDecoder) str() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start, ascii := d.i, true
	for d.i < len(d.data) {
		c := d.data[d.i]
		switch {
		case c == '"':
			s := d.data[start:d.i]
			d.i++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		d.i++
	}
	return nil, false
}

// int reads a whole number that fits int64 with room to spare: -?(0|[1-9][0-9]*),
// at most 18 digits, not followed by a fraction or an exponent.
func (d *plainDecoder) int() (int64, bool) {
	d.space()
	neg := d.i < len(d.data) && d.data[d.i] == '-'
	if neg {
		d.i++
	}
	start := d.i
	var n int64
	for d.i < len(d.data) && d.data[d.i] >= '0' && d.data[d.i] <= '9' {
		n = n*10 + int64(d.data[d.i]-'0')
		d.i++
	}
	digits := d.i - start
	if digits == 0 || digits > 18 || (digits > 1 && d.data[start] == '0') {
		return 0, false
	}
	if d.i < len(d.data) && (d.data[d.i] == '.' || d.data[d.i] == 'e' || d.data[d.i] == 'E') {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// attributes reads an object of plain strings, each key once.
func (d *plainDecoder) attributes(in *checkBody) bool {
	if !d.byte('{') {
		return false
	}
	in.Attributes = make(map[string]string, 2)
	if d.byte('}') {
		return true
	}
	for {
		k, ok := d.str()
		if !ok || !d.byte(':') {
			return false
		}
		v, ok := d.str()
		if !ok {
			return false
		}
		if _, dup := in.Attributes[string(k)]; dup {
			return false
		}
		in.Attributes[string(k)] = string(v)
		if d.byte('}') {
			return true
		}
		if !d.byte(',') {
			return false
		}
	}
}

// checkBody is the JSON of POST /v1/check.
type checkBody struct {
	Policy         string            `json:"policy"`
	Attributes     map[string]string `json:"attributes"`
	Cost           int64             `json:"cost"`
	IdempotencyKey string            `json:"idempotency_key"`
	// Check asks without charging (admission.Request.Check): a request
	// whose cost is charged when it ends, to a post_hoc policy.
	Check bool `json:"check"`
	// Reserve reserves cost, the request's estimated cost, to be settled
	// when it ends (admission.Request.Reserve); the answer names the
	// reservation.
	Reserve bool `json:"reserve"`
	// Settle names the reservation this request settles with cost, its
	// actual cost (admission.Request.Settle).
	Settle string `json:"settle"`
}
