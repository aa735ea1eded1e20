package sfv

import (
	"bytes"
	"errors"
	"testing"

	"github.com/dunglas/httpsfv"
)

// Each serializer against the text RFC 9651 section 4.1 gives, and against
// an independent implementation (github.com/dunglas/httpsfv) serializing
// the same value.
func TestSerializeAsRFC9651(t *testing.T) {
	str := func(s string) func() ([]byte, error) { return func() ([]byte, error) { return AppendString(nil, s) } }
	num := func(n int64) func() ([]byte, error) { return func() ([]byte, error) { return AppendInteger(nil, n) } }
	bin := func(p []byte) func() ([]byte, error) {
		return func() ([]byte, error) { return AppendByteSequence(nil, p), nil }
	}
	for _, c := range []struct {
		name  string
		got   func() ([]byte, error)
		value any // the same value for httpsfv
		want  string
	}{
		{"string", str("api-per-tenant"), "api-per-tenant", `"api-per-tenant"`},
		{"empty string", str(""), "", `""`},
		{"string escapes quote and backslash", str(`a"b\c`), `a"b\c`, `"a\"b\\c"`},
		{"string keeps the other printable ASCII", str(" ~;=,:"), " ~;=,:", `" ~;=,:"`},
		{"zero", num(0), int64(0), "0"},
		{"negative", num(-42), int64(-42), "-42"},
		{"largest integer", num(MaxInteger), int64(MaxInteger), "999999999999999"},
		{"smallest integer", num(-MaxInteger), int64(-MaxInteger), "-999999999999999"},
		{"bytes with padding", bin([]byte("tenant=acme")), []byte("tenant=acme"), ":dGVuYW50PWFjbWU=:"},
		{"bytes without padding", bin([]byte("abc")), []byte("abc"), ":YWJj:"},
		{"no bytes", bin(nil), []byte{}, "::"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.got()
			if err != nil || string(got) != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
			ref, err := httpsfv.Marshal(httpsfv.NewItem(c.value))
			if err != nil || ref != c.want {
				t.Fatalf("httpsfv serializes it as %q (%v), want %q", ref, err, c.want)
			}
		})
	}
}

// What RFC 9651 cannot carry is an error, and the buffer is returned
// unchanged.
func TestRefusesWhatHasNoSerialization(t *testing.T) {
	prefix := []byte("x")
	for name, f := range map[string]func() ([]byte, error){
		"integer over 15 digits":  func() ([]byte, error) { return AppendInteger(prefix, MaxInteger+1) },
		"integer under 15 digits": func() ([]byte, error) { return AppendInteger(prefix, -MaxInteger-1) },
		"string with a newline":   func() ([]byte, error) { return AppendString(prefix, "a\nb") },
		"string with DEL":         func() ([]byte, error) { return AppendString(prefix, "a\x7f") },
		"string with UTF-8":       func() ([]byte, error) { return AppendString(prefix, "café") },
		"key with upper case":     func() ([]byte, error) { return AppendParam(prefix, "Q") },
		"key starting with digit": func() ([]byte, error) { return AppendParam(prefix, "1q") },
		"empty key":               func() ([]byte, error) { return AppendParam(prefix, "") },
		"key with a space":        func() ([]byte, error) { return AppendParam(prefix, "a b") },
	} {
		b, err := f()
		if !errors.Is(err, ErrInvalid) || string(b) != "x" {
			t.Errorf("%s: %q, %v; want ErrInvalid and the buffer unchanged", name, b, err)
		}
	}
	for _, k := range []string{"q", "pk", "*", "a1_-.*", "acme-burst"} {
		if b, err := AppendParam(nil, k); err != nil || string(b) != ";"+k+"=" {
			t.Errorf("key %q: %q, %v", k, b, err)
		}
	}
}

// A list of two items with parameters, built from the parts, reads back
// through httpsfv as the same members.
func TestListReadsBack(t *testing.T) {
	b, _ := AppendString(nil, "burst")
	b, _ = AppendParam(b, "q")
	b, _ = AppendInteger(b, 100)
	b, _ = AppendParam(b, "pk")
	b = AppendByteSequence(b, []byte{0, 1, 254, 255})
	b = append(b, ListSeparator...)
	b, _ = AppendString(b, "daily")
	b, _ = AppendParam(b, "q")
	b, _ = AppendInteger(b, 1000)
	if want := `"burst";q=100;pk=:AAH+/w==:, "daily";q=1000`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
	l, err := httpsfv.UnmarshalList([]string{string(b)})
	if err != nil || len(l) != 2 {
		t.Fatalf("parse: %v, %d members", err, len(l))
	}
	first := l[0].(httpsfv.Item)
	pk, _ := first.Params.Get("pk")
	q, _ := l[1].(httpsfv.Item).Params.Get("q")
	if first.Value != "burst" || !bytes.Equal(pk.([]byte), []byte{0, 1, 254, 255}) || q != int64(1000) {
		t.Fatalf("read back %#v", l)
	}
}

// Any string, integer or byte string either has no serialization (an
// error) or serializes to text httpsfv parses back to the same value.
func FuzzRoundTrip(f *testing.F) {
	f.Add("api", int64(5), []byte("tenant=acme"))
	f.Add(`"\`, int64(-MaxInteger), []byte{})
	f.Add("\x00é", int64(1e15), []byte{0xff})
	f.Fuzz(func(t *testing.T, s string, n int64, p []byte) {
		if b, err := AppendString(nil, s); err == nil {
			it, perr := httpsfv.UnmarshalItem([]string{string(b)})
			if perr != nil || it.Value != s {
				t.Fatalf("string %q wrote %s, read back %#v (%v)", s, b, it.Value, perr)
			}
		} else if !errors.Is(err, ErrInvalid) {
			t.Fatalf("string %q: %v", s, err)
		}
		if b, err := AppendInteger(nil, n); err == nil {
			it, perr := httpsfv.UnmarshalItem([]string{string(b)})
			if perr != nil || it.Value != n {
				t.Fatalf("integer %d wrote %s, read back %#v (%v)", n, b, it.Value, perr)
			}
		} else if n >= -MaxInteger && n <= MaxInteger {
			t.Fatalf("integer %d refused: %v", n, err)
		}
		b := AppendByteSequence(nil, p)
		it, err := httpsfv.UnmarshalItem([]string{string(b)})
		if err != nil || !bytes.Equal(it.Value.([]byte), p) {
			t.Fatalf("bytes %x wrote %s, read back %#v (%v)", p, b, it.Value, err)
		}
	})
}
