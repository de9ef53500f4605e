package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"math/cmplx"
	"math/rand"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// cinsImage places a (C, H, W) image in a cins(l) value with row stride w: element
// (c, h, x) at local coefficient c*2l + h*w + x (docs/cins.md, CinSLayout).
func cinsImage(img [][][]float64, l, w int) []float64 {
	C := len(img)
	m := make([]float64, 2*l*C)
	for c := range img {
		for h := range img[c] {
			for x, v := range img[c][h] {
				m[c*2*l+h*w+x] = v
			}
		}
	}
	return m
}

// cinsKernelDiags are the C kernel diagonals of a same-padded f x f convolution
// K[co][ci][a][b]: diagonal d, slice i = sum_ab K[i][(i+d) mod C][a][b] Y^(-e),
// e = (a - f/2) w + (b - f/2), Y^(-e) = -Y^(2l-e) for e > 0 (docs/cins.md).
func cinsKernelDiags(K [][][][]float64, l, w int) [][]float64 {
	C := len(K)
	L := 2 * l
	diags := make([][]float64, C)
	for d := 0; d < C; d++ {
		v := make([]float64, L*C)
		for i := 0; i < C; i++ {
			k := K[i][(i+d)%C]
			f := len(k)
			for a := 0; a < f; a++ {
				for b := 0; b < f; b++ {
					e := (a-f/2)*w + (b - f/2)
					switch {
					case e == 0:
						v[i*L] += k[a][b]
					case e < 0:
						v[i*L-e] += k[a][b]
					default:
						v[i*L+L-e] -= k[a][b]
					}
				}
			}
		}
		diags[d] = v
	}
	return diags
}

// conv2d is the reference: same zero padding, cross-correlation (torch's conv2d).
func conv2d(img [][][]float64, K [][][][]float64) [][][]float64 {
	C, H, W := len(img), len(img[0]), len(img[0][0])
	out := make([][][]float64, len(K))
	for co := range K {
		out[co] = make([][]float64, H)
		for h := 0; h < H; h++ {
			out[co][h] = make([]float64, W)
			for x := 0; x < W; x++ {
				var s float64
				for ci := 0; ci < C; ci++ {
					k := K[co][ci]
					f := len(k)
					for a := 0; a < f; a++ {
						for b := 0; b < f; b++ {
							hh, xx := h+a-f/2, x+b-f/2
							if hh >= 0 && hh < H && xx >= 0 && xx < W {
								s += k[a][b] * img[ci][hh][xx]
							}
						}
					}
				}
				out[co][h][x] = s
			}
		}
	}
	return out
}

// cinsConvValue is the CinS semantics of the convolution: out_i = sum_d diag_d,i * in_(i+d).
func cinsConvValue(m []float64, diags [][]float64, l int) []float64 {
	L := 2 * l
	C := len(m) / L
	out := make([]float64, len(m))
	rot := make([]float64, len(m))
	for d, kd := range diags {
		for i := 0; i < C; i++ {
			copy(rot[i*L:(i+1)*L], m[((i+d)%C)*L:((i+d)%C+1)*L])
		}
		p := negacyclic(rot, kd, l)
		for t := range out {
			out[t] += p[t]
		}
	}
	return out
}

// randomConv returns a random image (values in [-1, 1]) and a 3x3 kernel scaled so the
// largest |output| is 0.9 (the bootstrap's input range is [-1, 1]).
func randomConv(rng *rand.Rand, C, H, W int) ([][][]float64, [][][][]float64, [][][]float64) {
	img := make([][][]float64, C)
	for c := range img {
		img[c] = make([][]float64, H)
		for h := range img[c] {
			img[c][h] = make([]float64, W)
			for x := range img[c][h] {
				img[c][h][x] = 2*rng.Float64() - 1
			}
		}
	}
	K := make([][][][]float64, C)
	for co := range K {
		K[co] = make([][][]float64, C)
		for ci := range K[co] {
			K[co][ci] = [][]float64{make([]float64, 3), make([]float64, 3), make([]float64, 3)}
			for a := 0; a < 3; a++ {
				for b := 0; b < 3; b++ {
					K[co][ci][a][b] = 2*rng.Float64() - 1
				}
			}
		}
	}
	ref := conv2d(img, K)
	mx := 0.0
	for co := range ref {
		for h := range ref[co] {
			for _, v := range ref[co][h] {
				mx = math.Max(mx, math.Abs(v))
			}
		}
	}
	s := 0.9 / mx
	for co := range K {
		for ci := range K[co] {
			for a := range K[co][ci] {
				for b := range K[co][ci][a] {
					K[co][ci][a][b] *= s
				}
			}
		}
		for h := range ref[co] {
			for x := range ref[co][h] {
				ref[co][h][x] *= s
			}
		}
	}
	return img, K, ref
}

