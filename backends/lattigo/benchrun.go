package slotlattigo

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// BenchPlan runs a plan like Run (same arguments, same executor, same level and scale
// policy, same result JSON) but is built to time evaluation alone:
//
//   - keys are generated before the clock starts (kept in memory when the plan has no
//     load_key/drop_key schedule and no bootstrapping, else written to a temporary key
//     directory as Run does, with the boot block of a bootstrapping plan);
//   - a bootstrapping plan's boot block is made resident before the clock without a key
//     schedule; under one it is read where the plan loads it (in the clock), and the DFT
//     matrices its evaluator encodes then are timed apart like plaintext encoding
//     (stats.boot_matrix_seconds: model preparation, subtracted from the evaluation);
//   - the inputs are encrypted before the clock starts and the outputs decrypted after it
//     stops (the "input" and "output" instructions only hand ciphertexts over);
//   - plaintexts are encoded once per model and cached (ptCache): an untimed preparation
//     run encodes them (stats.encode_seconds, the model preparation; prepare_seconds the
//     whole run), the timed runs reuse them; encoding that still happens inside a timed
//     run is timed apart and subtracted;
//   - the program runs `repeat` times (option, default 1) on fresh copies of the input
//     ciphertexts; stats.eval_seconds is the median, stats.eval_seconds_runs every run,
//     op_seconds/op_counts belong to the median run;
//   - options workers (goroutines of a fused block, default GOMAXPROCS), no_fuse (execute
//     instruction by instruction) and no_prepare;
//   - option memory_limit_bytes (> 0) sets Go's soft memory limit for the call;
//     memory_limit_extra_bytes (> 0) sets it, once keys and inputs are ready, to what the Go
//     runtime holds then plus that many bytes (the run's modelled peak: the garbage
//     collector then keeps the heap near the live bytes);
//   - option prefetch (default true): a scheduled plan's load_key reads the key in a
//     background goroutine (prefetch.go); false reads it in line;
//   - option keep_all_disk: a plan without key schedule reads all its keys from a key
//     directory before the clock starts (ANT-ACE's keep-all: stats.key_load_seconds)
//     instead of generating them in memory;
//   - option preload_prologue: a scheduled plan's leading load_key instructions (before
//     its first instruction other than input/load_key) are read before the clock starts,
//     as keep-all reads all its keys (stats.prologue_key_loads); they count as loads;
//   - option measure_rss: the process's resident set is measured around the evaluation
//     (after garbage collection, the kernel's high-water mark reset): rss_start_bytes
//     before the keep-all loads / the first instruction, rss_peak_bytes the peak until the
//     last run ends.
//
// Extra stats: encrypt_seconds, decrypt_seconds, encode_seconds, repeat, key_store
// ("memory" or "disk"), key_bytes (all rotation keys) and eval_seconds_runs.
func BenchPlan(planJSON string, inputs []byte, plaintexts []byte, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	defer releaseMemory()
	return benchPlan(planJSON, inputs, plaintexts, optionsJSON)
}

