package slotlattigo

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/lintrans"
	ltcommon "github.com/tuneinsight/lattigo/v6/circuits/common/lintrans"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// DefaultLogBSGSRatio is the LogBabyStepGiantStepRatio LintransMatvec uses unless told
// otherwise: 1, the value of Lattigo's own CKKS tutorial (examples/singleparty/tutorials/
// ckks) and of its bootstrapping defaults (circuits/ckks/bootstrapping: LogBSGSRatio 1).
// 0 minimises the number of keys; larger values trade keys for fewer giant steps;
// negative disables BSGS (one hoisted rotation per diagonal).
const DefaultLogBSGSRatio = 1

// LintransMatvec is the baseline a Lattigo user would write for y = W x with a plaintext
// matrix W (n x k) and an encrypted vector x (k): Lattigo's circuits/ckks/lintrans
// (baby-step giant-step with double hoisting), with only the Galois keys that
// lintrans.GaloisElements lists.
//
//   - matrix: W row-major as little-endian float64 (n*k values); vec: x (k values).
//   - paramsJSON: a plan's "params" object (log_n, log_q, log_p, log_scale).
//   - optionsJSON: "" or {"log_bsgs_ratio": int (default DefaultLogBSGSRatio),
//     "dimension": d (0 = auto), "level": ciphertext level (default the top level),
//     "repeat": evaluations to time (default 1; the median is reported),
//     "memory_limit_bytes": Go soft memory limit during the call (0: unchanged)}.
//
// Packing. lintrans evaluates a d x d matrix M given by its diagonals
// diag_i[r] = M[r, (r+i) mod d] on a ciphertext whose slots it rotates cyclically modulo
// d = 2^LogDimensions.Cols. W is embedded in the top-left corner of M (zeros elsewhere) and
// x fills the first k entries of a length-d vector (zeros after). Lintrans needs that
// vector to repeat with period d over the ciphertext's slots; for d < slots this is
// Lattigo's sparse packing (plaintexts encoded with LogDimensions.Cols = log2 d, which the
// encoder replicates slots/d times), for d = slots nothing is replicated. By default d is
// the smallest power of two >= max(n, k) (fewest diagonals: at most d instead of the
// n+k-1 of a slots x slots embedding); "dimension" forces another power of two in
// [max(n, k), slots].
//
// The transform is encoded at the ciphertext's level with scale q_level and the result is
// rescaled once, so y comes back at the default scale one level down.
//
// Result JSON: "output" (base64 of y, n little-endian float64), and "stats":
// eval_seconds (median of lintrans Evaluate + the one Rescale), evaluate_seconds,
// rescale_seconds, eval_seconds_runs, encode_seconds (the diagonals), keygen_seconds,
// encrypt_seconds, decrypt_seconds, galois_keys, galois_elements, key_bytes (all keys),
// galois_key_bytes (one key), diagonals, dimension, n1 (baby-step size), baby_rotations
// (hoisted, lazy: one per non-zero baby offset), giant_rotations (one key switch per
// non-zero giant offset), rotations (their sum), log_bsgs_ratio, level, transform_bytes
// (the encoded diagonals), slots.
func LintransMatvec(paramsJSON string, matrix []byte, n, k int, vec []byte, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	defer releaseMemory()
	return lintransMatvec(paramsJSON, matrix, n, k, vec, optionsJSON)
}

type lintransOptions struct {
	LogBSGSRatio *int `json:"log_bsgs_ratio"`
	Dimension    int  `json:"dimension"`
	Level        *int `json:"level"`
	Repeat       int  `json:"repeat"`
	// Embedding: "square" (default: W in the corner of a d x d matrix), "hybrid"
	// (GAZELLE's hybrid diagonals for a rectangular W, see hybridEmbedding) or
	// "interleaved" (slotplan's row-interleaved hybrid diagonals over all slots, any shape,
	// see interleavedEmbedding).
	Embedding string `json:"embedding"`
	// CPUProfile: write a Go CPU profile (pprof) of the timed runs to this file.
	CPUProfile string `json:"cpu_profile"`
	commonOptions
	// MemoryLimitBytes: see benchPlanOptions.
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
}

