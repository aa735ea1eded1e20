// Package report writes what a simulation run shows its reader: the
// directory of a run (summary.json, the decisions, the plots and
// report.html), the table printed after it, and the SVG charts. Package sim
// computes the Result; this package only presents it.
package report

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/quota-lease/quota-lease/sim"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// RunToDir simulates s and writes dir/summary.json, dir/plot.svg,
// dir/modes.svg and, with decisions, dir/decisions.jsonl (one line per
// request: a day of traffic is some 100 MB); it prints the table to table
// when not nil.
func RunToDir(s *scenario.Scenario, dir string, decisions bool, table io.Writer) (*sim.Result, error) {
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
	var res *sim.Result
	var err error
	if decisions {
		dec, cerr := create("decisions.jsonl")
		if cerr != nil {
			return nil, cerr
		}
		res, err = sim.Run(s, dec)
		if cerr := dec.Close(); err == nil {
			err = cerr
		}
	} else {
		if err := os.Remove(filepath.Join(dir, "decisions.jsonl")); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("remove the previous decisions.jsonl: %w", err)
		}
		res, err = sim.Run(s, nil)
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
		err := WritePlots(res, w, &mb)
		modes = mb.Bytes()
		return err
	}); err != nil {
		return nil, err
	}
	if err := write("modes.svg", func(w io.Writer) error { _, err := w.Write(modes); return err }); err != nil {
		return nil, err
	}
	var tb bytes.Buffer
	if err := WriteTable(&tb, res); err != nil {
		return nil, err
	}
	if err := write("report.html", func(w io.Writer) error { return writeReport(w, s, res, tb.String()) }); err != nil {
		return nil, err
	}
	if table != nil {
		if _, err := table.Write(tb.Bytes()); err != nil {
			return nil, err
		}
	}
	return res, nil
}