type benchPlanOptions struct {
	Repeat int `json:"repeat"`
	// Workers: goroutines of a fused block (0: GOMAXPROCS); NoFuse: run every instruction
	// as written (no fused blocks); NoPrepare: no untimed preparation run (plaintexts are
	// then encoded during the first timed run, timed apart).
	Workers   int  `json:"workers"`
	NoFuse    bool `json:"no_fuse"`
	NoPrepare bool `json:"no_prepare"`
	// NoPlaintextCache: every run encodes each plaintext when it is read and keeps none (as
	// Run does; the timed runs then include the encoding) instead of one cache across runs.
	NoPlaintextCache bool `json:"no_plaintext_cache"`
	// MemoryLimitBytes (> 0) is the Go soft memory limit during the call
	// (debug.SetMemoryLimit): the garbage collector works harder instead of letting the
	// heap grow to twice the live keys.
	MemoryLimitBytes      int64 `json:"memory_limit_bytes"`
	MemoryLimitExtraBytes int64 `json:"memory_limit_extra_bytes"`
	// GCPercent: Go's GOGC for the call (absent: the process's, Go's 100 unless set; a
	// benchmark standing for Run passes Run's, ExecutorMemory's run_gc_percent).
	GCPercent       *int  `json:"gc_percent"`
	Prefetch        *bool `json:"prefetch"`
	KeepAllDisk     bool  `json:"keep_all_disk"`
	PreloadPrologue bool  `json:"preload_prologue"`
	MeasureRSS      bool  `json:"measure_rss"`
	// PlaintextFile: the plaintext vectors in a file (as Run's option: one vector in memory
	// at a time; reading one is timed with its encoding, model preparation)
	PlaintextFile string `json:"plaintext_file"`
	// CPUProfile: write a Go CPU profile (pprof) of the timed runs to this file.
	CPUProfile string `json:"cpu_profile"`
	// DebugPanic panics inside BenchPlan (tests check that panics become errors).
	commonOptions
}

type benchPlanStats struct {
	*stats
	EvalSecondsRuns []float64 `json:"eval_seconds_runs"`
	// PooledStartBytes: per timed run, the pooled baby rotations and ciphertexts it found
	// at its start (0 without a plaintext cache: each run starts afresh, as Run does)
	PooledStartBytes []int64   `json:"pooled_start_bytes_runs"`
	EncodeSeconds    float64   `json:"encode_seconds"`
	PrepareSeconds   float64   `json:"prepare_seconds"`
	CPUSeconds       float64   `json:"cpu_seconds"`
	CPUSecondsRuns   []float64 `json:"cpu_seconds_runs"`
	CachedPtBytes    int64     `json:"cached_plaintext_bytes"`
	EncryptSeconds   float64   `json:"encrypt_seconds"`
	DecryptSeconds   float64   `json:"decrypt_seconds"`
	Repeat           int       `json:"repeat"`
	KeyStore         string    `json:"key_store"`
	KeyBytes         int64     `json:"key_bytes"`
	Prefetch         bool      `json:"prefetch"`
	KeyWaitSeconds   float64   `json:"key_wait_seconds"`
	RSSStartBytes    int64     `json:"rss_start_bytes"`
	RSSPeakBytes     int64     `json:"rss_peak_bytes"`
	RSSMeasured      bool      `json:"rss_measured"`
	PrologueLoads    int       `json:"prologue_key_loads"`
}

// benchIO hands pre-encrypted inputs to the executor and keeps the output ciphertexts
// (decrypted after the timed part): the executor's ctIO.
type benchIO = ctIO

// releaseMemory returns the heap of a large benchmark (keys, encoded matrices) to the OS
// so that the next call in the same process starts from a small heap.
func releaseMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

// withMemoryLimit sets the Go soft memory limit when limit > 0 and returns the function
// that restores the previous one.
func withMemoryLimit(limit int64) func() {
	if limit <= 0 {
		return func() {}
	}
	old := debug.SetMemoryLimit(limit)
	return func() { debug.SetMemoryLimit(old) }
}

// withGCPercent sets Go's GOGC (debug.SetGCPercent; -2 leaves it) and returns the function
// that restores the previous one.
func withGCPercent(percent int) func() {
	if percent == -2 {
		return func() {}
	}
	old := debug.SetGCPercent(percent)
	return func() { debug.SetGCPercent(old) }
}

// currentGCPercent reads Go's GOGC (debug.SetGCPercent has no getter).
func currentGCPercent() int {
	v := debug.SetGCPercent(-1)
	debug.SetGCPercent(v)
	return v
}

// memoryKeyStore generates the given rotation keys (and the relinearisation key) into a
// keyStore that holds them all resident and never touches the disk. Valid only for
// plans without a key schedule (nothing is ever dropped and reloaded).
func memoryKeyStore(c *client, offsets []int, relin bool) (*keyStore, float64) {
	return memoryKeyStoreAt(c, offsets, relin, c.params.MaxLevel())
}

