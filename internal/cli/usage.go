package cli

import (
	"flag"
	"io"
	"strings"
)

// UsageWidth is the width, in columns, that a command's -h wraps its flags'
// descriptions to.
const UsageWidth = 100

// NewFlags returns the flag set of a command: errors go to stderr, and -h
// prints header, then the flags (PrintFlags).
func NewFlags(name, header string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		io.WriteString(stderr, header)
		PrintFlags(stderr, fs)
	}
	return fs
}

// PrintFlags prints fs's flags to w under a "Flags:" line as
// flag.PrintDefaults lays them out, each description wrapped to
// UsageWidth columns; nothing when fs has none.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	if b.Len() == 0 {
		return
	}
	io.WriteString(w, "\nFlags:\n")
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		for _, l := range wrap(line, UsageWidth) {
			io.WriteString(w, l+"\n")
		}
	}
}

// wrap breaks line at spaces into lines of at most width columns (tabs
// stop every 8), each after line's own indentation; a word longer than
// that stands on a line of its own.
func wrap(line string, width int) []string {
	text := strings.TrimLeft(line, " \t")
	indent := line[:len(line)-len(text)]
	room := width - columns(indent)
	var out []string
	cur := ""
	for _, word := range strings.Split(text, " ") {
		switch {
		case cur == "":
			cur = word
		case len(cur)+1+len(word) <= room:
			cur += " " + word
		default:
			out = append(out, indent+cur)
			cur = word
		}
	}
	return append(out, indent+cur)
}

// columns is how many columns indent takes on a terminal.
func columns(indent string) int {
	n := 0
	for _, c := range indent {
		if c == '\t' {
			n += 8 - n%8
		} else {
			n++
		}
	}
	return n
}
