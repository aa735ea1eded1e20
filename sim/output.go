package sim

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// RunToDir simulates s and writes dir/summary.json, dir/decisions.jsonl,
// dir/plot.svg and dir/modes.svg; it prints the table to table when not
// nil.
func RunToDir(s *Scenario, dir string, table io.Writer) (*Result, error) {
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
	dec, err := create("decisions.jsonl")
	if err != nil {
		return nil, err
	}
	res, err := Run(s, dec)
	if cerr := dec.Close(); err == nil {
		err = cerr
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