// memoryKeyStoreAt is memoryKeyStore with the rotation keys generated at levelQ.
func memoryKeyStoreAt(c *client, offsets []int, relin bool, levelQ int) (*keyStore, float64) {
	params := c.params
	s := &keyStore{
		dir: "(memory)", params: params,
		manifest: keyManifest{LogN: params.LogN(), Q: params.Q(), P: params.P(), Rotations: []manifestKey{}},
		byGalEl:  map[uint64]manifestKey{},
		resident: map[uint64]*rlwe.GaloisKey{},
	}
	levelP := params.MaxLevelP()
	evkParams := rlwe.EvaluationKeyParameters{LevelQ: &levelQ, LevelP: &levelP}
	t := time.Now()
	for _, k := range offsets {
		galEl := galoisOf(params, k)
		gk := c.kgen.GenGaloisKeyNew(galEl, c.sk, evkParams)
		mk := manifestKey{K: k, GaloisElement: galEl, File: "(memory)", Bytes: gk.BinarySize(),
			LevelQ: gk.LevelQ(), LevelP: gk.LevelP(), Conjugation: k == conjOffset}
		s.manifest.Rotations = append(s.manifest.Rotations, mk)
		s.byGalEl[galEl] = mk
		s.galEls = append(s.galEls, galEl)
		s.resident[galEl] = gk
		s.residentBytes += int64(mk.Bytes)
	}
	sort.Slice(s.galEls, func(i, j int) bool { return s.galEls[i] < s.galEls[j] })
	s.peakBytes, s.peakCount = s.residentBytes, len(s.resident)
	if relin {
		s.rlk = c.kgen.GenRelinearizationKeyNew(c.sk)
	}
	return s, time.Since(t).Seconds()
}

