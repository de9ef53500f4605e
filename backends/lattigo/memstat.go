package slotlattigo

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
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

// heapObjectBytes is the bytes of heap objects, live or not yet swept.
func heapObjectBytes() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// heapSampleEvery is how often heapPeakDuring reads the heap: a bootstrap at log N 14 holds
// its temporaries for milliseconds (one rotation takes ~10 ms).
const heapSampleEvery = 50 * time.Microsecond

// heapPeakDuring runs f at GOGC 0 (the collector runs whenever the heap grows, so the heap
// holds little beyond its live bytes) while a goroutine reads the heap every
// heapSampleEvery, and returns the largest heap seen above the heap at the start (after a
// collection), and the bytes f allocated in all. At n14boot a bootstrap measured 79-80 MiB
// of temporaries this way, 93 MiB at GOGC 1 (the heap then also holds 1% of its 2 GiB
// live bytes in garbage) and 199 MiB at GOGC 10; it allocated 297 MiB.
func heapPeakDuring(f func() error) (peak int64, alloc uint64, err error) {
	runtime.GC()
	base := heapObjectBytes()
	old := debug.SetGCPercent(0)
	defer debug.SetGCPercent(old)
	var top atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(heapSampleEvery)
		defer tick.Stop()
		for {
			if v := heapObjectBytes(); v > top.Load() {
				top.Store(v)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	err = f()
	runtime.ReadMemStats(&m1)
	close(stop)
	<-done
	return max(0, top.Load()-base), m1.TotalAlloc - m0.TotalAlloc, err
}