func pairOf(m []float64, l int) (re, im []float64) {
	rp, ip := pairPositions(l, len(m)/2)
	re, im = make([]float64, len(rp)), make([]float64, len(ip))
	for s := range rp {
		re[s], im[s] = m[rp[s]], m[ip[s]]
	}
	return re, im
}

func maxAbsDiffC(a, b []complex128) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, cmplx.Abs(a[i]-b[i]))
	}
	return d
}

// TestCinsSlotOrder checks, without encryption at log N 14 (n14boot's ring), the CinS
// encoding and slot order slotplan assumes (planner/layout/cins.py, docs/cins.md) against
// Lattigo's own SlotsToCoeffs factors and encoder:
//   - the first log2 l single-stage factors of Lattigo's SlotsToCoeffs map the Re/Im pair
//     of a cins(l) value (re + i im, bit-reversed pair order) to its CinS slots
//     m_i(w^(5^j)) (S_(l<-1));
//   - the remaining factors (S_(N/2<-l)) map those to the slots of the ring polynomial
//     whose coefficients are NeuJeans' Thm 3 order a[C j + k] = m_(rev_C k)[j], as
//     Lattigo's encoder decodes a coefficient-encoded plaintext;
//   - products of CinS slot vectors are slice-wise negacyclic products, rotations by
//     multiples of l rotate slices, and the merged factors equal the stage products.
func TestCinsSlotOrder(t *testing.T) {
	const logN = 14
	slots := 1 << (logN - 1)
	N := 2 * slots
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{LogN: logN, LogQ: []int{60, 40}, LogP: []int{61}, LogDefaultScale: 40})
	if err != nil {
		t.Fatal(err)
	}
	ecd := ckks.NewEncoder(params)
	start := time.Now()
	stages := s2cStages(logN, logN-1)
	t.Logf("Lattigo's SlotsToCoeffs: %d single-stage factors in %.2f s", len(stages), time.Since(start).Seconds())
	for s, st := range stages {
		want := map[int]bool{0: true, 1 << s: true, (slots - 1<<s) & (slots - 1): true}
		for k := range st {
			if !want[k] {
				t.Fatalf("stage %d has diagonal %d", s, k)
			}
		}
	}
	rng := rand.New(rand.NewSource(11))
	for _, l := range []int{1, 4, 128, 512, slots} {
		C := slots / l
		logL := 0
		for 1<<logL < l {
			logL++
		}
		m := make([]float64, N)
		for i := range m {
			m[i] = 2*rng.Float64() - 1
		}
		re, im := pairOf(m, l)
		z := make([]complex128, slots)
		for s := range z {
			z[s] = complex(re[s], im[s])
		}
		c := z
		for _, st := range stages[:logL] {
			c = st.apply(c)
		}
		want := cinsSlots(m, l)
		d1 := maxAbsDiffC(c, want)
		if d1 > 1e-9 {
			t.Fatalf("l=%d: S_(l<-1)(re + i im) differs from the CinS slots by %g", l, d1)
		}
		s := c
		for _, st := range stages[logL:] {
			s = st.apply(s)
		}
		// The ring polynomial of Thm 3, coefficient-encoded and decoded by Lattigo.
		a := make([]float64, N)
		for j := 0; j < 2*l; j++ {
			for k := 0; k < C; k++ {
				a[C*j+k] = m[bitrevIndex(k, C)*2*l+j]
			}
		}
		pt := ckks.NewPlaintext(params, params.MaxLevel())
		pt.IsBatched = false
		if err := ecd.Encode(a, pt); err != nil {
			t.Fatal(err)
		}
		pt.IsBatched = true
		dec := make([]complex128, slots)
		if err := ecd.Decode(pt, dec); err != nil {
			t.Fatal(err)
		}
		// (the plaintext holds round(a 2^40): slot errors up to ~N 2^-41)
		d2 := maxAbsDiffC(s, dec)
		if d2 > 1e-7 {
			t.Fatalf("l=%d: S_(N/2<-l) S_(l<-1) (re + i im) differs from the slots of the Thm 3 polynomial by %g", l, d2)
		}
		t.Logf("l=%d (C=%d): S_(l<-1)(re + i im) = CinS slots (max diff %.2g), S_(N/2<-l) of them = Lattigo's decoding of the Thm 3 polynomial (max diff %.2g)", l, C, d1, d2)
		if l == 128 {
			// Merged factors (Lattigo's split) equal the stage products.
			fs, err := factorize(stages[logL:], 2, slots)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("S_(N/2<-l) in 2 factors (stages %v): %d and %d diagonals", decodeMerge(len(stages)-logL, 2), len(fs[0]), len(fs[1]))
			s2 := fs[1].apply(fs[0].apply(c))
			if d := maxAbsDiffC(s2, s); d > 1e-9*float64(slots) {
				t.Fatalf("merged factors differ by %g", d)
			}
			full := composeAll(stages[logL:], slots)
			if len(full) != C {
				t.Fatalf("S_(N/2<-l) in one factor has %d diagonals, want C=%d", len(full), C)
			}
			// Slot products are negacyclic slice products; rotations by l rotate slices.
			y := make([]float64, N)
			for i := range y {
				y[i] = 2*rng.Float64() - 1
			}
			cy := cinsSlots(y, l)
			prod := make([]complex128, slots)
			for i := range prod {
				prod[i] = c[i] * cy[i]
			}
			if d := maxAbsDiffC(prod, cinsSlots(negacyclic(m, y, l), l)); d > 1e-9*float64(l) {
				t.Fatalf("slot product is not the negacyclic slice product (%g)", d)
			}
			rot := diagMap{l: make([]complex128, slots)}
			for i := range rot[l] {
				rot[l][i] = 1
			}
			mr := append(append([]float64{}, m[2*l:]...), m[:2*l]...)
			if d := maxAbsDiffC(rot.apply(c), cinsSlots(mr, l)); d > 1e-9*float64(l) {
				t.Fatalf("rotation by l does not rotate the slices (%g)", d)
			}
		}
	}
}

