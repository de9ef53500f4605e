// Package slotlattigo runs slotplan plans (shared/SPEC.md section 4) under CKKS with
// Lattigo v6, for Python through gopy. Its exported API is deliberately small and uses only
// strings, byte slices and errors: plans and results as JSON, vectors as packed
// little-endian float64. Every exported function recovers from panics and returns them as
// errors, because a Go panic would abort the Python process.
package slotlattigo

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// LattigoVersion is the Lattigo release this backend is built and tested against.
const LattigoVersion = "v6.1.1"

// Version returns the backend and Lattigo versions.
func Version() (v string) {
	defer func() {
		if recover() != nil {
			v = "unknown"
		}
	}()
	return "slotlattigo 1 (lattigo " + LattigoVersion + ")"
}

// Run executes a plan end to end and returns a result JSON.
//
//   - planJSON: the plan (schema slotplan.plan/1).
//   - inputs: for each "input" instruction in program order, its length-slots vector as
//     little-endian float64, concatenated.
//   - plaintexts: for each entry of the plan's "plaintexts" in sorted name order, its
//     length-slots value vector, concatenated the same way.
//   - optionsJSON: "" or an object with optional fields
//     "key_dir" (where the client writes the evaluation keys; default: a temporary
//     directory removed afterwards), "key_level" (level of the generated rotation keys;
//     default: the top level), "plaintext_file" (the plaintext vectors in a file instead
//     of the plaintexts argument, read one at a time) and "gc_percent" (Go's GOGC during
//     the call; default 10, defaultGCPercent; -2 leaves the process's).
//
// The client side generates a secret key, only the plan's rotation keys (and the
// relinearisation key when the plan multiplies ciphertexts) into the key directory, and
// encrypts and decrypts; the evaluation side loads keys from the directory following the
// plan's load_key/drop_key schedule (all keys up front when the plan has no load_key).
//
// The result JSON has "outputs" (one per "output" instruction in program order: tensor,
// table, level, log2_scale, and "data" = base64 of the decrypted length-slots vector as
// little-endian float64) and "stats".
func Run(planJSON string, inputs []byte, plaintexts []byte, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	return run(planJSON, inputs, plaintexts, optionsJSON)
}

// Sizes reports what Lattigo's BinarySize gives for the objects of a parameter set
// (a plan's "params" object as JSON): per level 0..max, the bytes of a ciphertext, a
// plaintext and one rotation key generated at that level, and the relinearisation key.
func Sizes(paramsJSON string) (result string, err error) {
	defer recoverError(&err)
	var pp planParams
	if err := json.Unmarshal([]byte(paramsJSON), &pp); err != nil {
		return "", fmt.Errorf("params are not valid JSON: %w", err)
	}
	params, err := pp.ckksParameters()
	if err != nil {
		return "", err
	}
	out := struct {
		LogN            int      `json:"log_n"`
		Slots           int      `json:"slots"`
		MaxLevel        int      `json:"max_level"`
		Q               []uint64 `json:"q"`
		P               []uint64 `json:"p"`
		LogQP           float64  `json:"log_qp"`
		CiphertextBytes []int    `json:"ciphertext_bytes"`
		PlaintextBytes  []int    `json:"plaintext_bytes"`
		GaloisKeyBytes  []int    `json:"galois_key_bytes"`
		RelinKeyBytes   int      `json:"relin_key_bytes"`
	}{
		LogN: params.LogN(), Slots: params.MaxSlots(), MaxLevel: params.MaxLevel(),
		Q: params.Q(), P: params.P(), LogQP: params.LogQP(),
		RelinKeyBytes: rlwe.NewRelinearizationKey(params).BinarySize(),
	}
	levelP := params.MaxLevelP()
	for l := 0; l <= params.MaxLevel(); l++ {
		out.CiphertextBytes = append(out.CiphertextBytes, ckks.NewCiphertext(params, 1, l).BinarySize())
		out.PlaintextBytes = append(out.PlaintextBytes, ckks.NewPlaintext(params, l).BinarySize())
		lq := l
		gk := rlwe.NewGaloisKey(params, rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &levelP})
		out.GaloisKeyBytes = append(out.GaloisKeyBytes, gk.BinarySize())
	}
	data, err := json.Marshal(out)
	return string(data), err
}

