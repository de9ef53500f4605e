package slotlattigo

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a Go CPU profile (go tool pprof) to path until the returned
// function is called (BenchPlan and LintransMatvec option cpu_profile: the timed runs).
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu_profile: %w", err)
	}
	if err = pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu_profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
