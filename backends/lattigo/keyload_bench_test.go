package slotlattigo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// TestKeyLoadBench is the key-load micro-benchmark (docs/lattigo.md, "Loading a key"). It
// runs only with SLOTPLAN_KEYBENCH=<directory for the key files>:
//
//	SLOTPLAN_KEYBENCH=/tmp/keys taskset -c 1 env GOMAXPROCS=1 go test -run TestKeyLoadBench -v .
//
// It writes rotation keys on a bootstrapping preset's parameters (SLOTPLAN_KEYBENCH_PARAMS:
// n16boot, the default, or n14boot) at levels 9 and 3 (the plan keys of a capped ResNet-20
// plan), reads each once (page cache), then times load -> drop cycles over them, each way
// of reading in turn, twice (A B A B), at GOGC 10 (the runs') beside a live heap of
// SLOTPLAN_KEYBENCH_BALLAST_MB (default 1024; a run's live keys, matrices and ciphertexts
// that the collector marks and that set its pace). Per way: seconds per key and GB/s, page
// faults, collections and their pause, bytes allocated. The ways:
//   - read_reused: os.File.Read of the file into one reused []byte (the page-cache copy alone)
//   - read_new: the same into a new []byte each time (copy + the new memory's page faults)
//   - decode_new / decode_reused: Lattigo's UnmarshalBinary of the bytes in memory, into a
//     new key / into the key decoded before (the decoding alone, with and without allocation)
//   - lattigo: the store's reader before: bufio (1 MiB) + GaloisKey.ReadFrom into a new key
//   - lattigo_reused: the same into the key dropped before (what bootstream.go did)
//   - new: readKeyFile into a new key (one read into one allocation)
//   - reused: readKeyFile into the key dropped before (the store's free list)
//   - mmap: mmap(MAP_POPULATE) of the file and munmap (no copy; for comparison only)
func TestKeyLoadBench(t *testing.T) {
	dir := os.Getenv("SLOTPLAN_KEYBENCH")
	if dir == "" {
		t.Skip("set SLOTPLAN_KEYBENCH=<dir> to run the key-load micro-benchmark")
	}
	preset := envOr("SLOTPLAN_KEYBENCH_PARAMS", "n16boot")
	logN := map[string]int{"n16boot": 16, "n14boot": 14}[preset]
	if logN == 0 {
		t.Fatalf("SLOTPLAN_KEYBENCH_PARAMS=%s: n16boot or n14boot", preset)
	}
	rounds := envInt("SLOTPLAN_KEYBENCH_ROUNDS", 3)
	ballastMB := envInt("SLOTPLAN_KEYBENCH_BALLAST_MB", 1024)
	setup := bootSetupOf(t, fmt.Sprintf(`{"log_n": %d, "slots": %d, "log_q": [60, 40, 40, 40, 40, 40, 40, 40, 40, 40],
	  "log_p": [61, 61, 61, 61, 61], "log_scale": 40, "boot": {"literal": "N16QP1546H192H32", "levels_after": 9}}`,
		logN, 1<<(logN-1)))
	params := setup.params
	dir = filepath.Join(dir, preset)
	offsets := []int{1, 2, 3, 4, 5, 6, 7, 8}
	levels := map[int]int{5: 3, 6: 3, 7: 3, 8: 3}
	if _, err := os.Stat(filepath.Join(dir, manifestName)); err != nil {
		t0 := time.Now()
		if _, _, _, err := newSetupClient(setup).writeKeys(dir, offsets, false, 9, levels); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d keys in %.1f s", len(offsets), time.Since(t0).Seconds())
	}
	keys, err := openKeyStore(dir, params)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	var sizes []int
	for _, mk := range keys.manifest.Rotations {
		files = append(files, filepath.Join(dir, mk.File))
		sizes = append(sizes, mk.Bytes)
	}
	for _, f := range files { // into the page cache
		if _, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	ballast := make([][]uint64, ballastMB)
	for i := range ballast {
		ballast[i] = make([]uint64, 1<<17) // 1 MiB, touched
		for j := range ballast[i] {
			ballast[i][j] = uint64(j)
		}
	}
	runtime.GC()

	shape := keys.shape
	maxSize := 0
	for _, s := range sizes {
		maxSize = max(maxSize, s)
	}
	scratch := make([]byte, maxSize)
	mem := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		mem[f] = b
	}
	var held *rlwe.GaloisKey                   // the key loaded last (dropped before the next load)
	prev := map[int]*rlwe.GaloisKey{}          // the key dropped before, by size (the free list)
	readFile := func(f string, b []byte) int { // one read of the whole file into b
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		n, err := fh.Read(b)
		if err != nil || n != len(b) {
			t.Fatal(n, err)
		}
		return n
	}
	into := func(size int) *rlwe.GaloisKey { // the key dropped before of this size, or a new one
		gk := prev[size]
		delete(prev, size)
		if gk == nil {
			gk = new(rlwe.GaloisKey)
		}
		return gk
	}
	ways := []struct {
		name string
		load func(i int) any
	}{
		{"read_reused", func(i int) any { readFile(files[i], scratch[:sizes[i]]); return nil }},
		{"read_new", func(i int) any { b := make([]byte, sizes[i]); readFile(files[i], b); return b }},
		{"decode_new", func(i int) any {
			gk := new(rlwe.GaloisKey)
			if err := gk.UnmarshalBinary(mem[files[i]]); err != nil {
				t.Fatal(err)
			}
			return gk
		}},
		{"decode_reused", func(i int) any {
			gk := into(sizes[i])
			if err := gk.UnmarshalBinary(mem[files[i]]); err != nil {
				t.Fatal(err)
			}
			return gk
		}},
		{"lattigo", func(i int) any {
			gk := new(rlwe.GaloisKey)
			f, err := os.Open(files[i])
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := gk.ReadFrom(bufio.NewReaderSize(f, 1<<20)); err != nil {
				t.Fatal(err)
			}
			return gk
		}},
		{"lattigo_reused", func(i int) any {
			gk := into(sizes[i])
			f, err := os.Open(files[i])
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := gk.ReadFrom(bufio.NewReaderSize(f, 1<<20)); err != nil {
				t.Fatal(err)
			}
			return gk
		}},
		{"new", func(i int) any {
			gk := new(rlwe.GaloisKey)
			if _, err := readKeyFile(files[i], gk, shape); err != nil {
				t.Fatal(err)
			}
			return gk
		}},
		{"reused", func(i int) any {
			gk := into(sizes[i])
			if _, err := readKeyFile(files[i], gk, shape); err != nil {
				t.Fatal(err)
			}
			return gk
		}},
		{"mmap", func(i int) any {
			f, err := os.Open(files[i])
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b, err := syscall.Mmap(int(f.Fd()), 0, sizes[i], syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Munmap(b); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
	}
	if only := os.Getenv("SLOTPLAN_KEYBENCH_WAYS"); only != "" {
		keep := ways[:0]
		for _, w := range ways {
			if strings.Contains(","+only+",", ","+w.name+",") {
				keep = append(keep, w)
			}
		}
		ways = keep
	}
	type row struct {
		Way          string  `json:"way"`
		Pass         int     `json:"pass"`
		Loads        int     `json:"loads"`
		MsPerKey     float64 `json:"ms_per_key"`
		CPUMsPerKey  float64 `json:"cpu_ms_per_key"`
		MsPerKeyL9   float64 `json:"ms_per_key_level9"`
		MsPerKeyL3   float64 `json:"ms_per_key_level3"`
		GBPerSec     float64 `json:"gb_per_s"`
		PageFaults   int64   `json:"minor_faults"`
		GCs          uint32  `json:"gcs"`
		GCPauseMs    float64 `json:"gc_pause_ms"`
		AllocMB      float64 `json:"alloc_mb"`
		MBPerKeyL9   float64 `json:"mb_key_level9"`
		MBPerKeyL3   float64 `json:"mb_key_level3"`
		BallastMB    int     `json:"ballast_mb"`
		ParamsPreset string  `json:"params"`
	}
	var rows []row
	for pass := 0; pass < 2; pass++ {
		for _, w := range ways {
			clear(prev)
			held = nil
			runtime.GC()
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			f0, c0 := minorFaults(), cpuSeconds()
			var bytes int64
			var sec, sec9, sec3 float64
			var n9, n3 int
			for r := 0; r < rounds; r++ {
				for i := range files {
					if held != nil { // drop_key of the key loaded before (kept for the reusing ways)
						prev[held.BinarySize()] = held
						held = nil
					}
					t0 := time.Now()
					obj := w.load(i)
					d := time.Since(t0).Seconds()
					sec += d
					if keys.manifest.Rotations[i].LevelQ == 9 {
						sec9 += d
						n9++
					} else {
						sec3 += d
						n3++
					}
					bytes += int64(sizes[i])
					if gk, ok := obj.(*rlwe.GaloisKey); ok {
						held = gk
					}
				}
			}
			f1, c1 := minorFaults(), cpuSeconds()
			runtime.ReadMemStats(&ms1)
			loads := rounds * len(files)
			rows = append(rows, row{
				Way: w.name, Pass: pass, Loads: loads,
				MsPerKey: 1e3 * sec / float64(loads), CPUMsPerKey: 1e3 * (c1 - c0) / float64(loads),
				MsPerKeyL9: 1e3 * sec9 / float64(n9), MsPerKeyL3: 1e3 * sec3 / float64(n3),
				GBPerSec: float64(bytes) / sec / 1e9, PageFaults: f1 - f0, GCs: ms1.NumGC - ms0.NumGC,
				GCPauseMs: float64(ms1.PauseTotalNs-ms0.PauseTotalNs) / 1e6, AllocMB: float64(ms1.TotalAlloc-ms0.TotalAlloc) / (1 << 20),
				MBPerKeyL9: float64(sizes[0]) / 1e6, MBPerKeyL3: float64(sizes[len(sizes)-1]) / 1e6, BallastMB: ballastMB, ParamsPreset: preset,
			})
			r := rows[len(rows)-1]
			fmt.Printf("%-15s pass %d: %7.2f ms/key (cpu %7.2f; L9 %7.2f, L3 %6.2f)  %5.2f GB/s  faults %7d  GCs %3d (pause %6.2f ms)  alloc %8.0f MB\n",
				r.Way, pass, r.MsPerKey, r.CPUMsPerKey, r.MsPerKeyL9, r.MsPerKeyL3, r.GBPerSec, r.PageFaults, r.GCs, r.GCPauseMs, r.AllocMB)
		}
	}
	runtime.KeepAlive(ballast)
	if out := os.Getenv("SLOTPLAN_KEYBENCH_OUT"); out != "" {
		data, _ := json.MarshalIndent(rows, "", "  ")
		if err := os.WriteFile(out, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}