// TestCinsConvSemantics checks the Go test's conv builders (kernel diagonals, CinS
// semantics) against the direct conv2d, in the clear.
func TestCinsConvSemantics(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	const l, w, C, H = 32, 8, 4, 7
	img, K, ref := randomConv(rng, C, H, H)
	out := cinsConvValue(cinsImage(img, l, w), cinsKernelDiags(K, l, w), l)
	for co := 0; co < C; co++ {
		for h := 0; h < H; h++ {
			for x := 0; x < H; x++ {
				if d := math.Abs(out[co*2*l+h*w+x] - ref[co][h][x]); d > 1e-12 {
					t.Fatalf("(%d,%d,%d): %g", co, h, x, d)
				}
			}
		}
	}
}

// neujeansCase is one encrypted layer of TestNeujeansN14.
type neujeansCase struct {
	name string
	spec neujeansSpec
	conv bool
}

// TestNeujeansN14 runs CinS layers encrypted at n14boot (N16QP1546H192H32 at log N 14,
// insecure): the CoeffsToSlots order of a cins register's bootstrap, and a 3x3
// convolution of C=64 channels of 15x15 images (l=128, w=16) from the Re/Im pair through
// S_(l<-1), the convolution folded into S_(N/2<-l) (fused) or followed by it (unfused), and
// ScaleDown/ModUp/CoeffsToSlots/EvalMod, against conv2d. ~3 GB, ~1-2 min: set
// SLOTPLAN_NEUJEANS_N14=1 to run it (make gocheck skips it otherwise).
func TestNeujeansN14(t *testing.T) {
	if os.Getenv("SLOTPLAN_NEUJEANS_N14") == "" {
		t.Skip("set SLOTPLAN_NEUJEANS_N14=1 to run the n14boot NeuJeans layers (~3 GB, ~1-2 min)")
	}
	skipWithoutBootMemory(t)
	setup := testBootSetup(t)
	logN := setup.params.LogN()
	slots := setup.params.MaxSlots()
	const l, w, H = 128, 16, 15
	C := slots / l
	rng := rand.New(rand.NewSource(7))
	img, K, ref := randomConv(rng, C, H, H)
	mIn := cinsImage(img, l, w)
	diags := cinsKernelDiags(K, l, w)
	mOut := cinsConvValue(mIn, diags, l)
	ratio := 1
	cases := []neujeansCase{
		{"order (bootstrap_cins alone)", neujeansSpec{L: l, StocLevels: 1}, false},
		{"unfused conv + StoC2", neujeansSpec{L: l, ToCinsLevels: 2, StocLevels: 1}, true},
		{"fused conv + StoC2", neujeansSpec{L: l, ToCinsLevels: 2, Fused: true}, true},
	}
	mats := make([]*neujeansMatrices, len(cases))
	offsets := map[int]bool{}
	t0 := time.Now()
	for i, cs := range cases {
		var kd [][]float64
		if cs.conv {
			kd = diags
		}
		var err error
		if mats[i], err = buildNeujeans(logN, slots, cs.spec, kd); err != nil {
			t.Fatal(err)
		}
		for _, k := range mats[i].keyOffsets(slots, ratio) {
			offsets[k] = true
		}
	}
	t.Logf("matrices built in %.2f s", time.Since(t0).Seconds())
	var offs []int
	for k := range offsets {
		offs = append(offs, k)
	}
	sort.Ints(offs)
	env, err := newNeujeansEnv(setup, t.TempDir(), offs)
	if err != nil {
		t.Fatal(err)
	}
	ki, _ := json.Marshal(env.keyInfo)
	t.Logf("keys: %s (keygen %.1f s, DFT matrices %.1f s)", ki, env.KeygenSeconds, env.BootMatrixSeconds)
	results := map[string]neujeansStats{}
	for i, cs := range cases {
		var st neujeansStats
		var ctIn *rlwe.Ciphertext
		var wantM []float64
		if cs.conv {
			re, im := pairOf(mIn, l)
			ctIn = mustCt(t)(env.toCinsInput(re, im))
			wantM = mOut
		} else {
			ctIn = mustCt(t)(env.c.encryptComplex(cinsSlots(mIn, l)))
			wantM = mIn
		}
		re, im, err := env.run(ctIn, mats[i], ratio, cs.spec.logGain(), &st)
		if err != nil {
			t.Fatalf("%s: %v", cs.name, err)
		}
		gotRe, err := env.c.decrypt(re)
		if err != nil {
			t.Fatal(err)
		}
		gotIm, err := env.c.decrypt(im)
		if err != nil {
			t.Fatal(err)
		}
		wantRe, wantIm := pairOf(wantM, l)
		errAll := 0.0
		for s := range gotRe {
			errAll = math.Max(errAll, math.Max(math.Abs(gotRe[s]-wantRe[s]), math.Abs(gotIm[s]-wantIm[s])))
		}
		// valid cells against conv2d, through the pair order
		got := make([]float64, 2*slots)
		rp, ip := pairPositions(l, slots)
		for s := range rp {
			got[rp[s]], got[ip[s]] = gotRe[s], gotIm[s]
		}
		errConv := 0.0
		if cs.conv {
			for co := 0; co < C; co++ {
				for h := 0; h < H; h++ {
					for x := 0; x < H; x++ {
						errConv = math.Max(errConv, math.Abs(got[co*2*l+h*w+x]-ref[co][h][x]))
					}
				}
			}
		}
		js, _ := json.Marshal(st)
		vsConv := ""
		if cs.conv {
			vsConv = fmt.Sprintf("; valid cells vs conv2d %.3g (%.1f bits)", errConv, -math.Log2(errConv))
		}
		t.Logf("%s: max abs err %.3g (%.1f bits) over all N coefficients%s; stats %s",
			cs.name, errAll, -math.Log2(errAll), vsConv, js)
		if errAll > 1e-6 || (cs.conv && errConv > 1e-6) {
			t.Errorf("%s: error %.3g / %.3g exceeds 2^-20", cs.name, errAll, errConv)
		}
		results[cs.name] = st
		releaseMemory()
	}
	fu, un := results["fused conv + StoC2"], results["unfused conv + StoC2"]
	convOnly := 0
	for _, s := range un.Steps {
		if s.Name == "conv" {
			convOnly = s.Rotations
		}
	}
	t.Logf("fused: %d rotations, %d level(s); unfused: conv %d rotations, conv + StoC2 %d rotations, %d levels; BSGS 2 sqrt(C) - 2 = %d",
		fu.ConvRotations, fu.ConvLevels, convOnly, un.ConvRotations, un.ConvLevels, 2*int(math.Sqrt(float64(C)))-2)
	if fu.ConvRotations != convOnly || convOnly != 2*int(math.Sqrt(float64(C)))-2 {
		t.Errorf("fused rotations %d, unfused conv %d, want 2 sqrt(C) - 2", fu.ConvRotations, convOnly)
	}
	if fu.ConvLevels != un.ConvLevels-1 {
		t.Errorf("fused uses %d levels, unfused %d", fu.ConvLevels, un.ConvLevels)
	}
}

func mustCt(t *testing.T) func(ct *rlwe.Ciphertext, err error) *rlwe.Ciphertext {
	return func(ct *rlwe.Ciphertext, err error) *rlwe.Ciphertext {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
}