func benchPlan(planJSON string, inputs []byte, plaintexts []byte, optionsJSON string) (string, error) {
	t0 := time.Now()
	var opt benchPlanOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	if opt.Repeat == 0 {
		opt.Repeat = 1
	}
	if opt.Repeat < 1 || opt.Repeat > 1000 {
		return "", fmt.Errorf("options: repeat must be in 1..1000, got %d", opt.Repeat)
	}
	defer withMemoryLimit(opt.MemoryLimitBytes)()
	if opt.GCPercent != nil {
		defer withGCPercent(*opt.GCPercent)()
	}
	p, setup, slots, err := loadPlan(planJSON)
	if err != nil {
		return "", err
	}
	params := setup.params
	_, withBlock := p.usesBootBlock()
	withBlock = withBlock && setup.btp != nil
	inVecs, err := unpack("inputs", inputs, p.count("input"), slots)
	if err != nil {
		return "", err
	}
	ptValues, ptFile, err := planPlaintexts(p, plaintexts, opt.PlaintextFile, slots)
	if err != nil {
		return "", err
	}
	if ptFile != nil {
		defer ptFile.close()
	}

	bs := &benchPlanStats{Repeat: opt.Repeat}
	c := newSetupClient(setup)
	offsets := p.rotationOffsets()
	if withBlock {
		offsets = planKeyOffsets(p, setup.blockKeys())
	}
	var keys *keyStore
	if p.hasKeySchedule() || opt.KeepAllDisk || withBlock {
		bs.KeyStore = "disk"
		keyDir, err := os.MkdirTemp("", "slotlattigo-bench-keys-")
		if err != nil {
			return "", fmt.Errorf("cannot create a temporary key directory: %w", err)
		}
		defer os.RemoveAll(keyDir)
		levels, err := p.keyLevels() // each key at the level the plan gives it (none: the top)
		if err != nil {
			return "", err
		}
		// as Run: without a key schedule the boot block stays resident and its
		// relinearisation key serves the plan's multiplications
		relin := p.needsRelin() && (p.hasKeySchedule() || !withBlock)
		m, genSec, writeSec, err := c.writeKeySet(keyDir, offsets, relin, p.defaultKeyLevel(setup.top), levels, withBlock)
		if err != nil {
			return "", err
		}
		if keys, err = openKeyStore(keyDir, params); err != nil {
			return "", err
		}
		for _, mk := range m.Rotations {
			bs.KeyBytes += int64(mk.Bytes)
		}
		bs.stats = &stats{KeygenSeconds: genSec, KeyWriteSeconds: writeSec}
	} else {
		bs.KeyStore = "memory"
		var genSec float64
		keys, genSec = memoryKeyStore(c, offsets, p.needsRelin())
		bs.KeyBytes = keys.residentBytes
		bs.stats = &stats{KeygenSeconds: genSec}
	}

	// Encrypt the inputs once; each run gets fresh copies.
	t := time.Now()
	cts := make([]*rlwe.Ciphertext, len(inVecs))
	for i, v := range inVecs {
		if cts[i], err = c.encrypt(v); err != nil {
			return "", err
		}
	}
	bs.EncryptSeconds = time.Since(t).Seconds()
	bs.Prefetch = p.hasKeySchedule() && (opt.Prefetch == nil || *opt.Prefetch)
	if bs.Prefetch {
		keys.enablePrefetch()
		defer keys.stopPrefetch()
	}
	if opt.MeasureRSS {
		collectGarbage()
		bs.RSSStartBytes, bs.RSSMeasured = resetPeakRSS()
	}
	if opt.MemoryLimitExtraBytes > 0 {
		defer withMemoryLimit(goMappedBytes() + opt.MemoryLimitExtraBytes)()
	}
	keepAllLoadSec, keepAllBytes := 0.0, int64(0)
	if !p.hasKeySchedule() && opt.KeepAllDisk {
		// ANT-ACE's keep-all: every key read before the program starts
		t, b0 := time.Now(), keys.readBytes.Load()
		if err := keys.loadAll(); err != nil {
			return "", fmt.Errorf("keep-all key policy: %w", err)
		}
		keepAllLoadSec, keepAllBytes = time.Since(t).Seconds(), keys.readBytes.Load()-b0
	}

	type runRecord struct {
		st      *stats
		eval    float64
		encode  float64
		cpu     float64
		outputs []*rlwe.Ciphertext
	}
	runs := make([]runRecord, 0, opt.Repeat)
	cache := newPtCache(0)
	if opt.NoPlaintextCache {
		cache = newPtCache(-1)
	}
	exOpt := executorOptions{NoFuse: opt.NoFuse, Workers: opt.Workers, Cache: cache}
	first := 0
	if !opt.NoPrepare {
		first = -1 // run -1: model preparation (plaintexts encoded into the cache), untimed
	}
	prologueWait := 0.0
	stopProfile := func() {}
	defer func() { stopProfile() }()
	for r := first; r < opt.Repeat; r++ {
		if opt.NoPlaintextCache {
			// as Run: each run starts without the previous one's pools (the baby rotations
			// and ciphertexts ptCache keeps for reuse); carried over, LoLa's capped runs
			// began the next run with 245 MiB of extended babies and 84 MiB of ciphertexts
			// still live, and peaked 1.25x the model from the second run on
			exOpt.Cache = newPtCache(-1)
			// and its key store holds no streamed block's request order yet: the block
			// reads nothing ahead at its load, and its first bootstrap starts on its
			// predicted order (bootorder.go; the memory model's count: carried over, the
			// load read D keys ahead, and LeNet-5's capped runs held 2 keys more before it)
			keys.streamSeq, keys.streamSeqs = nil, nil
		}
		io := &benchIO{}
		for _, ct := range cts {
			io.inputs = append(io.inputs, ct.CopyNew())
		}
		st := &stats{
			LogN: params.LogN(), Slots: slots, MaxLevel: setup.top,
			OpCounts: map[string]int{}, OpSeconds: map[string]float64{},
			BootstrapSeconds: []float64{}, BootstrapInLevels: []int{},
			KeyMode: "keep_all", KeyLevel: params.MaxLevel(), GCPercent: currentGCPercent(),
			RotationKeys: len(offsets), KeygenSeconds: bs.stats.KeygenSeconds, KeyWriteSeconds: bs.stats.KeyWriteSeconds,
		}
		if p.hasKeySchedule() {
			st.KeyMode = "scheduled"
		}
		if setup.boot != nil {
			st.Boot = setup.boot.Literal
		}
		if len(offsets) > 0 {
			st.GaloisKeyBytes = keys.manifest.Rotations[0].Bytes
		}
		if keys.rlk != nil {
			st.RelinKeyBytes = keys.rlk.BinarySize()
		}
		loads0, loadSec0, blockLoads0, streamReads0 := keys.loads, keys.loadSeconds, keys.blockLoads, keys.streamReads
		streamReused0, keysReused0 := keys.streamReused, keys.keysReused
		predicted0, learned0, misses0, requests0 := keys.streamPredicted, keys.streamLearned, keys.streamMisses, keys.streamRequests
		split0, readCPU0 := keys.keyLoadSplit(), keys.readCPUNanos.Load()
		readBytes0 := keys.readBytes.Load()
		ts := time.Now()
		ex := newExecutor(setup, keys, p, ptValues, io, st, exOpt)
		ex.ptFile = ptFile
		st.SetupSeconds = time.Since(ts).Seconds()
		if !ex.scheduled {
			if err := keys.loadAll(); err != nil {
				return "", fmt.Errorf("keep-all key policy: %w", err)
			}
			if keys.hasBlock() {
				// the boot block (keys and DFT matrices) resident before the clock too
				if err := ex.loadBlock(-1); err != nil {
					return "", fmt.Errorf("keep-all key policy: %w", err)
				}
			}
		} else if opt.PreloadPrologue {
			n, err := preloadPrologue(p, keys)
			if err != nil {
				return "", err
			}
			bs.PrologueLoads = n
			prologueWait = keys.waitSeconds()
		}
		if r == 0 && opt.CPUProfile != "" {
			if stopProfile, err = startCPUProfile(opt.CPUProfile); err != nil {
				return "", err
			}
		}
		if r >= 0 {
			bs.PooledStartBytes = append(bs.PooledStartBytes, exOpt.Cache.pooledBytes())
		}
		cpu0 := cpuSeconds()
		eval, encode, err := ex.runTimed()
		cpu := cpuSeconds() - cpu0
		if r == opt.Repeat-1 {
			stopProfile()
			stopProfile = func() {}
		}
		if err != nil {
			return "", err
		}
		st.EvalSeconds = eval
		st.EvalSecondsNoMatrices = eval // (runTimed times the matrices' encoding apart)
		st.KeyLoads, st.KeyLoadSeconds = keys.loads-loads0, keys.loadSeconds-loadSec0
		st.KeyLoadBytes = keys.readBytes.Load() - readBytes0
		st.KeyLoadsReused = keys.keysReused - keysReused0
		st.KeyLoadSplit = keys.keyLoadSplit()
		st.KeyLoadCPUSeconds = float64(keys.readCPUNanos.Load()-readCPU0) / 1e9
		for k, v := range split0 {
			st.KeyLoadSplit[k] -= v
		}
		st.Bootstraps, st.BootBlockLoads = len(st.BootstrapSeconds), keys.blockLoads-blockLoads0
		st.BootStreamReads = keys.streamReads - streamReads0
		st.BootStreamReused = keys.streamReused - streamReused0
		st.BootStreamPredicted, st.BootStreamLearned = keys.streamPredicted-predicted0, keys.streamLearned-learned0
		st.BootStreamMisses, st.BootStreamRequests = keys.streamMisses-misses0, keys.streamRequests-requests0
		if !p.hasKeySchedule() && opt.KeepAllDisk {
			st.KeyLoads, st.KeyLoadSeconds, st.KeyLoadBytes = len(keys.resident), keepAllLoadSec, keepAllBytes
		}
		st.PeakKeyBytes, st.PeakResidentKeys = keys.peakBytes, keys.peakCount
		if r >= 0 {
			runs = append(runs, runRecord{st: st, eval: eval, encode: encode, cpu: cpu, outputs: io.outputs})
		} else {
			bs.PrepareSeconds = eval + encode
		}
		if p.hasKeySchedule() {
			// Drop whatever the schedule left resident so the next run reloads as planned.
			for _, mk := range keys.manifest.Rotations {
				keys.drop(mk.K)
			}
			keys.dropBlock()
		}
	}
	if opt.MeasureRSS {
		bs.RSSPeakBytes = peakRSS()
	}
	bs.KeyWaitSeconds = keys.waitSeconds() - prologueWait
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
		bs.EvalSecondsRuns = append(bs.EvalSecondsRuns, runs[i].eval)
		bs.CPUSecondsRuns = append(bs.CPUSecondsRuns, runs[i].cpu)
	}
	sort.Slice(order, func(a, b int) bool { return runs[order[a]].eval < runs[order[b]].eval })
	med := runs[order[(len(order)-1)/2]]
	bs.stats = med.st
	bs.EncodeSeconds = cache.seconds
	bs.CPUSeconds = med.cpu
	bs.CachedPtBytes = cache.bytes

	// Decrypt the median run's outputs (after the clock).
	t = time.Now()
	var outs []outputRecord
	n := 0
	for _, in := range p.Program {
		if in.Op != "output" {
			continue
		}
		ct := med.outputs[n]
		n++
		v, err := c.decrypt(ct)
		if err != nil {
			return "", err
		}
		outs = append(outs, outputRecord{Tensor: in.Tensor, Table: in.Table, Level: ct.Level(),
			Log2Scale: ct.Scale.Log2(), Data: pack(v)})
	}
	bs.DecryptSeconds = time.Since(t).Seconds()
	bs.stats.TotalSeconds = time.Since(t0).Seconds()
	data, err := json.Marshal(struct {
		Outputs []outputRecord  `json:"outputs"`
		Stats   *benchPlanStats `json:"stats"`
	}{outs, bs})
	if err != nil {
		return "", fmt.Errorf("cannot encode the result: %w", err)
	}
	return string(data), nil
}