func recoverError(err *error) {
	if r := recover(); r != nil {
		// Keep the frames from the panic site on (a few, enough to locate it).
		stack := strings.Split(string(debug.Stack()), "\n")
		for i, line := range stack {
			if strings.HasPrefix(line, "panic(") {
				stack = stack[i+2:]
				break
			}
		}
		if len(stack) > 12 {
			stack = stack[:12]
		}
		*err = fmt.Errorf("internal error in the Lattigo backend (Go panic): %v\n%s", r, strings.Join(stack, "\n"))
	}
}

type runOptions struct {
	KeyDir   string `json:"key_dir"`
	KeyLevel *int   `json:"key_level"`
	// GCPercent sets Go's GOGC for the call (default 10, defaultGCPercent: the heap stays
	// near the live keys, ciphertexts and matrices; Go's meaning otherwise: -1 turns it off).
	GCPercent *int `json:"gc_percent"`
	// PlaintextFile: the plaintext vectors in a file (packed as for the plaintexts
	// argument, which is then empty), read one vector at a time when it is encoded: a plan
	// with many plaintexts then never holds them all in memory.
	PlaintextFile string `json:"plaintext_file"`
	// MemoryLimitExtraBytes (> 0): Go's soft memory limit during the call is the memory the
	// Go runtime holds at its start plus this (the modelled growth of the process,
	// backends/lattigo_memory.py): the collector runs before the heap passes the model.
	MemoryLimitExtraBytes int64 `json:"memory_limit_extra_bytes"`
	// KeepBootState: leave the bootstrapping evaluators with their encoded DFT matrices in
	// the process for the next Run of the same bootstrapping parameters (bootstate.go: a
	// batched plan's ciphertext sets, model-bench's repeats); without it the call lets go of
	// them at its end (it still uses a state an earlier call left).
	KeepBootState bool `json:"keep_boot_state"`
	// PlaintextStore: a directory for the process's plaintext store (ptstore.go): a fused
	// block's streamed plaintexts are written to a file there the first time they are encoded
	// and read back by this and later Run calls of the process (same parameters) instead of
	// encoded again. PlaintextStoreMaxBytes bounds the file (0: storeDefaultMaxBytes).
	PlaintextStore         string `json:"plaintext_store"`
	PlaintextStoreMaxBytes int64  `json:"plaintext_store_max_bytes"`
	// DebugPanic panics inside Run; tests use it to check that panics become errors.
	commonOptions
}

