package slotlattigo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
	"time"
	"unsafe"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/polynomial"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
	"github.com/tuneinsight/lattigo/v6/utils/bignum"
)

// Calibrate times the CKKS operations a plan is made of, on this machine, at the given
// parameters (a plan's "params" object as JSON), for `slotplan calibrate`.
//
// optionsJSON: "" or {"repeat": R (default 5), "hoist_batch": B (default 8),
// "levels": [...] (default: top, middle = top/2, 0)}. Every timing is taken R times after
// one untimed warm-up; the result reports each sample and the median, in seconds of the
// calibrating thread's CPU time (option "clock": "wall" for elapsed time): on a shared
// machine elapsed time also counts the time other processes hold the cores.
//
// Per level (key switching keys are generated at the top level and serve every level):
//
//	rotate            eval.Rotate of one ciphertext
//	rotate_hoisted_1  eval.RotateHoisted with 1 offset
//	rotate_hoisted_B  eval.RotateHoisted with B offsets (one decomposition, B outputs)
//	pmul              eval.Mul by a plaintext encoded beforehand (scale q_level)
//	encode            the executor's encoding (embedder, encode.go) of a random
//	                  length-slots vector at that level: ckks.Encoder.Encode bit for bit
//	                  (big-float FFT when log_scale > 53) without its per-coefficient
//	                  allocations. Before 2026-11-27 this timed ckks.Encoder.Encode itself
//	                  (now encode_lattigo), which is not what the executor runs
//	encode_pair       two such vectors encoded together (embedPair, encode_pair.go: one
//	                  inverse FFT and one NTT per prime for both), in Q, the pair's time;
//	                  standard rings at precision <= 53 only
//	encode_lattigo    ckks.Encoder.Encode, the same vector
//	encode_prec53     only when log_scale > 53: the same with ckks.NewEncoder(params, 53)
//	add               eval.Add of two ciphertexts
//	cmul_relin        eval.MulRelin of two ciphertexts
//	cmul_tensor       eval.MulThenAdd of two ciphertexts into a degree-2 sum (no relinearisation)
//	relin             eval.Relinearize of a degree-2 ciphertext
//	rescale           eval.Rescale of a pmul result (levels >= 1)
//	block_base        decompose c1, P*c0 and P*c1 (once per base ciphertext of fused blocks)
//	block_finish      the two final ModDowns of a fused block
//	block_fixed       a fused block's fixed part (fused.go): decompose c1, P*c0 and P*c1,
//	                  the two final ModDowns
//	block_baby        one lazy hoisted baby rotation (hoistedBaby, product.go, in QP)
//	block_product     one plaintext product accumulated lazily in QP (both polynomials)
//	block_giant       one giant step: ModDown of c1, key switch, add, automorphisms in QP
//	block_baby_q      a Q-mode block's baby brought down to Q: the two ModDowns of a lazy
//	                  baby rotation (once per baby and base; into a recycled ciphertext)
//	block_q           a Q-mode block's own cost: the final reduction of both polynomials of
//	                  its output (a recycled ciphertext, as the executor's newCt gives)
//	block_product_q   one plaintext product accumulated lazily in Q (both polynomials,
//	                  distinct plaintexts streamed, reduced as the executor does)
//	                  (all single-threaded: the serial cost of the executor's primitives)
//
// Once: poly3 (polynomial.Evaluator on a degree-3 monomial polynomial at the top level),
// encrypt, decrypt, keygen_galois (one Galois key, top level), keygen_relin,
// key_read_file (the key store's read of a key file into a new key, readKeyFile: one read
// into one allocation, from the page cache, cycling through the block's key files:
// key_read_keys of them; before 2026-11-26 GaloisKey.ReadFrom through a 1 MiB buffer) and
// key_unmarshal (GaloisKey.UnmarshalBinary from memory).
func Calibrate(paramsJSON string, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	defer releaseMemory()
	return calibrate(paramsJSON, optionsJSON)
}

type calibrateOptions struct {
	Repeat     int   `json:"repeat"`
	HoistBatch int   `json:"hoist_batch"`
	Levels     []int `json:"levels"`
	// Bootstrapping presets: how many timed bootstraps (default min(repeat, 3)), or none.
	BootstrapRepeat int  `json:"bootstrap_repeat"`
	NoBootstrap     bool `json:"no_bootstrap"`
	// Only the encodings (encode, encode_pair, encode_lattigo per level): no keys, no
	// bootstrap (calibrate --encodings-only merges them into a table)
	EncodingsOnly bool `json:"encodings_only"`
	// Clock: "cpu" (default: the thread's CPU time) or "wall"
	Clock string `json:"clock"`
	commonOptions
}

type timing struct {
	Median  float64   `json:"median"`
	Samples []float64 `json:"samples"`
}

