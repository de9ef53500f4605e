package slotlattigo

import (
	"fmt"
	"math"
	"math/bits"
	"math/cmplx"
	"sort"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/dft"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/lintrans"
	ltcommon "github.com/tuneinsight/lattigo/v6/circuits/common/lintrans"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// NeuJeans (shared/papers/neujeans-cins-conv-bootstrapping.txt, docs/cins.md) on Lattigo:
// channel-in-slot (CinS) registers, their convolution, and the bootstrap in NeuJeans'
// order with the convolution folded into SlotsToCoeffs. Public Lattigo v6.1.1 API only.
//
// Lattigo's SlotsToCoeffs (dft.HomomorphicDecode, not bit-reversed, full slots n = N/2) is
// a product of log2 n butterfly stages F_0, ..., F_(log n - 1), F_s with the diagonals
// 0, +2^s, -2^s (dft.MatrixLiteral.GenMatrices with all-ones Levels returns them one by
// one, applied F_0 first). The first log2 l stages act inside blocks of l slots: their
// product is S_(l<-1) (NeuJeans' StoC1), which maps the Re/Im pair of a cins(l) value m
// (docs/cins.md: re[i l + r] = m_i[rev_l r], im[i l + r] = m_i[l + rev_l r]) to its CinS
// slots c[i l + j] = m_i(w^(5^j)), w = exp(2 pi i / 4l). The other stages are
// S_(N/2<-l) (StoC2): l-granular (rotations by multiples of l), so its product with a
// CinS convolution K (diagonals at multiples of l) has the same C diagonals as K
// (NeuJeans Sec. 4). This file builds those maps as diagonal maps, multiplies them
// offline ((AB)_d = sum_(a+b=d) A_a * rot(B_b, a)) and evaluates them with Lattigo's
// lintrans; the bootstrap's ScaleDown, ModUp, CoeffsToSlots and EvalMod are Lattigo's.

// diagMap is an n x n complex matrix by its non-zero diagonals (Lattigo's lintrans
// convention): (M v)[t] = sum_k D_k[t] v[(t + k) mod n], keys in [0, n).
type diagMap map[int][]complex128

// apply returns M v.
func (m diagMap) apply(v []complex128) []complex128 {
	n := len(v)
	out := make([]complex128, n)
	for k, d := range m {
		for t := range out {
			out[t] += d[t] * v[(t+k)&(n-1)]
		}
	}
	return out
}

// offsets returns the diagonal indexes, sorted.
func (m diagMap) offsets() []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// compose returns A B (B applied first): (AB)_d = sum_(a+b=d) A_a * rot(B_b, a).
func compose(A, B diagMap, n int) diagMap {
	out := diagMap{}
	for _, a := range A.offsets() {
		da := A[a]
		for _, b := range B.offsets() {
			db := B[b]
			d := (a + b) & (n - 1)
			acc := out[d]
			if acc == nil {
				acc = make([]complex128, n)
				out[d] = acc
			}
			for t := 0; t < n; t++ {
				acc[t] += da[t] * db[(t+a)&(n-1)]
			}
		}
	}
	for d, v := range out { // exact cancellations only (butterfly products do not cancel)
		zero := true
		for _, x := range v {
			if x != 0 {
				zero = false
				break
			}
		}
		if zero {
			delete(out, d)
		}
	}
	return out
}

// composeAll returns ms[len-1] ... ms[1] ms[0] (ms[0] applied first).
func composeAll(ms []diagMap, n int) diagMap {
	out := ms[0]
	for _, m := range ms[1:] {
		out = compose(m, out, n)
	}
	return out
}

// s2cStages returns Lattigo's SlotsToCoeffs at full slots as its log2(slots) single-stage
// factors, in the order they are applied (stage s has the diagonals 0, 2^s, slots-2^s),
// without scaling (dft.MatrixLiteral.GenMatrices with Levels all ones).
func s2cStages(logN, logSlots int) []diagMap {
	levels := make([]int, logSlots)
	for i := range levels {
		levels[i] = 1
	}
	lit := dft.MatrixLiteral{Type: dft.HomomorphicDecode, LogSlots: logSlots, Levels: levels}
	mats := lit.GenMatrices(logN, 53)
	out := make([]diagMap, len(mats))
	for s, m := range mats {
		dm := diagMap{}
		for k, v := range m {
			k &= (1 << logSlots) - 1
			c := make([]complex128, len(v))
			for t, x := range v {
				c[t] = x.Complex128()
			}
			dm[k] = c
		}
		out[s] = dm
	}
	return out
}

// decodeMerge is Lattigo's split of `stages` butterfly stages into `levels` factors for a
// decoding DFT (ceil rule, the larger factors last; dft.MatrixLiteral.GenMatrices).
func decodeMerge(stages, levels int) []int {
	merge := make([]int, levels)
	rem := stages
	for i := 0; i < levels; i++ {
		d := int(math.Ceil(float64(rem) / float64(levels-i)))
		merge[levels-1-i] = d
		rem -= d
	}
	return merge
}

// factorize merges consecutive stages into `levels` factors (decodeMerge's split).
func factorize(stages []diagMap, levels, n int) ([]diagMap, error) {
	if len(stages) == 0 {
		return nil, nil
	}
	if levels < 1 || levels > len(stages) {
		return nil, fmt.Errorf("%d stages cannot be merged into %d factors", len(stages), levels)
	}
	var out []diagMap
	i := 0
	for _, k := range decodeMerge(len(stages), levels) {
		out = append(out, composeAll(stages[i:i+k], n))
		i += k
	}
	return out, nil
}

// bitrevIndex is rev_n(j) (n a power of two).
func bitrevIndex(j, n int) int {
	b := bits.Len(uint(n)) - 1
	return int(bits.Reverse64(uint64(j)) >> (64 - b))
}

// pairPositions returns the local-coefficient position of slot s of the Re and Im
// registers of a cins(l) value (docs/cins.md, planner.layout.cins.pair_positions).
func pairPositions(l, slots int) (re, im []int) {
	re, im = make([]int, slots), make([]int, slots)
	for s := 0; s < slots; s++ {
		i, r := s/l, s%l
		re[s] = i*2*l + bitrevIndex(r, l)
		im[s] = re[s] + l
	}
	return re, im
}

// cinsSlots returns the CinS slots of a cins(l) value m (length N = 2 slots):
// c[i l + j] = m_i(w^(5^j)), w = exp(2 pi i / 4l) (planner.layout.cins.cins_slot_vector).
func cinsSlots(m []float64, l int) []complex128 {
	L := 2 * l
	C := len(m) / L
	out := make([]complex128, C*l)
	pw := make([]complex128, 4*l) // w^e
	for e := range pw {
		pw[e] = cmplx.Exp(complex(0, 2*math.Pi*float64(e)/float64(4*l)))
	}
	g := 1
	for j := 0; j < l; j++ {
		for i := 0; i < C; i++ {
			var acc complex128
			sl := m[i*L : (i+1)*L]
			e := 0
			for k := 0; k < L; k++ {
				if sl[k] != 0 {
					acc += complex(sl[k], 0) * pw[e]
				}
				e += g
				if e >= 4*l {
					e -= 4 * l
				}
			}
			out[i*l+j] = acc
		}
		g = g * 5 % (4 * l)
	}
	return out
}

// negacyclic returns the slice-wise negacyclic products (slices of 2l) of x and y.
func negacyclic(x, y []float64, l int) []float64 {
	L := 2 * l
	out := make([]float64, len(x))
	for s := 0; s < len(x); s += L {
		for a := 0; a < L; a++ {
			if x[s+a] == 0 {
				continue
			}
			for b := 0; b < L; b++ {
				if k := a + b; k < L {
					out[s+k] += x[s+a] * y[s+b]
				} else {
					out[s+k-L] -= x[s+a] * y[s+b]
				}
			}
		}
	}
	return out
}

// convDiagMap is a CinS convolution as a slot matrix: diagonal d*l holds the CinS slots of
// kernel diagonal d (a cins(l) value whose slice i is the kernel polynomial from input
// slice (i + d) mod C to output slice i).
func convDiagMap(kernelDiags [][]float64, l int) diagMap {
	m := diagMap{}
	for d, kd := range kernelDiags {
		m[d*l] = cinsSlots(kd, l)
	}
	return m
}

// DefaultBootLogGain is neujeansSpec.BootLogGain's default: at n14boot (N16QP1546H192H32 at
// log N 14), a cins(128) value with all N coefficients uniform in [-1, 1] came back with
// max abs errors 5.3e-7, 1.1e-7, 2.8e-8, 3.9e-7, 6.3e-6 for g = 0, 3, 6, 8, 10 (one run each).
const DefaultBootLogGain = 6

// neujeansSpec chooses the layer's lowering.
type neujeansSpec struct {
	L            int  `json:"l"`              // slice length parameter l (slices of 2l reals)
	Fused        bool `json:"fused"`          // fold S_(N/2<-l) into the convolution
	ToCinsLevels int  `json:"to_cins_levels"` // factors of S_(l<-1); 0: the input is already a CinS ciphertext
	StocLevels   int  `json:"stoc_levels"`    // factors of S_(N/2<-l) when not fused (default 1)
	LogBSGSRatio *int `json:"log_bsgs_ratio"` // lintrans' ratio for every matrix (default 1, Lattigo's bootstrapping default)
	// BootLogGain g (default DefaultBootLogGain): the message enters ScaleDown multiplied
	// by SlotsToCoeffs' Scaling times 2^g, and the EvalMod outputs' scale is multiplied by
	// 2^g (metadata only, no level). Lattigo's Scaling (2^-12 at N16QP1546H192H32) keeps
	// the message far inside EvalMod's interval; in NeuJeans' order it is applied before
	// EvalMod, so EvalMod's noise is amplified by its inverse. g > 0 trades that noise for
	// EvalMod's approximation error (cubic in the message).
	BootLogGain *int `json:"boot_log_gain"`
}

// neujeansMatrices are the layer's plaintext matrices (public: the evaluation side builds
// them from the model's kernels).
type neujeansMatrices struct {
	toCins []diagMap // S_(l<-1) factors, applied in order
	conv   diagMap   // K, or S_(N/2<-l) K when fused (nil: no convolution)
	stoc   []diagMap // S_(N/2<-l) factors when not folded into conv
}

// buildNeujeans builds the matrices of a layer at log N / slots for kernel diagonals
// (nil: no convolution, the bootstrap of a cins register alone).
func buildNeujeans(logN, slots int, spec neujeansSpec, kernelDiags [][]float64) (*neujeansMatrices, error) {
	l := spec.L
	if l < 1 || l&(l-1) != 0 || slots%l != 0 {
		return nil, fmt.Errorf("l=%d must be a power of two dividing %d slots", l, slots)
	}
	C := slots / l
	logSlots := bits.Len(uint(slots)) - 1
	logL := bits.Len(uint(l)) - 1
	if kernelDiags != nil && len(kernelDiags) != C {
		return nil, fmt.Errorf("%d kernel diagonals for C=%d slices", len(kernelDiags), C)
	}
	for d, kd := range kernelDiags {
		if len(kd) != 2*slots {
			return nil, fmt.Errorf("kernel diagonal %d has %d values, want N=%d", d, len(kd), 2*slots)
		}
	}
	stages := s2cStages(logN, logSlots)
	m := &neujeansMatrices{}
	var err error
	if spec.ToCinsLevels > 0 {
		if logL == 0 {
			return nil, fmt.Errorf("l=1 has no S_(l<-1) stage (to_cins_levels must be 0)")
		}
		if m.toCins, err = factorize(stages[:logL], spec.ToCinsLevels, slots); err != nil {
			return nil, fmt.Errorf("S_(l<-1): %w", err)
		}
	}
	s2 := stages[logL:]
	if kernelDiags != nil {
		m.conv = convDiagMap(kernelDiags, l)
	}
	if spec.Fused {
		if m.conv == nil {
			return nil, fmt.Errorf("fused needs kernel diagonals")
		}
		if len(s2) > 0 {
			m.conv = compose(composeAll(s2, slots), m.conv, slots)
		}
		return m, nil
	}
	if len(s2) > 0 {
		levels := spec.StocLevels
		if levels == 0 {
			levels = 1
		}
		if m.stoc, err = factorize(s2, levels, slots); err != nil {
			return nil, fmt.Errorf("S_(N/2<-l): %w", err)
		}
	}
	return m, nil
}

// logGain is the spec's BootLogGain or its default.
func (s neujeansSpec) logGain() int {
	if s.BootLogGain == nil {
		return DefaultBootLogGain
	}
	return *s.BootLogGain
}

// all returns the matrices in evaluation order with their names.
func (m *neujeansMatrices) all() (names []string, ms []diagMap) {
	for i, f := range m.toCins {
		names, ms = append(names, fmt.Sprintf("to_cins[%d]", i)), append(ms, f)
	}
	if m.conv != nil {
		names, ms = append(names, "conv"), append(ms, m.conv)
	}
	for i, f := range m.stoc {
		names, ms = append(names, fmt.Sprintf("stoc2[%d]", i)), append(ms, f)
	}
	return names, ms
}

// bsgsRotations returns the rotation offsets lintrans uses for a matrix (babies, giants,
// zero excluded) at the given ratio.
func bsgsRotations(m diagMap, slots, logRatio int) (babies, giants []int) {
	diags := m.offsets()
	n1 := ltcommon.FindBestBSGSRatio(diags, slots, logRatio)
	_, rotN1, rotN2 := ltcommon.BSGSIndex(diags, slots, n1)
	for _, k := range rotN2 {
		if k != 0 {
			babies = append(babies, k)
		}
	}
	for _, k := range rotN1 {
		if k != 0 {
			giants = append(giants, k)
		}
	}
	return babies, giants
}

// keyOffsets returns every rotation offset the layer's matrices need, sorted.
func (m *neujeansMatrices) keyOffsets(slots, logRatio int) []int {
	set := map[int]bool{}
	_, ms := m.all()
	for _, d := range ms {
		b, g := bsgsRotations(d, slots, logRatio)
		for _, k := range append(b, g...) {
			set[k] = true
		}
	}
	out := make([]int, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// ltStep is one evaluated matrix.
type ltStep struct {
	Name          string  `json:"name"`
	Diagonals     int     `json:"diagonals"`
	Babies        []int   `json:"babies"`
	Giants        []int   `json:"giants"`
	Rotations     int     `json:"rotations"`
	LevelIn       int     `json:"level_in"`
	LevelOut      int     `json:"level_out"`
	EncodeSeconds float64 `json:"encode_seconds"`
	EvalSeconds   float64 `json:"eval_seconds"`
	PlaintextByte int64   `json:"plaintext_bytes"`
}

// evalDiagMap encodes m at the ciphertext's level (plaintext scale q_level) and evaluates it
// with Lattigo's lintrans (BSGS, double hoisting), then rescales: one level.
func evalDiagMap(eval *ckks.Evaluator, ecd *ckks.Encoder, ct *rlwe.Ciphertext, name string, m diagMap, logRatio int) (*rlwe.Ciphertext, ltStep, error) {
	params := *eval.GetParameters()
	slots := params.MaxSlots()
	level := ct.Level()
	st := ltStep{Name: name, Diagonals: len(m), LevelIn: level}
	st.Babies, st.Giants = bsgsRotations(m, slots, logRatio)
	st.Rotations = len(st.Babies) + len(st.Giants)
	t := time.Now()
	lt := lintrans.NewTransformation(params, lintrans.Parameters{
		DiagonalsIndexList:        m.offsets(),
		LevelQ:                    level,
		LevelP:                    params.MaxLevelP(),
		Scale:                     rlwe.NewScale(params.Q()[level]),
		LogDimensions:             ring.Dimensions{Rows: 0, Cols: params.LogMaxSlots()},
		LogBabyStepGiantStepRatio: logRatio,
	})
	if err := lintrans.Encode(ecd, lintrans.Diagonals[complex128](m), lt); err != nil {
		return nil, st, fmt.Errorf("%s: %w", name, err)
	}
	for _, p := range lt.Vec {
		st.PlaintextByte += int64(p.BinarySize())
	}
	st.EncodeSeconds = time.Since(t).Seconds()
	t = time.Now()
	out := ckks.NewCiphertext(params, 1, level)
	if err := lintrans.NewEvaluator(eval).Evaluate(ct, lt, out); err != nil {
		return nil, st, fmt.Errorf("%s: %w", name, err)
	}
	if err := eval.Rescale(out, out); err != nil {
		return nil, st, fmt.Errorf("%s: rescale: %w", name, err)
	}
	st.EvalSeconds = time.Since(t).Seconds()
	st.LevelOut = out.Level()
	return out, st, nil
}