// runTimed is executor.run with plaintext encoding timed apart: it returns the evaluation
// seconds (wall time of the program minus encoding) and the encoding seconds.
func (e *executor) runTimed() (evalSec, encodeSec float64, err error) {
	start := time.Now()
	for i, in := range e.plan.Program {
		t := time.Now()
		e.rescaleSec, e.encodeSec = 0, 0
		op, err := e.exec(i, in)
		if err != nil {
			return 0, 0, fmt.Errorf("instruction %d (%s): %w", i, in.Op, err)
		}
		encodeSec += e.encodeSec
		e.afterStep(i, in, op, time.Since(t).Seconds()-e.rescaleSec-e.encodeSec)
	}
	return time.Since(start).Seconds() - encodeSec, encodeSec, nil
}

// preloadPrologue reads the keys a scheduled plan loads before its first computing
// instruction (the schedule's counterpart of keep-all's up-front loads) and waits for them.
func preloadPrologue(p *plan, keys *keyStore) (int, error) {
	n := 0
	for i, in := range p.Program {
		if in.Op == "input" {
			continue
		}
		if in.Op != "load_key" || in.K == nil {
			break
		}
		if err := keys.load(*in.K); err != nil {
			return n, fmt.Errorf("instruction %d (load_key): %w", i, err)
		}
		if err := keys.settle(keys.params.GaloisElement(*in.K)); err != nil {
			return n, fmt.Errorf("instruction %d (load_key): %w", i, err)
		}
		n++
	}
	return n, nil
}
