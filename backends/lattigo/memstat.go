package slotlattigo

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
)

// Process memory as the kernel sees it (Linux /proc/self): the resident set now (VmRSS)
// and its high-water mark (VmHWM), which writing "5" to /proc/self/clear_refs resets.
// Elsewhere both read as 0 (rssAvailable false).

func procStatusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, field+":") {
			parts := strings.Fields(line[len(field)+1:])
			if len(parts) > 0 {
				v, _ := strconv.ParseInt(parts[0], 10, 64)
				return v
			}
		}
	}
	return 0
}

// rssBytes and peakRSSBytes: the process's resident set and its peak since the last reset.
func rssBytes() int64     { return procStatusKB("VmRSS") * 1024 }
func peakRSSBytes() int64 { return procStatusKB("VmHWM") * 1024 }

// resetPeakRSS returns the garbage to the OS and restarts the high-water mark from the
// current resident set; it reports whether the kernel accepted the reset.
func resetPeakRSS() bool {
	runtime.GC()
	debug.FreeOSMemory()
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
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