type calibration struct {
	LogN           int                          `json:"log_n"`
	Slots          int                          `json:"slots"`
	MaxLevel       int                          `json:"max_level"`
	Levels         []int                        `json:"levels"`
	Repeat         int                          `json:"repeat"`
	HoistBatch     int                          `json:"hoist_batch"`
	BlockKeys      int                          `json:"block_keys"`
	KeyReadKeys    int                          `json:"key_read_keys"`
	GoVersion      string                       `json:"go_version"`
	LattigoVersion string                       `json:"lattigo_version"`
	ProductKernel  string                       `json:"product_kernel"`
	GOOS           string                       `json:"goos"`
	GOARCH         string                       `json:"goarch"`
	NumCPU         int                          `json:"num_cpu"`
	GOMAXPROCS     int                          `json:"gomaxprocs"`
	GaloisKeyBytes int                          `json:"galois_key_bytes"`
	RelinKeyBytes  int                          `json:"relin_key_bytes"`
	CtBytesTop     int                          `json:"ciphertext_bytes_top"`
	EncodingPrec   uint                         `json:"encoding_precision_bits"`
	Clock          string                       `json:"clock"`
	PerLevel       map[string]map[string]timing `json:"per_level"`
	Once           map[string]timing            `json:"once"`
	TotalSeconds   float64                      `json:"total_seconds"`
	// Bootstrapping presets (once["bootstrap"] is the timing; see calibrateBootstrap).
	Boot *bootCalibration `json:"boot,omitempty"`
}

