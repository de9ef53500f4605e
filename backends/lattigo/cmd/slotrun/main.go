// Command slotrun runs prepared plans through slotlattigo.Run outside Python: for each job
// directory given (plan.json, inputs.bin, plaintexts.bin or the plaintext file named in
// options.json), it writes result.json (Run's result JSON). Used to run the error-model
// calibration and measurements (scripts/noise_jobs.py) on a machine without the Python
// environment; the packing and the comparison with numpy stay in Python.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	slot "slotplan/lattigo"
)

func read(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return b
}

func main() {
	failed := 0
	for _, dir := range os.Args[1:] {
		t := time.Now()
		plan := read(filepath.Join(dir, "plan.json"))
		if plan == nil {
			plan = read(filepath.Join(dir, "..", "plan.json"))
		}
		pts := read(filepath.Join(dir, "plaintexts.bin"))
		if pts == nil {
			pts = read(filepath.Join(dir, "..", "plaintexts.bin"))
		}
		opt := string(read(filepath.Join(dir, "options.json")))
		res, err := slot.Run(string(plan), read(filepath.Join(dir, "inputs.bin")), pts, opt)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", dir, err)
			failed++
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "result.json"), []byte(res), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", dir, err)
			failed++
			continue
		}
		fmt.Printf("%s %.1fs\n", dir, time.Since(t).Seconds())
	}
	if failed > 0 {
		os.Exit(1)
	}
}
