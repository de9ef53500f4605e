package slotlattigo

import (
	"fmt"
	"os"
	"sync"
)

// Per-instruction trace (SLOTPLAN_OP_TRACE=<path>): one line per executed instruction,
// appended to the file, for finding where a long evaluation's time goes against what the
// time model prices instruction by instruction (docs/lattigo.md, "Where a bootstrapping
// evaluation's time goes"). A line is tab-separated:
//
//	index  op  level  seconds  gc_cycles  minor_faults  system_seconds
//
// index: the instruction's position in the program; op: the op its time was counted under
// (a fused block's root: bsgs_block); level: its destination's level after the step (-1
// without one); seconds: as the run's op_seconds count it. The last three are the process's
// running totals when the step ended (a step's share is the difference from the line
// before): the collector's completed cycles (a step during which it grows shared the core
// with the collector), the minor page faults and the system CPU seconds (sampleEvalCPU,
// bootphase.go: every thread of the process, the key readers' included). Off (the default),
// nothing is read or written.

const opTraceEnv = "SLOTPLAN_OP_TRACE"

type opTracer struct {
	mu sync.Mutex // evaluations of one process may run side by side
	f  *os.File
}

var (
	tracersMu sync.Mutex
	tracers   = map[string]*opTracer{} // by path; open for the process's life
)

// currentTracer is the tracer of the path SLOTPLAN_OP_TRACE names now (nil when unset, or
// when the file cannot be opened: a trace is a diagnostic, never a reason for a run to
// fail). An executor takes it when it is made; every evaluation appends to the same file.
func currentTracer() *opTracer {
	path := os.Getenv(opTraceEnv)
	if path == "" {
		return nil
	}
	tracersMu.Lock()
	defer tracersMu.Unlock()
	if t, ok := tracers[path]; ok {
		return t
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil
	}
	t := &opTracer{f: f}
	tracers[path] = t
	return t
}

func (t *opTracer) record(i int, op string, level int, seconds float64) {
	if t == nil {
		return
	}
	t.mu.Lock() // sampled under the lock, so the file's running totals never go back
	defer t.mu.Unlock()
	c := sampleEvalCPU()
	fmt.Fprintf(t.f, "%d\t%s\t%d\t%.6f\t%d\t%d\t%.6f\n", i, op, level, seconds, c.GCCycles, c.MinorFaults, c.SystemSeconds)
}