type stats struct {
	LogN              int                `json:"log_n"`
	Slots             int                `json:"slots"`
	MaxLevel          int                `json:"max_level"`
	OpCounts          map[string]int     `json:"op_counts"`
	OpSeconds         map[string]float64 `json:"op_seconds"`
	Rotations         int                `json:"rotations"`
	RotationKeys      int                `json:"rotation_keys"`
	KeyMode           string             `json:"key_mode"`
	KeyLevel          int                `json:"key_level"`
	KeyLoads          int                `json:"key_loads"`
	KeyLoadSeconds    float64            `json:"key_load_seconds"`
	KeyLoadBytes      int64              `json:"key_load_bytes"`       // bytes of key files read in those seconds
	KeyLoadsReused    int                `json:"key_loads_reused"`     // plan key loads read into a dropped key's memory (keystore.go)
	KeyLoadSplit      map[string]float64 `json:"key_load_split"`       // key_load_seconds by what was read (keystore.go: keyLoadSplit)
	KeyLoadCPUSeconds float64            `json:"key_load_cpu_seconds"` // the reading threads' CPU time of those reads
	// KeyStorageReadBytes: of the bytes read, those the kernel fetched from storage (the page
	// cache did not hold them), by what was read (pagecache.go); absent where not counted
	KeyStorageReadBytes map[string]int64 `json:"key_storage_read_bytes,omitempty"`
	KeyStreamMapped     int64            `json:"key_stream_mapped"` // streamed block keys mapped, not copied (pagecache.go)
	KeyWaitSeconds      float64          `json:"key_wait_seconds"`  // the evaluation waited for keys read ahead (plan keys, streamed block keys)
	GaloisKeyBytes      int              `json:"galois_key_bytes"`
	PeakKeyBytes        int64            `json:"peak_key_bytes"`
	PeakResidentKeys    int              `json:"peak_resident_keys"`
	RelinKeyBytes       int              `json:"relin_key_bytes"`
	PeakCiphertextBytes int64            `json:"peak_ciphertext_bytes"`
	SkippedRescales     int              `json:"skipped_rescales"`
	FusedBlocks         int              `json:"fused_blocks"`
	LevelDrops          int              `json:"level_drops"` // levels dropped (executor.dropLevel), summed
	FusedProducts       int              `json:"fused_products"`
	ProductSums         int              `json:"product_sums"`      // sums of ct-ct products relinearised once (relin.go)
	ProductSumTerms     int              `json:"product_sum_terms"` // their cmul terms
	FusedQBlocks        int              `json:"fused_q_blocks"`    // of FusedBlocks, evaluated in Q (the annotation's mode "q")
	// streamed plaintexts encoded two at a time (embedPair, encode_pair.go)
	PairedPlaintexts int64 `json:"paired_plaintexts"`
	// of FusedBlocks, QP blocks run with their babies in Q (fused_qbabies.go)
	FusedQBabyBlocks int `json:"fused_qbaby_blocks"`
	// FusedPhaseSeconds: time inside fused blocks by phase (babies: decomposition and lazy
	// baby rotations; products: plaintext products accumulated in QP; giants: ModDown, key
	// switch and automorphism per giant step; finish: final ModDowns, rescale), summed over
	// the workers (equal to wall time with one worker)
	FusedPhaseSeconds map[string]float64 `json:"fused_phase_seconds,omitempty"`
	FusedBabies       int                `json:"fused_babies"`
	// blocks whose products read more than one register (rotations of rotations of their
	// origin: a key schedule's two-hop rotations)
	FusedMultiBase int     `json:"fused_multi_base"`
	FusedGiants    int     `json:"fused_giants"`
	Workers        int     `json:"workers"`
	MaxScaleFix    float64 `json:"max_scale_fix"`
	// operands brought to the other operand's scale exactly (an add/sub across levels)
	ScaleSets       int     `json:"scale_sets"`
	KeygenSeconds   float64 `json:"keygen_seconds"`
	KeyWriteSeconds float64 `json:"key_write_seconds"`
	SetupSeconds    float64 `json:"setup_seconds"`
	EvalSeconds     float64 `json:"eval_seconds"`
	TotalSeconds    float64 `json:"total_seconds"`

	// Bootstrapping plans.
	Boot              string    `json:"boot,omitempty"`
	Bootstraps        int       `json:"bootstraps"`
	BootstrapSeconds  []float64 `json:"bootstrap_seconds"`
	BootstrapInLevels []int     `json:"bootstrap_input_levels"`
	// BootstrapKinds: per bootstrap, "full" or the sparse variant (s<k>, h<k>, p<k>;
	// bootvariant.go), in the order of bootstrap_seconds
	BootstrapKinds    []string `json:"bootstrap_kinds,omitempty"`
	BootKeyBytes      int64    `json:"boot_key_bytes"`
	BootMatrixBytes   int64    `json:"boot_matrix_bytes"`
	BootMatrixSeconds float64  `json:"boot_matrix_seconds"`
	// BootMatrixBuilds: how many times this evaluation encoded the matrices (0: it used the
	// ones an earlier evaluation of the process left, BootStateReused); BootStateKept: it
	// left them for the next one (bootstate.go); EvalSecondsNoMatrices: eval_seconds less
	// boot_matrix_seconds (the per-evaluation cost once the matrices exist)
	BootMatrixBuilds int  `json:"boot_matrix_builds"`
	BootStateReused  bool `json:"boot_state_reused"`
	BootStateKept    bool `json:"boot_state_kept"`
	// the plaintext store's work in this call (run option plaintext_store; nil without it)
	PlaintextStore        *ptStoreStats `json:"plaintext_store,omitempty"`
	EvalSecondsNoMatrices float64       `json:"eval_seconds_without_matrices"`
	// CinS (cins_exec.go): rotations inside to_cins and fused/unfused StoC matrices (not in
	// "rotations", which counts the plan's rot instructions), fused convolutions, the bytes
	// of the CinS matrices encoded (kept only where the plaintext cache keeps plaintexts)
	// and the level each bootstrap_cins's EvalMod returned
	CinsRotations      int   `json:"cins_rotations"`       // to_cins and unfused S_(N/2<-l)
	CinsFusedRotations int   `json:"cins_fused_rotations"` // fused convolutions S_(N/2<-l) K
	CinsFused          int   `json:"cins_fused"`
	CinsMatrixBytes    int64 `json:"cins_matrix_bytes"`
	CinsOutLevels      []int `json:"cins_out_levels"`
	BootBlockLoads     int   `json:"boot_block_loads"`
	BootStreamReads    int   `json:"boot_stream_reads"`    // Galois keys of a streamed block read during bootstraps
	BootStreamRequests int   `json:"boot_stream_requests"` // and asked for by them (more reads than requests: keys read and not used)
	BootStreamReused   int   `json:"boot_stream_reused"`   // of them read into a key a bootstrap had finished with
	// bootstraps on a streamed block that began on a predicted key order (bootorder.go),
	// that began learning one (keys read in line), and the times a bootstrap left its
	// order (a request off it, or stopping short of it: the order is learned again)
	BootStreamPredicted int     `json:"boot_stream_predicted"`
	BootStreamLearned   int     `json:"boot_stream_learned"`
	BootStreamMisses    int     `json:"boot_stream_misses"`
	BootKeygenSeconds   float64 `json:"boot_keygen_seconds"`
	// PeakTrackedBytes: the largest sum of live ciphertexts, resident keys (plan and
	// block), relinearisation key and resident DFT matrices, sampled after every
	// instruction (what the memory model counts).
	PeakTrackedBytes int64 `json:"peak_tracked_bytes"`
	// PeakKeyBlockBytes: the largest sum of resident keys and the boot block's DFT
	// matrices after an instruction (what the plan's peak_bytes.keys counts: the block is
	// its keys and matrices)
	PeakKeyBlockBytes int64 `json:"peak_key_block_bytes"`
	// RSS of the process (Linux /proc/self/status): at the start of the call, and the peak
	// during the call (VmHWM, reset at the start through /proc/self/clear_refs when
	// allowed; peak_rss_reset says whether it was).
	RSSStartBytes int64 `json:"rss_start_bytes"`
	PeakRSSBytes  int64 `json:"peak_rss_bytes"`
	PeakRSSReset  bool  `json:"peak_rss_reset"`
	GCPercent     int   `json:"gc_percent"`
	// BootstrapPhases: the sparse bootstraps' time by phase (bootphase.go); EvalCPU: the
	// process's CPU time, collector, GC cycles and page faults over the evaluation
	BootstrapPhases *bootPhases `json:"bootstrap_phases,omitempty"`
	EvalCPU         *evalCPU    `json:"eval_cpu,omitempty"`
}