type lintransStats struct {
	Slots           int       `json:"slots"`
	Embedding       string    `json:"embedding"`
	FoldRotations   int       `json:"fold_rotations"`
	FoldSeconds     float64   `json:"fold_seconds"`
	N               int       `json:"n"`
	K               int       `json:"k"`
	Dimension       int       `json:"dimension"`
	Replication     int       `json:"replication"`
	Level           int       `json:"level"`
	LogBSGSRatio    int       `json:"log_bsgs_ratio"`
	N1              int       `json:"n1"`
	Diagonals       int       `json:"diagonals"`
	GaloisKeys      int       `json:"galois_keys"`
	GaloisElements  []uint64  `json:"galois_elements"`
	GaloisKeyBytes  int       `json:"galois_key_bytes"`
	KeyBytes        int64     `json:"key_bytes"`
	TransformBytes  int64     `json:"transform_bytes"`
	BabyRotations   int       `json:"baby_rotations"`
	GiantRotations  int       `json:"giant_rotations"`
	Rotations       int       `json:"rotations"`
	EncodeSeconds   float64   `json:"encode_seconds"`
	KeygenSeconds   float64   `json:"keygen_seconds"`
	EncryptSeconds  float64   `json:"encrypt_seconds"`
	DecryptSeconds  float64   `json:"decrypt_seconds"`
	EvaluateSeconds float64   `json:"evaluate_seconds"`
	RescaleSeconds  float64   `json:"rescale_seconds"`
	EvalSeconds     float64   `json:"eval_seconds"`
	EvalSecondsRuns []float64 `json:"eval_seconds_runs"`
	CPUSeconds      float64   `json:"cpu_seconds"`
	CPUSecondsRuns  []float64 `json:"cpu_seconds_runs"`
	TotalSeconds    float64   `json:"total_seconds"`
}

func readFloats(what string, data []byte, count int) ([]float64, error) {
	if len(data) != 8*count {
		return nil, fmt.Errorf("%s: expected %d float64 (%d bytes), got %d bytes", what, count, 8*count, len(data))
	}
	v := make([]float64, count)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:]))
		if math.IsNaN(v[i]) || math.IsInf(v[i], 0) {
			return nil, fmt.Errorf("%s: element %d is %v", what, i, v[i])
		}
	}
	return v, nil
}