type bootCalibration struct {
	Literal            string    `json:"literal"`
	KeygenSeconds      float64   `json:"keygen_seconds"`
	MatrixSeconds      float64   `json:"matrix_seconds"`
	EvaluationKeyBytes int       `json:"evaluation_key_bytes"`
	MatrixBytes        int64     `json:"matrix_bytes"`
	GaloisKeys         int       `json:"galois_keys"`
	InputLevel         int       `json:"input_level"`
	OutputLevel        int       `json:"output_level"`
	MaxAbsError        []float64 `json:"max_abs_error"`
	PeakRSSBytes       int64     `json:"peak_rss_bytes"`
	// One more bootstrap under heapPeakDuring (memstat.go): its temporaries (the heap's
	// peak above its start, with the copy of the input and the output), and the bytes it
	// allocated in all, which become garbage (the process model, lattigo_memory.py).
	TransientBytes int64  `json:"transient_bytes"`
	AllocBytes     uint64 `json:"alloc_bytes"`
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// threadCPUSeconds is the calling OS thread's CPU time (clock_gettime
// CLOCK_THREAD_CPUTIME_ID: nanosecond resolution, unlike getrusage's scheduler ticks).
func threadCPUSeconds() float64 { return clockSeconds(3) }

// clockSeconds reads clock_gettime(clock) (2: process CPU time, 3: thread CPU time).
func clockSeconds(clock uintptr) float64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clock, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// measureClock: "cpu" (default) times the calibrating thread's CPU time, which a shared,
// loaded machine does not inflate; "wall" times elapsed time.
var measureClock = "cpu"

// measureWarmup is the thread CPU time measure spends running fn untimed before timing
// it: a primitive timed cold (one warm-up call) was measured up to 1.6x slower than the
// same primitive in the middle of a long evaluation (n13 giant step: 4.2 ms cold, 2.7 ms
// warm; processor caches, TLB and clock ramp), and evaluations are long streams of
// primitives.
const measureWarmup = 0.1

// measure runs fn untimed (at least once, until measureWarmup seconds of thread CPU time),
// then `repeat` times timed (see measureClock).
func measure(repeat int, fn func() error) (timing, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for c0, i := threadCPUSeconds(), 0; i < 1 || (threadCPUSeconds()-c0 < measureWarmup && i < 10000); i++ {
		if err := fn(); err != nil {
			return timing{}, err
		}
	}
	return timedSamples(repeat, func() (func() error, error) { return fn, nil })
}

// timedSamples times repeat samples; before each, prepare does any untimed work and returns
// the operation to time (the caller holds its OS thread).
func timedSamples(repeat int, prepare func() (func() error, error)) (timing, error) {
	var tm timing
	for i := 0; i < repeat; i++ {
		fn, err := prepare()
		if err != nil {
			return timing{}, err
		}
		s, err := timeOnce(fn)
		if err != nil {
			return timing{}, err
		}
		tm.Samples = append(tm.Samples, s)
	}
	tm.Median = median(tm.Samples)
	return tm, nil
}

// timeOnce runs fn once and returns its seconds on measureClock (the caller holds its OS
// thread).
func timeOnce(fn func() error) (float64, error) {
	t, c := time.Now(), threadCPUSeconds()
	if err := fn(); err != nil {
		return 0, err
	}
	if measureClock == "wall" {
		return time.Since(t).Seconds(), nil
	}
	return threadCPUSeconds() - c, nil
}

func calibrate(paramsJSON string, optionsJSON string) (string, error) {
	t0 := time.Now()
	opt := calibrateOptions{}
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	if opt.Repeat == 0 {
		opt.Repeat = 5
	}
	if opt.HoistBatch == 0 {
		opt.HoistBatch = 8
	}
	switch opt.Clock {
	case "", "cpu":
		measureClock = "cpu"
	case "wall":
		measureClock = "wall"
	default:
		return "", fmt.Errorf("options: clock must be \"cpu\" or \"wall\", got %q", opt.Clock)
	}
	if opt.Repeat < 1 || opt.Repeat > 1000 {
		return "", fmt.Errorf("options: repeat must be in 1..1000, got %d", opt.Repeat)
	}
	var pp planParams
	if err := json.Unmarshal([]byte(paramsJSON), &pp); err != nil {
		return "", fmt.Errorf("params are not valid JSON: %w", err)
	}
	setup, err := pp.setup()
	if err != nil {
		return "", err
	}
	// A bootstrapping preset is timed on the bootstrapping parameters (where its plans run),
	// at the residual levels.
	params := setup.params
	slots, top := params.MaxSlots(), setup.top
	if opt.HoistBatch < 2 || opt.HoistBatch >= slots {
		return "", fmt.Errorf("options: hoist_batch must be in 2..%d, got %d", slots-1, opt.HoistBatch)
	}
	levels := opt.Levels
	if len(levels) == 0 {
		levels = []int{top, top / 2, 0}
	}
	seen := map[int]bool{}
	var lv []int
	for _, l := range levels {
		if l < 0 || l > top {
			return "", fmt.Errorf("options: levels must be in 0..%d, got %d", top, l)
		}
		if !seen[l] {
			seen[l] = true
			lv = append(lv, l)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(lv)))

	cal := &calibration{
		LogN: params.LogN(), Slots: slots, MaxLevel: top, Levels: lv, Repeat: opt.Repeat,
		HoistBatch: opt.HoistBatch, GoVersion: runtime.Version(), LattigoVersion: LattigoVersion,
		ProductKernel: ProductKernelName(),
		GOOS:          runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		PerLevel: map[string]map[string]timing{}, Once: map[string]timing{},
		CtBytesTop:   ckks.NewCiphertext(params, 1, top).BinarySize(),
		EncodingPrec: params.EncodingPrecision(), Clock: measureClock,
	}
	c := newSetupClient(setup)
	rng := rand.New(rand.NewSource(1))
	randVec := func() []float64 {
		v := make([]float64, slots)
		for i := range v {
			v[i] = 2*rng.Float64() - 1
		}
		return v
	}

	if opt.EncodingsOnly {
		ecd := ckks.NewEncoder(params)
		vals := randVec()
		for _, l := range lv {
			m := map[string]timing{}
			if err := measureEncodings(params, ecd, l, opt.Repeat, vals, randVec(), m); err != nil {
				return "", err
			}
			cal.PerLevel[fmt.Sprint(l)] = m
		}
		cal.TotalSeconds = time.Since(t0).Seconds()
		out, err := json.Marshal(cal)
		return string(out), err
	}

	// Keys: offsets 1..B (top level, serve all levels); each generation is a keygen sample.
	levelQ, levelP := top, params.MaxLevelP()
	evkParams := rlwe.EvaluationKeyParameters{LevelQ: &levelQ, LevelP: &levelP}
	ks := make([]int, opt.HoistBatch)
	var gks []*rlwe.GaloisKey
	var kg timing
	for i := range ks {
		ks[i] = i + 1
		t := time.Now()
		gks = append(gks, c.kgen.GenGaloisKeyNew(params.GaloisElement(ks[i]), c.sk, evkParams))
		kg.Samples = append(kg.Samples, time.Since(t).Seconds())
	}
	for len(kg.Samples) < opt.Repeat {
		t := time.Now()
		_ = c.kgen.GenGaloisKeyNew(params.GaloisElement(1), c.sk, evkParams)
		kg.Samples = append(kg.Samples, time.Since(t).Seconds())
	}
	kg.Median = median(kg.Samples)
	cal.Once["keygen_galois"] = kg
	cal.GaloisKeyBytes = gks[0].BinarySize()
	var rlk *rlwe.RelinearizationKey
	if cal.Once["keygen_relin"], err = measure(opt.Repeat, func() error {
		rlk = c.kgen.GenRelinearizationKeyNew(c.sk, evkParams)
		return nil
	}); err != nil {
		return "", err
	}
	cal.RelinKeyBytes = rlk.BinarySize()
	// The fused block's primitives are timed with as many keys (and as many baby outputs)
	// as a large block touches, so that they leave the caches as a block's do: with the
	// hoist batch's 8 keys at log N 13 (21 MB) keys and babies stayed in the 32 MiB L3 and
	// the block primitives read 12-35% under the executor's phases (docs/lattigo.md).
	bks := blockOffsets(len(ks), cal.GaloisKeyBytes)
	for _, k := range bks[len(ks):] {
		gks = append(gks, c.kgen.GenGaloisKeyNew(params.GaloisElement(k), c.sk, evkParams))
	}
	cal.BlockKeys = len(bks)
	eval := ckks.NewEvaluator(params, rlwe.NewMemEvaluationKeySet(rlk, gks...))
	ecd := ckks.NewEncoder(params)

	// Key loading: the block's key files (page cache), read in turn into fresh keys as the
	// key store does, and one in-memory blob. One key read over and over stays in the L3 (a
	// log N 14 key is 7.9 MB); the block's keys reach blockWorkingSetBytes. Timed on one
	// core in thread CPU time, this still reads slower than the key store's background
	// reader in keymeasure (n14boot: 1.24 against 0.43 ms/MB, docs/cli.md).
	dir, err := os.MkdirTemp("", "slotlattigo-calibrate-")
	if err != nil {
		return "", fmt.Errorf("cannot create a temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	keyPaths := make([]string, len(bks))
	for i := range bks {
		keyPaths[i] = filepath.Join(dir, fmt.Sprintf("rot_%d.key", i))
		if err = writeKeyFile(keyPaths[i], gks[i]); err != nil {
			return "", err
		}
	}
	cal.KeyReadKeys = len(keyPaths)
	next := 0
	shape := shapeOf(params.N(), params.QCount(), params.PCount())
	if cal.Once["key_read_file"], err = measure(opt.Repeat, func() error {
		path := keyPaths[next%len(keyPaths)]
		next++
		if lattigoKeyReader() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = new(rlwe.GaloisKey).ReadFrom(bufio.NewReaderSize(f, 1<<20))
			return err
		}
		_, err := readKeyFile(path, new(rlwe.GaloisKey), shape)
		return err
	}); err != nil {
		return "", fmt.Errorf("key_read_file: %w", err)
	}
	blob, err := gks[0].MarshalBinary()
	if err != nil {
		return "", err
	}
	if cal.Once["key_unmarshal"], err = measure(opt.Repeat, func() error {
		return new(rlwe.GaloisKey).UnmarshalBinary(blob)
	}); err != nil {
		return "", fmt.Errorf("key_unmarshal: %w", err)
	}
	blob = nil

	// Client-side operations at the top level.
	vals := randVec()
	ptTop := ckks.NewPlaintext(params, top)
	if err = ecd.Encode(vals, ptTop); err != nil {
		return "", err
	}
	var ctTop *rlwe.Ciphertext
	if cal.Once["encrypt"], err = measure(opt.Repeat, func() error {
		var err error
		ctTop, err = c.enc.EncryptNew(ptTop)
		return err
	}); err != nil {
		return "", fmt.Errorf("encrypt: %w", err)
	}
	if cal.Once["decrypt"], err = measure(opt.Repeat, func() error {
		_ = c.dec.DecryptNew(ctTop)
		return nil
	}); err != nil {
		return "", fmt.Errorf("decrypt: %w", err)
	}
	if top >= 2 {
		polyEval := polynomial.NewEvaluator(params, eval)
		poly := bignum.NewPolynomial(bignum.Monomial, []float64{0.1, 0.5, 0.25, 0.125}, nil)
		if cal.Once["poly3"], err = measure(opt.Repeat, func() error {
			_, err := polyEval.Evaluate(ctTop, poly, params.DefaultScale())
			return err
		}); err != nil {
			return "", fmt.Errorf("poly3: %w", err)
		}
	}

	for _, l := range lv {
		m := map[string]timing{}
		key := fmt.Sprint(l)
		pt := ckks.NewPlaintext(params, l)
		if err = measureEncodings(params, ecd, l, opt.Repeat, vals, randVec(), m); err != nil {
			return "", err
		}
		if err = ecd.Encode(vals, pt); err != nil {
			return "", err
		}
		a, err := c.enc.EncryptNew(pt)
		if err != nil {
			return "", err
		}
		pt2 := ckks.NewPlaintext(params, l)
		if err = ecd.Encode(randVec(), pt2); err != nil {
			return "", err
		}
		b, err := c.enc.EncryptNew(pt2)
		if err != nil {
			return "", err
		}
		out := ckks.NewCiphertext(params, 1, l)
		if m["rotate"], err = measure(opt.Repeat, func() error { return eval.Rotate(a, 1, out) }); err != nil {
			return "", fmt.Errorf("rotate at level %d: %w", l, err)
		}
		outs1 := map[int]*rlwe.Ciphertext{1: ckks.NewCiphertext(params, 1, l)}
		if m["rotate_hoisted_1"], err = measure(opt.Repeat, func() error { return eval.RotateHoisted(a, ks[:1], outs1) }); err != nil {
			return "", fmt.Errorf("rotate_hoisted_1 at level %d: %w", l, err)
		}
		outsB := map[int]*rlwe.Ciphertext{}
		for _, k := range ks {
			outsB[k] = ckks.NewCiphertext(params, 1, l)
		}
		if m[fmt.Sprintf("rotate_hoisted_%d", opt.HoistBatch)], err = measure(opt.Repeat, func() error {
			return eval.RotateHoisted(a, ks, outsB)
		}); err != nil {
			return "", fmt.Errorf("rotate_hoisted_%d at level %d: %w", opt.HoistBatch, l, err)
		}
		// pmul: plaintext encoded beforehand at scale q_l, as the executor does.
		ptm := ckks.NewPlaintext(params, l)
		ptm.Scale = rlwe.NewScale(params.Q()[l])
		if err = ecd.Encode(randVec(), ptm); err != nil {
			return "", err
		}
		if m["pmul"], err = measure(opt.Repeat, func() error { return eval.Mul(a, ptm, out) }); err != nil {
			return "", fmt.Errorf("pmul at level %d: %w", l, err)
		}
		if m["add"], err = measure(opt.Repeat, func() error { return eval.Add(a, b, out) }); err != nil {
			return "", fmt.Errorf("add at level %d: %w", l, err)
		}
		if m["cmul_relin"], err = measure(opt.Repeat, func() error { return eval.MulRelin(a, b, out) }); err != nil {
			return "", fmt.Errorf("cmul_relin at level %d: %w", l, err)
		}
		// a sum of ct-ct products relinearised once (relin.go): one tensor product
		// accumulated in degree 2, and the relinearisation of the sum
		acc2 := ckks.NewCiphertext(params, 2, l)
		acc2.Scale = a.Scale.Mul(b.Scale)
		if m["cmul_tensor"], err = measure(opt.Repeat, func() error { return eval.MulThenAdd(a, b, acc2) }); err != nil {
			return "", fmt.Errorf("cmul_tensor at level %d: %w", l, err)
		}
		if m["relin"], err = measure(opt.Repeat, func() error { return eval.Relinearize(acc2, out) }); err != nil {
			return "", fmt.Errorf("relin at level %d: %w", l, err)
		}
		if l >= 1 {
			prod := ckks.NewCiphertext(params, 1, l)
			if err = eval.Mul(a, ptm, prod); err != nil {
				return "", err
			}
			res := ckks.NewCiphertext(params, 1, l-1)
			if m["rescale"], err = measure(opt.Repeat, func() error { return eval.Rescale(prod, res) }); err != nil {
				return "", fmt.Errorf("rescale at level %d: %w", l, err)
			}
		}
		if err = calibrateBlock(params, eval, a, bks, opt.Repeat, m); err != nil {
			return "", fmt.Errorf("fused block at level %d: %w", l, err)
		}
		cal.PerLevel[key] = m
	}
	if setup.btp != nil && !opt.NoBootstrap {
		// Free this part's keys and evaluator first: the bootstrapping block is large.
		gks, rlk, eval = nil, nil, nil
		releaseMemory()
		if err = calibrateBootstrap(cal, c, opt, randVec); err != nil {
			return "", err
		}
	}
	cal.TotalSeconds = time.Since(t0).Seconds()
	data, err := json.Marshal(cal)
	if err != nil {
		return "", fmt.Errorf("cannot encode the result: %w", err)
	}
	return string(data), nil
}

// calibrateBootstrap times one bootstrap (Lattigo's Evaluator.Bootstrap of a ciphertext at
// level 0 holding a random vector in [-1, 1]) after one untimed warm-up, and records the key
// generation and DFT matrix encoding times, the block's sizes, each run's max abs error and
// the memory one bootstrap holds and allocates (heapPeakDuring).
// measureEncodings times, at level l, the executor's encoding of one vector (encode.go:
// Lattigo's, bit for bit, without its 2N small allocations per polynomial), of two real
// vectors together (encode_pair: embedPair, encode_pair.go, as streamed blocks encode their
// diagonals; the time of the pair) and Lattigo's own encoding for comparison.
//
// Each sample encodes into buffers of its own (measureFresh): at log N 16 a prime's row is
// 512 KiB, the size of this machine's L2, and the NTTs' time depends on where the buffers
// landed: timed in one set of buffers, level 9's encode read 17.3, 23.9 and 25.8 ms in
// three runs of 9 samples, each run's samples within a few percent of each other.
func measureEncodings(params ckks.Parameters, ecd *ckks.Encoder, l, repeat int, vals, vals2 []float64, m map[string]timing) error {
	var err error
	if m["encode"], err = measureFresh(repeat, func() func() error {
		pt := ckks.NewPlaintext(params, l)
		emb := newEmbedder(params, ecd)
		return func() error { return emb.encode(vals, pt) }
	}); err != nil {
		return fmt.Errorf("encode at level %d: %w", l, err)
	}
	if params.RingType() == ring.Standard && params.EncodingPrecision() <= 53 {
		md := &rlwe.MetaData{}
		md.Scale = params.DefaultScale()
		md.LogDimensions = params.LogMaxDimensions()
		md.IsBatched, md.IsNTT = true, true
		if m["encode_pair"], err = measureFresh(repeat, func() func() error {
			rq := params.RingQ().AtLevel(l)
			p1, p2 := ringqp.Poly{Q: rq.NewPoly()}, ringqp.Poly{Q: rq.NewPoly()}
			emb := newEmbedder(params, ecd)
			return func() error {
				if !emb.embedPair(vals, vals2, md, p1, p2) {
					return fmt.Errorf("the pair path refused two random vectors")
				}
				return nil
			}
		}); err != nil {
			return fmt.Errorf("encode_pair at level %d: %w", l, err)
		}
	}
	if m["encode_lattigo"], err = measureFresh(repeat, func() func() error {
		pt := ckks.NewPlaintext(params, l)
		return func() error { return ecd.Encode(vals, pt) }
	}); err != nil {
		return fmt.Errorf("encode_lattigo at level %d: %w", l, err)
	}
	if params.EncodingPrecision() > 53 {
		// ckks.NewEncoder(params) encodes with big floats when log_scale > 53; a
		// complex128 encoder (precision 53) is what float64 inputs need.
		ecd53 := ckks.NewEncoder(params, 53)
		if m["encode_prec53"], err = measureFresh(repeat, func() func() error {
			pt := ckks.NewPlaintext(params, l)
			return func() error { return ecd53.Encode(vals, pt) }
		}); err != nil {
			return fmt.Errorf("encode_prec53 at level %d: %w", l, err)
		}
	}
	return nil
}

// measureFresh is measure with each sample's own buffers: setup allocates them and returns
// the operation; each sample runs it once untimed (first touch) and once timed, after a
// collection (the previous sample's buffers and encode_lattigo's garbage otherwise have
// the collector run on this thread inside the timing: GOMAXPROCS 1, the thread's clock).
func measureFresh(repeat int, setup func() func() error) (timing, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return timedSamples(repeat, func() (func() error, error) {
		fn := setup()
		if err := fn(); err != nil {
			return nil, err
		}
		runtime.GC()
		return fn, nil
	})
}

func calibrateBootstrap(cal *calibration, c *client, opt calibrateOptions, randVec func() []float64) error {
	n := opt.BootstrapRepeat
	if n == 0 {
		n = min(opt.Repeat, 3)
	}
	if n < 1 || n > 100 {
		return fmt.Errorf("options: bootstrap_repeat must be in 1..100, got %d", n)
	}
	bc := &bootCalibration{Literal: c.boot.Literal}
	// The DFT matrices are timed as the executor encodes them (loadBlock -> buildBootState,
	// newBootEvaluator): under stand-in keys, before any key is in memory. Timed after the
	// key generation instead (bootstrapping.NewEvaluator beside 7.3 GiB of live keys), the
	// n16boot set took 44.4 s on a Zen 4 host whose runs encoded it at half that rate per
	// byte (session 32: the plan's four sets, 6.95 GB, in 54.6 s): the collector marks the
	// live keys at every cycle the encoder's allocations start.
	releaseMemory()
	t := time.Now()
	ev, err := newBootEvaluator(*c.btp, bootKeyInfo(*c.btp).galEls)
	if err != nil {
		return err
	}
	releaseMemory() // the encoder's temporaries, as buildBootState does
	bc.MatrixSeconds = time.Since(t).Seconds()
	bc.MatrixBytes = matrixBytes(ev)
	t = time.Now()
	evk, skN2, err := c.btp.GenEvaluationKeys(c.skN1)
	if err != nil {
		return fmt.Errorf("bootstrapping key generation: %w", err)
	}
	if !skN2.Equal(c.sk) {
		return fmt.Errorf("bootstrapping key generation used another secret than the client's")
	}
	bc.KeygenSeconds = time.Since(t).Seconds()
	bc.EvaluationKeyBytes = evk.BinarySize()
	bc.GaloisKeys = len(evk.GaloisKeys)
	setBootKeys(ev, evk, nil) // (the matrices stay)
	vals := randVec()
	pt := ckks.NewPlaintext(c.params, 0)
	if err = c.ecd.Encode(vals, pt); err != nil {
		return err
	}
	ct, err := c.enc.EncryptNew(pt)
	if err != nil {
		return err
	}
	var last *rlwe.Ciphertext
	tm, err := measure(n, func() error {
		out, _, err := bootstrapCt(ev, ct, 1)
		if err != nil {
			return err
		}
		got, err := c.decrypt(out)
		if err != nil {
			return err
		}
		e := 0.0
		for i := range got {
			e = math.Max(e, math.Abs(got[i]-vals[i]))
		}
		bc.MaxAbsError = append(bc.MaxAbsError, e)
		last = out
		return nil
	})
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	bc.InputLevel, bc.OutputLevel = ct.Level(), last.Level()
	bc.PeakRSSBytes = peakRSS()
	last = nil
	if bc.TransientBytes, bc.AllocBytes, err = heapPeakDuring(func() error {
		_, _, err := bootstrapCt(ev, ct, 1)
		return err
	}); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	cal.Once["bootstrap"] = tm
	cal.Boot = bc
	return nil
}

// calibrateBlock times the primitives of a fused block (fused.go) at ct's level, one
// goroutine, with the same Lattigo calls the executor makes, in sequences as a block runs
// them: the baby rotations and the giant steps cycle through the keys of ks (one key per
// step and one baby output per key, as in a block; blockOffsets), the products stream
// ~96 MiB of distinct plaintexts against the babies in turn and reduce the accumulators
// as often as the executor does (every QiOverflowMargin/2 products).
func calibrateBlock(params ckks.Parameters, eval *ckks.Evaluator, ct *rlwe.Ciphertext, ks []int, repeat int, m map[string]timing) error {
	levelQ, levelP := ct.Level(), params.MaxLevelP()
	ringQP := params.RingQP().AtLevel(levelQ, levelP)
	ringQ := ringQP.RingQ
	rqp := params.RingQP()
	decomp := make([]ringqp.Poly, params.BaseRNSDecompositionVectorSize(params.MaxLevel(), levelP))
	for i := range decomp {
		decomp[i] = rqp.NewPoly()
	}
	pc0, pc1 := ringQ.NewPoly(), ringQ.NewPoly()
	acc0, acc1 := rqp.NewPoly(), rqp.NewPoly()
	out := ckks.NewCiphertext(params, 1, levelQ)
	pBig := params.RingP().AtLevel(levelP).ModulusAtLevel[levelP]
	var err error
	// block_base: the decomposition of the base's c1 and P*c0, P*c1 (once per base: the
	// executor shares them between the blocks on one ciphertext); block_finish: the two
	// ModDowns that end every block; block_fixed: both (tables before block_base)
	if m["block_base"], err = measure(repeat, func() error {
		eval.DecomposeNTT(levelQ, levelP, levelP+1, ct.Value[1], ct.IsNTT, decomp)
		ringQ.MulScalarBigint(ct.Value[0], pBig, pc0)
		ringQ.MulScalarBigint(ct.Value[1], pBig, pc1)
		return nil
	}); err != nil {
		return err
	}
	if m["block_finish"], err = measure(repeat, func() error {
		eval.ModDownQPtoQNTT(levelQ, levelP, acc0.Q, acc0.P, out.Value[0])
		eval.ModDownQPtoQNTT(levelQ, levelP, acc1.Q, acc1.P, out.Value[1])
		return nil
	}); err != nil {
		return err
	}
	if m["block_fixed"], err = measure(repeat, func() error {
		eval.DecomposeNTT(levelQ, levelP, levelP+1, ct.Value[1], ct.IsNTT, decomp)
		ringQ.MulScalarBigint(ct.Value[0], pBig, pc0)
		ringQ.MulScalarBigint(ct.Value[1], pBig, pc1)
		eval.ModDownQPtoQNTT(levelQ, levelP, acc0.Q, acc0.P, out.Value[0])
		eval.ModDownQPtoQNTT(levelQ, levelP, acc1.Q, acc1.P, out.Value[1])
		return nil
	}); err != nil {
		return err
	}
	baby := rlwe.NewElementExtended(params, 1, levelQ, levelP)
	babies := make([]*rlwe.Element[ringqp.Poly], len(ks))
	for i := range babies {
		babies[i] = rlwe.NewElementExtended(params, 1, levelQ, levelP)
	}
	galEl := params.GaloisElement(1)
	tb, err := measure(repeat, func() error {
		for i, k := range ks {
			if err := hoistedBaby(eval, params, ct, decomp, pc0, params.GaloisElement(k), babies[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	m["block_baby"] = perStep(tb, len(ks))
	if err = hoistedBaby(eval, params, ct, decomp, pc0, galEl, baby); err != nil {
		return err
	}
	// distinct plaintexts (as in a block: each product streams its own from memory, the
	// plaintexts of a dense block do not fit the caches): ~96 MiB of them, 16..512
	ptBytes := (levelQ + levelP + 2) * params.N() * 8
	batch := min(512, max(16, (96<<20+ptBytes-1)/ptBytes))
	pts := make([]ringqp.Poly, batch)
	for j := range pts {
		pts[j] = ringQP.NewPoly()
		for i := range pts[j].Q.Coeffs {
			copy(pts[j].Q.Coeffs[i], baby.Value[j%2].Q.Coeffs[i])
		}
		ringQP.RingQ.Reduce(pts[j].Q, pts[j].Q) // plaintexts are reduced (product.go)
	}
	// each product reads its own plaintext and the next baby, as a block's products do
	prods := newQPProducts(ringQP) // the executor's kernel (product.go)
	tm, err := measure(repeat, func() error {
		for j := range batch {
			b := babies[j%len(babies)]
			prods.mulAdd(pts[j], b.Value[0], b.Value[1], acc0, acc1, j == 0)
			prods.afterTerm(j, acc0, acc1)
		}
		prods.finish(acc0, acc1)
		return nil
	})
	if err != nil {
		return err
	}
	m["block_product"] = perStep(tm, batch)
	// Q-mode blocks (fused.go: evalFusedQ)
	q := rlwe.NewCiphertext(params, 1, levelQ)
	if m["block_baby_q"], err = measure(repeat, func() error {
		eval.ModDownQPtoQNTT(levelQ, levelP, baby.Value[0].Q, baby.Value[0].P, q.Value[0])
		eval.ModDownQPtoQNTT(levelQ, levelP, baby.Value[1].Q, baby.Value[1].P, q.Value[1])
		return nil
	}); err != nil {
		return err
	}
	if m["block_q"], err = measure(repeat, func() error {
		ringQ.Reduce(q.Value[0], q.Value[0])
		ringQ.Reduce(q.Value[1], q.Value[1])
		return nil
	}); err != nil {
		return err
	}
	tq, err := measure(repeat, func() error {
		for j := range batch {
			prods.q.mulAdd(pts[j].Q, out.Value[0], out.Value[1], acc0.Q, acc1.Q, j == 0)
			prods.q.afterTerm(j, acc0.Q, acc1.Q)
		}
		prods.q.finish(acc0.Q, acc1.Q)
		return nil
	})
	if err != nil {
		return err
	}
	m["block_product_q"] = perStep(tq, batch)
	cQP := &rlwe.Element[ringqp.Poly]{Value: []ringqp.Poly{rqp.NewPoly(), rqp.NewPoly()}, MetaData: &rlwe.MetaData{}}
	cQP.IsNTT = true
	tmp0, tmp1 := rqp.NewPoly(), rqp.NewPoly()
	tmp0.CopyLvl(levelQ, levelP, baby.Value[0])
	tg, err := measure(repeat, func() error {
		for i, k := range ks {
			galEl := params.GaloisElement(k)
			evk, err := eval.CheckAndGetGaloisKey(galEl)
			if err != nil {
				return err
			}
			idx := eval.AutomorphismIndex(galEl)
			tmp1.CopyLvl(levelQ, levelP, babies[i].Value[1])
			eval.ModDownQPtoQNTT(levelQ, levelP, tmp1.Q, tmp1.P, tmp1.Q)
			if err := eval.GadgetProductLazy(levelQ, tmp1.Q, &evk.GadgetCiphertext, cQP); err != nil {
				return err
			}
			ringQP.Add(cQP.Value[0], tmp0, cQP.Value[0])
			ringQP.AutomorphismNTTWithIndexThenAddLazy(cQP.Value[0], idx, acc0)
			ringQP.AutomorphismNTTWithIndexThenAddLazy(cQP.Value[1], idx, acc1)
			ringQP.RingQ.Reduce(acc0.Q, acc0.Q)
			ringQP.RingQ.Reduce(acc1.Q, acc1.Q)
			ringQP.RingP.Reduce(acc0.P, acc0.P)
			ringQP.RingP.Reduce(acc1.P, acc1.P)
		}
		return nil
	})
	m["block_giant"] = perStep(tg, len(ks))
	return err
}

// Limits of the block calibration's working set (blockOffsets).
const (
	// blockWorkingSetBytes: the Galois keys a calibrated block cycles through, at least;
	// 8x the 32 MiB L3 of the machines we calibrate on, so keys come from memory as in a
	// large block (63 babies of a 2048-diagonal block at log N 13 read 165 MB of keys).
	blockWorkingSetBytes = 256 << 20
	// blockMaxKeys: the most keys (and baby outputs) generated for it: a large block's
	// baby count (n1 = 64); at log N 13 that is 168 MB of keys and 42 MB of babies.
	blockMaxKeys = 64
)

// blockOffsets returns the rotation offsets a calibrated block cycles through: 1..n with
// n the fewest keys of keyBytes that reach blockWorkingSetBytes, within
// [hoistBatch, blockMaxKeys].
func blockOffsets(hoistBatch int, keyBytes int) []int {
	n := (blockWorkingSetBytes + keyBytes - 1) / max(1, keyBytes)
	n = max(hoistBatch, min(blockMaxKeys, n))
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// perStep divides a timing of n steps by n.
func perStep(t timing, n int) timing {
	out := timing{Median: t.Median / float64(n)}
	for _, s := range t.Samples {
		out.Samples = append(out.Samples, s/float64(n))
	}
	return out
}