func (s *stats) addOp(op string, seconds float64) {
	s.OpCounts[op]++
	s.OpSeconds[op] += seconds
}

type outputRecord struct {
	Tensor    string  `json:"tensor"`
	Table     string  `json:"table"`
	Level     int     `json:"level"`
	Log2Scale float64 `json:"log2_scale"`
	Data      string  `json:"data"`
}

type runResult struct {
	Outputs []outputRecord `json:"outputs"`
	Stats   *stats         `json:"stats"`
}

// unpack splits packed little-endian float64 into n vectors of length slots.
func unpack(what string, data []byte, n, slots int) ([][]float64, error) {
	widths := make([]int, n)
	for i := range widths {
		widths[i] = slots
	}
	return unpackWidths(what, data, widths)
}

// unpackWidths splits data into vectors of the given lengths (float64, little-endian).
func unpackWidths(what string, data []byte, widths []int) ([][]float64, error) {
	total := 0
	for _, w := range widths {
		total += w
	}
	if len(data) != total*8 {
		if len(widths) > 0 && total == len(widths)*widths[0] {
			return nil, fmt.Errorf("%s: expected %d vectors of %d float64 (%d bytes), got %d bytes",
				what, len(widths), widths[0], total*8, len(data))
		}
		return nil, fmt.Errorf("%s: expected %d vectors of %d float64 in all (%d bytes; complex plaintexts take 2*slots), got %d bytes",
			what, len(widths), total, total*8, len(data))
	}
	vecs := make([][]float64, len(widths))
	at := 0
	for i := range vecs {
		v := make([]float64, widths[i])
		if err := binary.Read(bytes.NewReader(data[at*8:(at+widths[i])*8]), binary.LittleEndian, v); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		at += widths[i]
		for s, x := range v {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("%s: vector %d slot %d is %v", what, i, s, x)
			}
		}
		vecs[i] = v
	}
	return vecs, nil
}