func lintransMatvec(paramsJSON string, matrix []byte, n, k int, vec []byte, optionsJSON string) (string, error) {
	t0 := time.Now()
	var opt lintransOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	defer withMemoryLimit(opt.MemoryLimitBytes)()
	var pp planParams
	if err := json.Unmarshal([]byte(paramsJSON), &pp); err != nil {
		return "", fmt.Errorf("params are not valid JSON: %w", err)
	}
	params, err := pp.ckksParameters()
	if err != nil {
		return "", err
	}
	slots := params.MaxSlots()
	if n < 1 || k < 1 {
		return "", fmt.Errorf("matrix dimensions must be positive, got %d x %d", n, k)
	}
	if n > slots || k > slots {
		return "", fmt.Errorf("a %d x %d matrix does not fit one ciphertext of %d slots (lintrans needs max(n, k) <= slots)", n, k, slots)
	}
	W, err := readFloats("matrix", matrix, n*k)
	if err != nil {
		return "", err
	}
	x, err := readFloats("vector", vec, k)
	if err != nil {
		return "", err
	}
	ratio := DefaultLogBSGSRatio
	if opt.LogBSGSRatio != nil {
		ratio = *opt.LogBSGSRatio
	}
	if ratio > 16 {
		return "", fmt.Errorf("options: log_bsgs_ratio %d is absurd (use 0..16, or negative for no BSGS)", ratio)
	}
	if opt.Repeat == 0 {
		opt.Repeat = 1
	}
	if opt.Repeat < 1 || opt.Repeat > 1000 {
		return "", fmt.Errorf("options: repeat must be in 1..1000, got %d", opt.Repeat)
	}
	level := params.MaxLevel()
	if opt.Level != nil {
		level = *opt.Level
	}
	if level < 1 || level > params.MaxLevel() {
		return "", fmt.Errorf("options: level must be in 1..%d (one level is consumed), got %d", params.MaxLevel(), level)
	}
	embedding := opt.Embedding
	if embedding == "" {
		embedding = "square"
	}
	if embedding != "square" && embedding != "hybrid" && embedding != "interleaved" {
		return "", fmt.Errorf("options: embedding must be \"square\", \"hybrid\" or \"interleaved\", got %q", embedding)
	}
	d := 1 << bits.Len(uint(max(n, k)-1))
	if opt.Dimension != 0 {
		d = opt.Dimension
		if d < max(n, k) || d > slots || d&(d-1) != 0 {
			return "", fmt.Errorf("options: dimension must be a power of two in [%d, %d], got %d", max(n, k), slots, d)
		}
	}
	if embedding == "interleaved" {
		if opt.Dimension != 0 && opt.Dimension != slots {
			return "", fmt.Errorf("options: the interleaved embedding fills all %d slots (dimension %d)", slots, opt.Dimension)
		}
		d = slots
	}
	logd := bits.Len(uint(d)) - 1
	dims := ring.Dimensions{Rows: 0, Cols: logd}
	var diags lintrans.Diagonals[float64]
	var xs []float64
	var folds []int
	stride := 1 // output row r is read at slot r * stride
	switch embedding {
	case "hybrid":
		diags, xs, folds = hybridEmbedding(W, x, n, k, d)
	case "interleaved":
		diags, xs, folds, stride = interleavedEmbedding(W, x, n, k, slots)
	default:
		diags, xs = squareEmbedding(W, n, k, d), make([]float64, d)
		copy(xs, x)
	}
	if len(diags) == 0 {
		return "", fmt.Errorf("the matrix is all zeros: lintrans has no diagonal to evaluate")
	}
	st := &lintransStats{
		Slots: slots, N: n, K: k, Dimension: d, Replication: slots / d, Level: level,
		LogBSGSRatio: ratio, Diagonals: len(diags), Embedding: embedding, FoldRotations: len(folds),
	}

	ltParams := lintrans.Parameters{
		DiagonalsIndexList:        diags.DiagonalsIndexList(),
		LevelQ:                    level,
		LevelP:                    params.MaxLevelP(),
		Scale:                     rlwe.NewScale(params.Q()[level]),
		LogDimensions:             dims,
		LogBabyStepGiantStepRatio: ratio,
	}
	ecd := ckks.NewEncoder(params)
	t := time.Now()
	lt := lintrans.NewTransformation(params, ltParams)
	if err = lintrans.Encode(ecd, diags, lt); err != nil {
		return "", fmt.Errorf("lintrans.Encode: %w", err)
	}
	st.EncodeSeconds = time.Since(t).Seconds()
	st.N1 = lt.N1
	for _, poly := range lt.Vec {
		st.TransformBytes += int64(poly.BinarySize())
	}
	diags = nil // the encoded transform is all that is needed from here on

	// Keys: exactly the Galois elements lintrans lists (never recomputed here).
	galEls := lintrans.GaloisElements(params, ltParams)
	for _, f := range folds {
		if g := params.GaloisElement(f); !slices.Contains(galEls, g) {
			galEls = append(galEls, g)
		}
	}
	sort.Slice(galEls, func(i, j int) bool { return galEls[i] < galEls[j] })
	st.GaloisElements = galEls
	st.GaloisKeys = len(galEls)
	kgen := rlwe.NewKeyGenerator(params)
	sk := kgen.GenSecretKeyNew()
	t = time.Now()
	gks := kgen.GenGaloisKeysNew(galEls, sk)
	st.KeygenSeconds = time.Since(t).Seconds()
	for _, gk := range gks {
		st.KeyBytes += int64(gk.BinarySize())
	}
	if len(gks) > 0 {
		st.GaloisKeyBytes = gks[0].BinarySize()
	}

	// Rotations the evaluation performs, from lintrans' own BSGS index.
	if lt.N1 == 0 {
		for idx := range lt.Vec {
			if idx != 0 {
				st.BabyRotations++ // MultiplyByDiagMatrix: one hoisted rotation per diagonal
			}
		}
	} else {
		index, _, rotN2 := ltcommon.LinearTransformation(lt).BSGSIndex()
		for _, i := range rotN2 {
			if i != 0 {
				st.BabyRotations++ // PreRotatedCiphertext...: AutomorphismHoistedLazy
			}
		}
		for j := range index {
			if j != 0 {
				st.GiantRotations++ // MultiplyByDiagMatrixBSGS: one key switch per giant step
			}
		}
	}
	st.Rotations = st.BabyRotations + st.GiantRotations + len(folds)

	// Client: encrypt x at the chosen level (sparse packing when d < slots).
	enc := rlwe.NewEncryptor(params, sk)
	dec := rlwe.NewDecryptor(params, sk)
	t = time.Now()
	pt := ckks.NewPlaintext(params, level)
	pt.LogDimensions = dims
	if err = ecd.Encode(xs, pt); err != nil {
		return "", fmt.Errorf("cannot encode the vector: %w", err)
	}
	ct, err := enc.EncryptNew(pt)
	if err != nil {
		return "", fmt.Errorf("cannot encrypt the vector: %w", err)
	}
	st.EncryptSeconds = time.Since(t).Seconds()

	eval := ckks.NewEvaluator(params, rlwe.NewMemEvaluationKeySet(nil, gks...))
	ltEval := lintrans.NewEvaluator(eval)
	type run struct{ evaluate, rescale, fold, cpu float64 }
	runs := make([]run, 0, opt.Repeat)
	var res *rlwe.Ciphertext
	if opt.CPUProfile != "" {
		stop, err := startCPUProfile(opt.CPUProfile)
		if err != nil {
			return "", err
		}
		defer stop()
	}
	for r := 0; r < opt.Repeat; r++ {
		out := ckks.NewCiphertext(params, 1, level)
		resc := ckks.NewCiphertext(params, 1, level-1)
		t = time.Now()
		cpu0 := cpuSeconds()
		if err = ltEval.Evaluate(ct, lt, out); err != nil {
			return "", fmt.Errorf("lintrans Evaluate: %w", err)
		}
		ev := time.Since(t).Seconds()
		t = time.Now()
		if err = eval.Rescale(out, resc); err != nil {
			return "", fmt.Errorf("rescale: %w", err)
		}
		rs := time.Since(t).Seconds()
		// hybrid, interleaved: rotate-and-adds sum the partial rows (after the rescale)
		t = time.Now()
		for _, f := range folds {
			rot, err := eval.RotateNew(resc, f)
			if err != nil {
				return "", fmt.Errorf("fold rotation %d: %w", f, err)
			}
			if err = eval.Add(resc, rot, resc); err != nil {
				return "", err
			}
		}
		runs = append(runs, run{ev, rs, time.Since(t).Seconds(), cpuSeconds() - cpu0})
		st.CPUSecondsRuns = append(st.CPUSecondsRuns, runs[r].cpu)
		st.EvalSecondsRuns = append(st.EvalSecondsRuns, ev+rs+runs[r].fold)
		res = resc
	}
	total := func(r run) float64 { return r.evaluate + r.rescale + r.fold }
	sort.Slice(runs, func(a, b int) bool { return total(runs[a]) < total(runs[b]) })
	m := runs[(len(runs)-1)/2]
	st.EvaluateSeconds, st.RescaleSeconds, st.FoldSeconds, st.EvalSeconds = m.evaluate, m.rescale, m.fold, total(m)
	st.CPUSeconds = m.cpu

	t = time.Now()
	ys := make([]float64, d)
	if err = ecd.Decode(dec.DecryptNew(res), ys); err != nil {
		return "", fmt.Errorf("cannot decode the result: %w", err)
	}
	for r := 0; r < n; r++ {
		ys[r] = ys[r*stride]
	}
	st.DecryptSeconds = time.Since(t).Seconds()
	st.TotalSeconds = time.Since(t0).Seconds()
	data, err := json.Marshal(struct {
		Output string         `json:"output"`
		Stats  *lintransStats `json:"stats"`
	}{pack(ys[:n]), st})
	if err != nil {
		return "", fmt.Errorf("cannot encode the result: %w", err)
	}
	return string(data), nil
}

