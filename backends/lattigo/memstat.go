package slotlattigo

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// collectGarbage returns the garbage to the OS (before a resident-set measurement starts:
// resetPeakRSS and peakRSS in api.go).
func collectGarbage() {
	runtime.GC()
	debug.FreeOSMemory()
}

// goMappedBytes is the memory the Go runtime holds from the OS (not yet released).
func goMappedBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	var v [2]int64
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = int64(s[i].Value.Uint64())
		}
	}
	return v[0] - v[1]
}
