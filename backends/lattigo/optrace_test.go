package slotlattigo

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The trace has one line per timed instruction, in program order, with the op its time was
// counted under, the destination's level, the seconds and the process's running totals
// (collector cycles, minor faults, system seconds); its op seconds add up to the run's
// op_seconds.
func TestOpTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.tsv")
	t.Setenv(opTraceEnv, path)
	planJSON := planHeadXP3 + `
	    {"op": "rot", "dst": "a", "src": "x", "k": 3},
	    {"op": "pmul", "dst": "b", "src": "a", "pt": "p0"},
	    {"op": "rescale", "dst": "c", "src": "b"},
	    {"op": "add", "dst": "d", "a": "c", "b": "c"},
	    {"op": "output", "src": "d", "tensor": "y", "table": "out/y"}
	  ]}`
	vs := randVecs(7, 4, 2048)
	r := mustRun(t, planJSON, packVecs(vs[0]), packVecs(vs[1], vs[2], vs[3]))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	wantOps := []string{"input", "rot", "pmul", "rescale", "add", "output"}
	if len(lines) != len(wantOps) {
		t.Fatalf("%d trace lines, want %d:\n%s", len(lines), len(wantOps), data)
	}
	sums := map[string]float64{}
	last := map[int]int64{}
	lastSys := 0.0
	for i, line := range lines {
		f := strings.Split(line, "\t")
		if len(f) != 7 {
			t.Fatalf("line %q: %d fields, want 7", line, len(f))
		}
		for _, k := range []int{4, 5} { // running totals: never decreasing
			v, err := strconv.ParseInt(f[k], 10, 64)
			if err != nil || v < last[k] {
				t.Fatalf("line %q: field %d is not a running total (%d before)", line, k+1, last[k])
			}
			last[k] = v
		}
		if sys, err := strconv.ParseFloat(f[6], 64); err != nil || sys < lastSys {
			t.Fatalf("line %q: system seconds are not a running total (%f before)", line, lastSys)
		} else {
			lastSys = sys
		}
		if idx, _ := strconv.Atoi(f[0]); idx != i || f[1] != wantOps[i] {
			t.Fatalf("line %d is %q, want instruction %d (%s)", i, line, i, wantOps[i])
		}
		level, err1 := strconv.Atoi(f[2])
		sec, err2 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil || sec < 0 {
			t.Fatalf("line %q: level or seconds unreadable", line)
		}
		if want := map[string]int{"input": 4, "rot": 4, "pmul": 4, "rescale": 3, "add": 3, "output": -1}[f[1]]; level != want {
			t.Fatalf("line %q: level %d, want %d", line, level, want)
		}
		sums[f[1]] += sec
	}
	for op, s := range sums {
		if got := r.Stats.OpSeconds[op]; got < s-1e-5 || got > s+1e-5 {
			t.Fatalf("op %s: trace sums to %.6f s, op_seconds says %.6f s", op, s, got)
		}
	}
}
