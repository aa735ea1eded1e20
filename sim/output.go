package sim

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// RunToDir simulates s and writes dir/summary.json, dir/plot.svg,
// dir/modes.svg and, with decisions, dir/decisions.jsonl (one line per
// request: a day of traffic is some 100 MB); it prints the table to table
// when not nil.
func RunToDir(s *Scenario, dir string, decisions bool, table io.Writer) (*Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("output dir: %w", err)
	}
	create := func(name string) (*os.File, error) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", name, err)
		}
		return f, nil
	}
	var res *Result
	var err error
	if decisions {
		dec, cerr := create("decisions.jsonl")
		if cerr != nil {
			return nil, cerr
		}
		res, err = Run(s, dec)
		if cerr := dec.Close(); err == nil {
			err = cerr
		}
	} else {
		if err := os.Remove(filepath.Join(dir, "decisions.jsonl")); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("remove the previous decisions.jsonl: %w", err)
		}
		res, err = Run(s, nil)
	}
	if err != nil {
		return nil, err
	}
	write := func(name string, fn func(io.Writer) error) error {
		f, err := create(name)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", name, err)
		}
		return f.Close()
	}
	if err := write("summary.json", res.WriteSummary); err != nil {
		return nil, err
	}
	var modes []byte
	if err := write("plot.svg", func(w io.Writer) error {
		var mb bytes.Buffer
		err := res.WritePlots(w, &mb)
		modes = mb.Bytes()
		return err
	}); err != nil {
		return nil, err
	}
	if err := write("modes.svg", func(w io.Writer) error { _, err := w.Write(modes); return err }); err != nil {
		return nil, err
	}
	if table != nil {
		if err := res.WriteTable(table); err != nil {
			return nil, err
		}
	}
	return res, nil
}