func pack(v []float64) string {
	buf := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(buf[8*i:], math.Float64bits(x))
	}
	return base64.StdEncoding.EncodeToString(buf)
}

func run(planJSON string, inputs []byte, plaintexts []byte, optionsJSON string) (string, error) {
	t0 := time.Now()
	var opt runOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	kept := takeKeptBoot() // (an earlier call's bootstrapping state: counted in rss_start)
	if kept != nil {
		// what the earlier call freed goes back to the OS first: rss_start is then the
		// process's live memory (the kept matrices among it), not the last call's garbage,
		// which the process model's growth would count a second time
		releaseMemory()
	}
	rssStart, rssReset := resetPeakRSS()
	p, setup, slots, err := loadPlan(planJSON)
	if err != nil {
		return "", err
	}
	params := setup.params
	if keepable, _ := p.bootKeepable(); kept != nil && (setup.boot == nil || kept.id != bootStateID(setup) || !keepable) {
		kept = nil
		releaseMemory()
	}
	gcPercent := defaultGCPercent // memmodel.go
	if opt.GCPercent != nil {
		gcPercent = *opt.GCPercent
	}
	defer withGCPercent(gcPercent)()
	if opt.MemoryLimitExtraBytes > 0 {
		defer withMemoryLimit(goMappedBytes() + opt.MemoryLimitExtraBytes)()
	}
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
	keyLevel := p.defaultKeyLevel(setup.top)
	if opt.KeyLevel != nil {
		if *opt.KeyLevel < 0 || *opt.KeyLevel > keyLevel {
			return "", fmt.Errorf("options: key_level must be in 0..%d, got %d", keyLevel, *opt.KeyLevel)
		}
		keyLevel = *opt.KeyLevel
	}
	keyDir := opt.KeyDir
	if keyDir == "" {
		if keyDir, err = os.MkdirTemp("", "slotlattigo-keys-"); err != nil {
			return "", fmt.Errorf("cannot create a temporary key directory: %w", err)
		}
		defer os.RemoveAll(keyDir)
	}

	st := &stats{
		LogN: params.LogN(), Slots: slots, MaxLevel: setup.top,
		OpCounts: map[string]int{}, OpSeconds: map[string]float64{},
		KeyMode: "keep_all", KeyLevel: keyLevel,
		RSSStartBytes: rssStart, PeakRSSReset: rssReset, GCPercent: currentGCPercent(),
		BootstrapSeconds: []float64{}, BootstrapInLevels: []int{},
	}
	if setup.boot != nil {
		st.Boot = setup.boot.Literal
	}
	if p.hasKeySchedule() {
		st.KeyMode = "scheduled"
	}

	// Client: secret key and evaluation keys into the key directory.
	t := time.Now()
	c := newSetupClient(setup)
	skSec := time.Since(t).Seconds()
	ks, err := planKeySet(p, setup, opt.KeyLevel != nil)
	if err != nil {
		return "", err
	}
	offsets := ks.offsets
	m, genSec, writeSec, err := c.writeKeySet(keyDir, offsets, ks.relin, keyLevel, ks.levels, ks.withBlock)
	if err != nil {
		return "", err
	}
	releaseMemory() // the client's copies of the keys are written: return them to the OS
	if m.Boot != nil {
		st.BootKeygenSeconds = m.Boot.keygenSeconds
	}
	st.KeygenSeconds, st.KeyWriteSeconds = skSec+genSec, writeSec
	st.RotationKeys = len(offsets)
	if len(m.Rotations) > 0 {
		st.GaloisKeyBytes = m.Rotations[0].Bytes
	}
	st.RelinKeyBytes = m.RelinSize

	// The client encrypts the inputs (at the top level, default scale); the evaluation side
	// gets only the key directory and these ciphertexts (ctIO: no path to the client).
	io := &ctIO{}
	for _, v := range inVecs {
		ct, err := c.encrypt(v)
		if err != nil {
			return "", err
		}
		io.inputs = append(io.inputs, ct)
	}

	// Evaluation side: only the key directory and ciphertexts.
	t = time.Now()
	keys, err := openKeyStore(keyDir, params)
	if err != nil {
		return "", err
	}
	cache := newPtCache(-1) // (one evaluation: plaintexts encoded when read and not kept)
	cache.boot = kept
	var store *ptStore
	if opt.PlaintextStore != "" {
		if store, err = openPtStore(opt.PlaintextStore, params, opt.PlaintextStoreMaxBytes, ""); err != nil {
			return "", err
		}
	}
	ex := newExecutor(setup, keys, p, ptValues, io, st, executorOptions{Cache: cache, Store: store})
	ex.ptFile = ptFile
	st.SetupSeconds = time.Since(t).Seconds()

	stopProfile, err := startEnvCPUProfile()
	if err != nil {
		return "", err
	}
	st.BootstrapPhases = newBootPhases()
	cpu0 := sampleEvalCPU()
	t = time.Now()
	err = ex.run()
	st.EvalSeconds = time.Since(t).Seconds()
	cpu := sampleEvalCPU().since(cpu0)
	st.EvalCPU = &cpu
	stopProfile()
	if st.BootstrapPhases.Count == 0 {
		st.BootstrapPhases = nil
	}
	st.EvalSecondsNoMatrices = st.EvalSeconds - st.BootMatrixSeconds
	if store != nil {
		ss := store.finish()
		st.PlaintextStore = &ss
	}
	if opt.KeepBootState && err == nil {
		putKeptBoot(cache.boot)
	} else {
		st.BootStateKept = false // (the call lets go of it)
	}
	st.KeyLoads, st.KeyLoadSeconds, st.KeyLoadBytes = keys.loads, keys.loadSeconds, keys.readBytes.Load()
	st.KeyLoadsReused, st.KeyLoadSplit = keys.keysReused, keys.keyLoadSplit()
	st.KeyLoadCPUSeconds = float64(keys.readCPUNanos.Load()) / 1e9
	st.KeyStorageReadBytes = keys.cache.storageReadBytes()
	st.KeyStreamMapped = keys.cache.mapped.Load()
	st.KeyWaitSeconds = keys.waitSeconds()
	st.PeakKeyBytes, st.PeakResidentKeys = keys.peakBytes, keys.peakCount
	st.Bootstraps, st.BootBlockLoads = len(st.BootstrapSeconds), keys.blockLoads
	st.BootStreamReads, st.BootStreamReused, st.BootStreamRequests = keys.streamReads, keys.streamReused, keys.streamRequests
	st.BootStreamPredicted, st.BootStreamLearned, st.BootStreamMisses = keys.streamPredicted, keys.streamLearned, keys.streamMisses
	if err != nil {
		return "", err
	}
	// The client decrypts the outputs.
	outs, err := c.decryptOutputs(p, io.outputs)
	if err != nil {
		return "", err
	}
	st.PeakRSSBytes = peakRSS()
	st.TotalSeconds = time.Since(t0).Seconds()
	data, err := json.Marshal(runResult{Outputs: outs, Stats: st})
	if err != nil {
		return "", fmt.Errorf("cannot encode the result: %w", err)
	}
	return string(data), nil
}

