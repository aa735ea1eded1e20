package policy

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// maxQuotedBytes is how much of a name taken from input an error message
// shows.
const maxQuotedBytes = 64

// QuoteName quotes a name taken from input (a policy, region, attribute
// or algorithm name, perhaps invalid) for an error message: whole when it
// is short, as every valid name is; otherwise its first 64 bytes and how
// long it was, so that a 10,000-character name does not fill a terminal,
// a log line or a gRPC answer. Every error that echoes such a name uses
// it.
func QuoteName(s string) string {
	if len(s) <= maxQuotedBytes {
		return strconv.Quote(s)
	}
	cut := maxQuotedBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