// squareEmbedding: the diagonals of the d x d embedding of W (n x k, row-major),
// diag_i[r] = W[r, (r+i) mod d] for r < n and (r+i) mod d < k.
func squareEmbedding(W []float64, n, k, d int) lintrans.Diagonals[float64] {
	diags := lintrans.Diagonals[float64]{}
	for i := 0; i < d; i++ {
		if diag := diagonalOf(W, n, k, d, func(s int) (int, int) { return s, (s + i) & (d - 1) }); diag != nil {
			diags[i] = diag
		}
	}
	return diags
}

// diagonalOf is the vector v[s] = W[r, c] with (r, c) = at(s) for s < length (0 where
// r >= n or c >= k), or nil when it is all zero (lintrans then has no such diagonal).
func diagonalOf(W []float64, n, k, length int, at func(s int) (int, int)) []float64 {
	var diag []float64
	for s := 0; s < length; s++ {
		r, c := at(s)
		if r >= n || c >= k {
			continue
		}
		if v := W[r*k+c]; v != 0 {
			if diag == nil {
				diag = make([]float64, length)
			}
			diag[s] = v
		}
	}
	return diag
}

// hybridEmbedding is GAZELLE's hybrid diagonal method (Juvekar et al. 2018) for a
// rectangular W (n x k) in a period of d = 2^ceil(log2 max(n, k)) slots; it returns the
// diagonals, the input vector (length d) and the rotate-and-add offsets after lintrans.
//
//   - wide (n < k): m = 2^ceil(log2 n) diagonals of length d,
//     diag_i[s] = W[s mod m, (s+i) mod d]; the input is x; slot s (row s mod m) then holds
//     the part of its row over columns s..s+m-1, and log2(d/m) rotate-and-adds (offsets
//     d/2, d/4, ..., m) sum the d/m parts into slots 0..n-1;
//   - tall (n > k): m = 2^ceil(log2 k) diagonals, diag_i[s] = W[s, (s+i) mod m]; the input
//     is x repeated with period m (x[s mod m]), so no rotate-and-add is needed;
//   - square (n = k): the square embedding.
func hybridEmbedding(W, x []float64, n, k, d int) (lintrans.Diagonals[float64], []float64, []int) {
	xs := make([]float64, d)
	if n == k {
		copy(xs, x)
		return squareEmbedding(W, n, k, d), xs, nil
	}
	diags := lintrans.Diagonals[float64]{}
	var folds []int
	if n < k {
		m := 1 << bits.Len(uint(n-1))
		copy(xs, x)
		for i := 0; i < m; i++ {
			if diag := diagonalOf(W, n, k, d, func(s int) (int, int) { return s & (m - 1), (s + i) & (d - 1) }); diag != nil {
				diags[i] = diag
			}
		}
		for f := d / 2; f >= m; f /= 2 {
			folds = append(folds, f)
		}
		return diags, xs, folds
	}
	m := 1 << bits.Len(uint(k-1))
	for s := range xs {
		if c := s & (m - 1); c < k {
			xs[s] = x[c]
		}
	}
	for i := 0; i < m; i++ {
		if diag := diagonalOf(W, n, k, d, func(s int) (int, int) { return s, (s + i) & (m - 1) }); diag != nil {
			diags[i] = diag
		}
	}
	return diags, xs, nil
}