// commonOptions are accepted by every exported entry point.
type commonOptions struct {
	// DebugPanic panics inside the call (tests check that panics become errors).
	DebugPanic bool `json:"debug_panic"`
}

// decodeOptions parses an entry point's options JSON (empty means defaults) into opt and
// honours the common debug_panic switch.
func decodeOptions(optionsJSON string, opt any, common *commonOptions) error {
	if strings.TrimSpace(optionsJSON) != "" {
		if err := json.Unmarshal([]byte(optionsJSON), opt); err != nil {
			return fmt.Errorf("options are not valid JSON: %w", err)
		}
	}
	if common.DebugPanic {
		panic("debug_panic requested")
	}
	return nil
}

// planKeyOffsets are the rotation offsets a bootstrapping plan needs keys of its own for:
// every offset the boot block does not hold, and every offset the plan loads with
// load_key (it may rotate by it while the block is dropped).
func planKeyOffsets(p *plan, info bootKeys) []int {
	block := map[int]bool{}
	for _, k := range info.offsets {
		block[k] = true
	}
	loaded := p.loadOffsets()
	var out []int
	for _, k := range p.rotationOffsets() {
		if !block[k] || loaded[k] {
			out = append(out, k)
		}
	}
	return out
}

// procStatus reads one "kB" field of /proc/self/status in bytes (0 when unavailable).
func procStatus(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return n * 1024
				}
			}
		}
	}
	return 0
}

// resetPeakRSS returns the current RSS and resets the process's peak RSS (VmHWM) when
// the kernel allows it (writing 5 to /proc/self/clear_refs resets only that counter).
func resetPeakRSS() (int64, bool) {
	rss := procStatus("VmRSS")
	err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return rss, err == nil
}

// peakRSS is the process's peak RSS (VmHWM) in bytes.
func peakRSS() int64 {
	return procStatus("VmHWM")
}

// plaintextFile serves plaintext vectors from a file packed like Run's plaintexts argument
// (sorted plaintext names, little-endian float64: slots values each, 2*slots for a complex
// plaintext), one read per use.
type plaintextFile struct {
	f     *os.File
	index map[string]int
	at    []int64 // per vector: its first value's position
	width []int
	path  string
}

// planPlaintexts gives a plan's plaintext vectors packed (by name) or, with path set, the
// file they are read from one at a time (Run's and BenchPlan's plaintext_file option).
func planPlaintexts(p *plan, packed []byte, path string, slots int) (map[string][]float64, *plaintextFile, error) {
	names := p.plaintextNames()
	values := map[string][]float64{}
	if path != "" {
		if len(packed) != 0 {
			return nil, nil, fmt.Errorf("plaintexts: give them packed or as plaintext_file, not both")
		}
		f, err := openPlaintextFile(path, names, p.plaintextWidths(slots))
		return values, f, err
	}
	vecs, err := unpackWidths("plaintexts", packed, p.plaintextWidths(slots))
	if err != nil {
		return nil, nil, err
	}
	for i, n := range names {
		values[n] = vecs[i]
	}
	return values, nil, nil
}

func openPlaintextFile(path string, names []string, widths []int) (*plaintextFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("plaintext_file: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("plaintext_file: %w", err)
	}
	pf := &plaintextFile{f: f, index: map[string]int{}, path: path, width: widths}
	var total int64
	for i, n := range names {
		pf.index[n] = i
		pf.at = append(pf.at, total)
		total += int64(widths[i])
	}
	if want := total * 8; fi.Size() != want {
		f.Close()
		return nil, fmt.Errorf("plaintext_file %s: expected %d vectors, %d float64 in all (%d bytes), got %d bytes",
			path, len(names), total, want, fi.Size())
	}
	return pf, nil
}

// vector reads the named plaintext's values (a fresh slice).
func (pf *plaintextFile) vector(name string) ([]float64, error) {
	var raw []byte
	var v []float64
	return pf.vectorInto(name, &raw, &v)
}

// vectorInto reads the named plaintext's values into *v, reading through *raw (each grown
// when too short and kept: a caller that keeps them allocates nothing per read). Safe for
// concurrent use with distinct buffers.
func (pf *plaintextFile) vectorInto(name string, raw *[]byte, vp *[]float64) ([]float64, error) {
	i, ok := pf.index[name]
	if !ok {
		return nil, fmt.Errorf("plaintext %q is not in the plan", name)
	}
	if cap(*raw) < 8*pf.width[i] {
		*raw = make([]byte, 8*pf.width[i])
	}
	buf := (*raw)[:8*pf.width[i]]
	if _, err := pf.f.ReadAt(buf, pf.at[i]*8); err != nil {
		return nil, fmt.Errorf("plaintext_file %s: %w", pf.path, err)
	}
	if cap(*vp) < pf.width[i] {
		*vp = make([]float64, pf.width[i])
	}
	v := (*vp)[:pf.width[i]]
	for s := range v {
		v[s] = math.Float64frombits(binary.LittleEndian.Uint64(buf[8*s:]))
		if math.IsNaN(v[s]) || math.IsInf(v[s], 0) {
			return nil, fmt.Errorf("plaintext %q slot %d is %v", name, s, v[s])
		}
	}
	return v, nil
}

func (pf *plaintextFile) close() {
	pf.f.Close()
}