// interleavedEmbedding gives lintrans the diagonals of slotplan's row-interleaved hybrid
// kernel (planner/kernels/hybrid.py), so that lintrans evaluates the same products:
// kp = 2^ceil(log2 k), n' = 2^ceil(log2 n), f = min(slots / n', kp) slots per row and
// D = kp / f diagonals at offsets f t (t < D), diag_(f t)[s] = W[s / f, (s + f t) mod kp];
// the input is x repeated with period kp; log2 f rotate-and-adds (offsets f/2, ..., 1)
// sum each row's f partial sums into slot row * f. Returns the diagonals, the input (all
// slots), the fold offsets and the output stride f. lintrans chooses its own baby and giant
// steps over the offsets f t (its BSGS ratio, swept by the bench).
func interleavedEmbedding(W, x []float64, n, k, slots int) (lintrans.Diagonals[float64], []float64, []int, int) {
	kp := 1 << bits.Len(uint(k-1))
	np := 1 << bits.Len(uint(n-1))
	f := min(slots/np, kp)
	xs := make([]float64, slots)
	for s := range xs {
		if c := s & (kp - 1); c < k {
			xs[s] = x[c]
		}
	}
	diags := lintrans.Diagonals[float64]{}
	for t := 0; t < kp/f; t++ {
		if diag := diagonalOf(W, n, k, slots, func(s int) (int, int) { return s / f, (s + f*t) & (kp - 1) }); diag != nil {
			diags[f*t] = diag
		}
	}
	var folds []int
	for o := f / 2; o >= 1; o /= 2 {
		folds = append(folds, o)
	}
	return diags, xs, folds, f
}
