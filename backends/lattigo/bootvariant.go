package slotlattigo

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
	"github.com/tuneinsight/lattigo/v6/utils"
)

// Sparse bootstrap variants (issue 36, docs/formats.md "Bootstrap variants").
//
//   - bootstrap {dst, src, log_slots: k[, halves][, scale]} and bootstrap2 {dsts, srcs,
//     log_slots: k[, scale]} run Lattigo's bootstrapping with LogSlots = k (its own DFT
//     matrices, its own Galois keys; the same chain as the full-slot bootstrap, so the key
//     block "boot" of the plan is the union of both key sets: one key per Galois element).
//   - Lattigo's sparse bootstrap traces the ciphertext onto the subring of 2^k slots after
//     ModUp: in coefficient terms a projection, in slot terms the AVERAGE of the slot
//     vector's 2^(logN-1-k) blocks of length n = 2^k, replicated with period n. The executor
//     relabels the input's scale by 1/gap (gap = slots/n: the integer polynomial is left as
//     it is, the bootstrapper reads gap times the values) so that the average comes out as
//     the block SUM, which for a source that is zero outside [0, n) is the source itself.
//     (Multiplying the output by gap instead would multiply the bootstrap's error by gap:
//     log2(gap) bits lost.)
//   - plain: out = (scale * M_[0,n)) * bootstrap_k(x): one plaintext product, one rescale.
//   - replicas: out = scale * bootstrap_k(x) (scale an integer: exact, no level): every slot
//     j holds x[j mod n], the copies the trace left, for readers of a dirty layout.
//   - bootstrap2: z = x + i*y (mul_i, add: no level), bootstrapped; a = M*scale/2 * (z +
//     conj z), b = -i*M*scale/2 * (z - conj z): one conjugation, two products, two rescales.
//   - halves (x zero outside [0, 2n)): the block sum of any combination of rotations,
//     conjugations and constant multiples of x depends on x_lo + x_hi only, so the two
//     halves cannot be separated after the trace without a slot-wise mask BEFORE it. The
//     executor multiplies x by the complex mask c (1 on [0, n), i on [n, 2n)), one level
//     (the source must be at level >= 1), so that the block sum is z = x_lo + i*x_hi;
//     after the bootstrap: out = P1*z + P2*conj(z) with P1 = scale*(M_lo - i*M_hi)/2 and
//     P2 = scale*(M_lo + i*M_hi)/2 (one conjugation, two products, one rescale).
//   - halves, premasked: the source carries c*x already (a poly's complex mask: maskedPoly),
//     so no mask and no level come before the bootstrap; the rest as halves. plan.validate
//     refuses a premasked source no poly with a complex mask wrote.
//
//   - in_scale s (bootstrap, full-slot or sparse; not bootstrap2): the source's scale is
//     relabelled to s times what it is (the integer polynomial is left as it is), so the
//     bootstrap refreshes src / s: the value brought within boot.max_abs without a product
//     or a level. Lattigo's ScaleDown then scales the input up by an integer to its
//     q0 / 2^LogMessageRatio, as it does any input (maxBootInScale keeps that factor >= 1).
//   - a full-slot bootstrap's scale (an integer): the result is multiplied by it exactly
//     (a Gaussian-integer constant, as mul_i: no scale, no level), undoing in_scale.
//
// Each mask plaintext is encoded at the ciphertext's level with scale q_level (the prime
// the following rescale removes), so the result keeps the default scale at one level
// below the top residual level (depth 1), as the plan's simulator says.

// bootVariantParams is one entry of params.boot.variants.
type bootVariantParams struct {
	LogSlots    int   `json:"log_slots"`
	KeyOffsets  []int `json:"key_offsets"`
	MatrixBytes int64 `json:"matrix_bytes"`
	// LogBSGSRatio: the DFT matrices' baby-to-giant step ratio (log2; absent: Lattigo's
	// defaultDFTBSGSRatio). The key offsets are those of the matrices at this ratio.
	LogBSGSRatio *int `json:"log_bsgs_ratio"`
}

// maxBootScale bounds |scale| of a variant (planner.ir.instructions.MAX_BOOT_SCALE).
const maxBootScale = 1 << 20

// maxBootInScale bounds in_scale (planner.ir.instructions.MAX_BOOT_IN_SCALE): the
// relabelled scale, default scale times in_scale, must stay at most the scale Lattigo's
// ScaleDown brings a bootstrap's input to, q0 / 2^LogMessageRatio (2^60 / 2^8 = 2^52 for
// N16QP1546H192H32, 2^12 times its default scale 2^40), so that ScaleDown only ever scales
// up (by an integer) and the message reaches EvalMod exactly as after a product by 1 /
// in_scale.
const maxBootInScale = 1 << 12

// validateInScale checks in_scale and a full-slot bootstrap's scale (an integer: the
// executor multiplies by it exactly, no level).
func validateInScale(in instr, fail func(string, ...any) error) error {
	if in.InScale != nil {
		if in.Op == "bootstrap2" {
			return fail("field \"in_scale\" belongs to bootstrap")
		}
		s := *in.InScale
		if math.IsNaN(s) || s < 1 || s > maxBootInScale {
			return fail("field \"in_scale\": a number with 1 <= in_scale <= 2^12, got %v", s)
		}
	}
	// (a full-slot or replicas bootstrap multiplies its result by the scale exactly)
	replicas := in.LogSlots != nil && in.Replicas != nil && *in.Replicas
	if in.Op == "bootstrap" && (in.LogSlots == nil || replicas) && in.Scale != nil {
		s := *in.Scale
		if math.IsNaN(s) || s < 1 || s > maxBootScale || s != math.Trunc(s) {
			what := map[bool]string{true: "a replicas", false: "a full-slot"}[replicas]
			return fail("field \"scale\": %s bootstrap's scale is an integer with 1 <= scale <= 2^20, got %v", what, s)
		}
	}
	return nil
}

// validateBootVariant checks the variant fields of a bootstrap or bootstrap2 before any
// cryptography runs (the params' offer is checked by setupBootVariants).
func validateBootVariant(in instr, slots int, fail func(string, ...any) error) error {
	if in.Op == "bootstrap2" {
		for _, f := range []struct {
			name string
			regs []string
		}{{"dsts", in.Dsts}, {"srcs", in.Srcs}} {
			if len(f.regs) != 2 || f.regs[0] == "" || f.regs[1] == "" {
				return fail("field %q: bootstrap2 names two registers, got %q", f.name, f.regs)
			}
		}
		if in.Srcs[0] == in.Srcs[1] {
			return fail("field \"srcs\": bootstrap2 reads two different registers")
		}
		if in.Dsts[0] == in.Dsts[1] {
			return fail("field \"dsts\": bootstrap2 writes two different registers")
		}
		if in.LogSlots == nil {
			return fail("field \"log_slots\" is required")
		}
		if in.Halves != nil {
			return fail("field \"halves\" belongs to bootstrap")
		}
		if in.Replicas != nil {
			return fail("field \"replicas\" belongs to bootstrap")
		}
		if in.Premasked != nil {
			return fail("field \"premasked\" belongs to bootstrap")
		}
	}
	if in.Premasked != nil && *in.Premasked && (in.Halves == nil || !*in.Halves) {
		return fail("field \"premasked\" belongs to a halves bootstrap (its source carries the halves packing)")
	}
	if err := validateInScale(in, fail); err != nil {
		return err
	}
	if in.LogSlots == nil {
		if in.Halves != nil {
			return fail("field \"halves\" belongs to a sparse bootstrap (give log_slots)")
		}
		if in.Replicas != nil {
			return fail("field \"replicas\" belongs to a sparse bootstrap (give log_slots)")
		}
		return nil
	}
	replicas := in.Replicas != nil && *in.Replicas
	if replicas && in.Halves != nil && *in.Halves {
		return fail("field \"replicas\": a halves bootstrap is always unpacked (replicas and halves exclude each other)")
	}
	k := *in.LogSlots
	span := 1
	if in.Halves != nil && *in.Halves {
		span = 2
	}
	if k < 1 || k >= 31 || 1<<k >= slots || span<<k > slots {
		return fail("field \"log_slots\": an integer k >= 1 with 2^k < the %d slots%s, got %d", slots,
			map[bool]string{true: " and 2^(k+1) <= the slots (halves)", false: ""}[span == 2], k)
	}
	if in.Scale != nil && !replicas { // (a replicas bootstrap's: validateInScale)
		s := *in.Scale
		if math.IsNaN(s) || math.IsInf(s, 0) || s == 0 || math.Abs(s) > maxBootScale || math.Abs(s) < 1.0/maxBootScale {
			return fail("field \"scale\": a finite nonzero number with 2^-20 <= |scale| <= 2^20, got %v", s)
		}
	}
	return nil
}

// bootVariantsUsed maps each log_slots the program's variants use to its first instruction.
func (p *plan) bootVariantsUsed() map[int]int {
	out := map[int]int{}
	for i, in := range p.Program {
		if (in.Op == "bootstrap" || in.Op == "bootstrap2") && in.LogSlots != nil {
			if _, ok := out[*in.LogSlots]; !ok {
				out[*in.LogSlots] = i
			}
		}
	}
	return out
}

// defaultDFTBSGSRatio is the log2 ratio of baby to giant steps of the DFT matrices
// (CoeffsToSlots and SlotsToCoeffs) of Lattigo's bootstrapping parameters, which a sparse
// variant keeps unless its params entry says otherwise (log_bsgs_ratio; the preset n16boot
// chooses per variant: planner/frontend/params.py, docs/lattigo.md "The DFTs' baby-step
// giant-step ratio"). More babies per giant step: fewer key switches of the accumulated
// ciphertext, more hoisted rotations and Galois keys.
const defaultDFTBSGSRatio = 1
const maxDFTBSGSRatio = 6 // planner.frontend.params.MAX_LOG_BSGS_RATIO

// variantRatio is the DFT ratio the params give the variant at 2^k slots (default
// defaultDFTBSGSRatio).
func variantRatio(setup *evalSetup, k int) int {
	for _, v := range setup.boot.Variants {
		if v.LogSlots == k && v.LogBSGSRatio != nil {
			return *v.LogBSGSRatio
		}
	}
	return defaultDFTBSGSRatio
}

// variantBootParameters builds the bootstrapping parameters at 2^k slots of a setup's
// literal (the same residual chain), their DFT matrices at the variant's ratio
// (variantRatio); their bootstrapping chain must be the full-slot one's, so that both run
// on one evaluator and share the keys of one Galois element.
func variantBootParameters(setup *evalSetup, k int) (*bootstrapping.Parameters, error) {
	lit, ok := bootLiterals[setup.boot.Literal]
	if !ok {
		return nil, fmt.Errorf("params.boot.literal %q is not supported", setup.boot.Literal)
	}
	blit := lit.btp
	blit.LogN = utils.Pointy(setup.params.LogN())
	blit.LogSlots = utils.Pointy(k)
	btp, err := bootstrapping.NewParametersFromLiteral(setup.btp.ResidualParameters, blit)
	if err != nil {
		return nil, fmt.Errorf("Lattigo rejects the bootstrapping parameters %s at 2^%d slots: %w", setup.boot.Literal, k, err)
	}
	r := variantRatio(setup, k)
	if r < 0 || r > maxDFTBSGSRatio {
		return nil, fmt.Errorf("params.boot.variants: log_bsgs_ratio %d of the variant at 2^%d slots is not in 0..%d", r, k, maxDFTBSGSRatio)
	}
	btp.CoeffsToSlotsParameters.LogBSGSRatio = r
	btp.SlotsToCoeffsParameters.LogBSGSRatio = r
	if !btp.BootstrappingParameters.Equal(&setup.btp.BootstrappingParameters) {
		return nil, fmt.Errorf("the bootstrapping chain of %s at 2^%d slots differs from the full-slot one (its keys could not be shared)",
			setup.boot.Literal, k)
	}
	return &btp, nil
}

// setupBootVariants checks that the params offer every variant the plan uses (and that the
// offsets they list are Lattigo's) and builds their bootstrapping parameters into setup.
func (p *plan) setupBootVariants(setup *evalSetup) error {
	used := p.bootVariantsUsed()
	if len(used) == 0 {
		return nil
	}
	ks := make([]int, 0, len(used))
	for k := range used {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	setup.variants = map[int]*bootstrapping.Parameters{}
	for _, k := range ks {
		i := used[k]
		fail := func(format string, args ...any) error {
			return fmt.Errorf("instruction %d (%s): field \"log_slots\": %s", i, p.Program[i].Op, fmt.Sprintf(format, args...))
		}
		j := -1
		offered := make([]int, 0, len(setup.boot.Variants))
		for vj, v := range setup.boot.Variants {
			offered = append(offered, v.LogSlots)
			if v.LogSlots == k {
				j = vj
			}
		}
		if j < 0 {
			return fail("the params' boot object offers no sparse bootstrap at 2^%d slots (boot.variants: %v)", k, offered)
		}
		btp, err := variantBootParameters(setup, k)
		if err != nil {
			return fail("%v", err)
		}
		if want := setup.boot.Variants[j].KeyOffsets; want != nil {
			got := bootKeyInfo(*btp).offsets
			w := append([]int(nil), want...)
			sort.Ints(w)
			if fmt.Sprint(w) != fmt.Sprint(got) {
				return fmt.Errorf("params.boot.variants[%d].key_offsets %v differ from the rotations of %s at 2^%d slots: %v",
					j, want, setup.boot.Literal, k, got)
			}
		}
		setup.variants[k] = btp
	}
	return nil
}

// keyInfoOf describes a set of Galois elements of params: sorted, with the rotation offset
// of each (conjugation has none).
func keyInfoOf(params ckks.Parameters, set map[uint64]bool) bootKeys {
	info := bootKeys{byGalEl: map[uint64]int{}}
	slots := params.MaxSlots()
	conj := params.GaloisElementForComplexConjugation()
	want := len(set)
	if set[conj] {
		want--
	}
	for k := 1; k < slots && len(info.byGalEl) < want; k++ {
		if g := params.GaloisElement(k); set[g] {
			info.byGalEl[g] = k
			info.offsets = append(info.offsets, k)
		}
	}
	for g := range set {
		info.galEls = append(info.galEls, g)
		if g == conj {
			info.conjugation = true
		}
	}
	sort.Slice(info.galEls, func(i, j int) bool { return info.galEls[i] < info.galEls[j] })
	sort.Ints(info.offsets)
	return info
}

// blockKeyInfo is the key block "boot" of a plan: the Galois keys of the full-slot
// bootstrap and of every variant it uses (a Galois element shared by several is one key).
func blockKeyInfo(btp bootstrapping.Parameters, variants map[int]*bootstrapping.Parameters) bootKeys {
	params := btp.BootstrappingParameters
	set := map[uint64]bool{params.GaloisElementForComplexConjugation(): true}
	for _, g := range btp.GaloisElements(params) {
		set[g] = true
	}
	for _, v := range variants {
		for _, g := range v.GaloisElements(params) {
			set[g] = true
		}
	}
	return keyInfoOf(params, set)
}

// blockKeys is the plan's key block (blockKeyInfo of its setup).
func (s *evalSetup) blockKeys() bootKeys {
	return blockKeyInfo(*s.btp, s.variants)
}

// sortedVariants lists the log_slots of a setup's variants in increasing order.
func (s *evalSetup) sortedVariants() []int {
	ks := make([]int, 0, len(s.variants))
	for k := range s.variants {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// bootVariants is the executor's state for the plan's variants: one sparse bootstrapping
// evaluator per log_slots (built with the block's matrices, kept while the block is
// resident, across evaluations like the full-slot one) and the encoded masks (kept).
type bootVariants struct {
	evs   map[int]*bootstrapping.Evaluator
	masks map[string]*rlwe.Plaintext
}

// useVariantEvaluators takes a copy of each variant's evaluator of the state (its matrices
// shared), to be wired once the block is read.
func (e *executor) useVariantEvaluators(bs *bootState) {
	if len(bs.variants) == 0 {
		return
	}
	if e.bv == nil {
		e.bv = &bootVariants{masks: map[string]*rlwe.Plaintext{}}
	}
	e.bv.evs = map[int]*bootstrapping.Evaluator{}
	for k, ev := range bs.variants {
		e.bv.evs[k] = copyEvaluator(ev)
	}
}

// wireVariantEvaluators points the variants' evaluators at the executor's evaluator and
// the block's keys (after the block is read).
func (e *executor) wireVariantEvaluators() {
	if e.bv == nil {
		return
	}
	for _, ev := range e.bv.evs {
		wireBootEvaluator(ev, e.eval, e.keys.block)
	}
}

// variantKind names a variant as the cost tables do: s<k>, h<k>, p<k>.
func variantKind(in instr) string {
	switch {
	case in.Op == "bootstrap2":
		return fmt.Sprintf("p%d", *in.LogSlots)
	case in.Halves != nil && *in.Halves:
		return fmt.Sprintf("h%d", *in.LogSlots)
	case in.Replicas != nil && *in.Replicas:
		return fmt.Sprintf("r%d", *in.LogSlots)
	}
	return fmt.Sprintf("s%d", *in.LogSlots)
}

// variantEvaluator is the sparse bootstrapping evaluator at 2^k slots (the block resident).
func (e *executor) variantEvaluator(k int) (*bootstrapping.Evaluator, error) {
	if e.btpEval == nil {
		return nil, fmt.Errorf("the key block \"boot\" is not resident (the key schedule must load_key block \"boot\" before a bootstrap)")
	}
	if e.bv == nil || e.bv.evs[k] == nil {
		return nil, fmt.Errorf("field \"log_slots\": no sparse bootstrapping evaluator at 2^%d slots", k)
	}
	return e.bv.evs[k], nil
}

// mask is the plaintext of a variant's mask vector at level (scale q_level), encoded once.
func (e *executor) mask(name string, level int, values func(slots int) []complex128) (*rlwe.Plaintext, error) {
	key := fmt.Sprintf("%s@%d", name, level)
	if pt, ok := e.bv.masks[key]; ok {
		return pt, nil
	}
	t := nowSeconds()
	pt := ckks.NewPlaintext(e.params, level)
	pt.Scale = e.rescaleFactor(level)
	if err := e.emb.encode(values(e.params.MaxSlots()), pt); err != nil {
		return nil, fmt.Errorf("cannot encode the mask %s: %w", name, err)
	}
	e.encodeSec += nowSeconds() - t
	e.bv.masks[key] = pt
	return pt, nil
}

// blockMask is c on [lo, lo+n), d on [lo+n, lo+2n) (when two is set), 0 elsewhere.
func blockMask(n int, c, d complex128, two bool) func(int) []complex128 {
	return func(slots int) []complex128 {
		v := make([]complex128, slots)
		for s := 0; s < n; s++ {
			v[s] = c
			if two {
				v[n+s] = d
			}
		}
		return v
	}
}

// maskProducts is sum_j pts[j] * cts[j] (all at one level), rescaled: one level.
func (e *executor) maskProducts(cts []*rlwe.Ciphertext, pts []*rlwe.Plaintext) (*rlwe.Ciphertext, error) {
	out := e.newCt(cts[0].Level())
	if err := e.eval.Mul(cts[0], pts[0], out); err != nil {
		return nil, err
	}
	for j := 1; j < len(cts); j++ {
		if err := e.eval.MulThenAdd(cts[j], pts[j], out); err != nil {
			return nil, err
		}
	}
	r, err := e.rescale(out)
	e.recycle(out)
	return r, err
}

// sparseBootstrap bootstraps ct (left unchanged) at 2^k slots: the input's scale is
// relabelled by 1/gap so that the trace's block average reads as the block sum.
func (e *executor) sparseBootstrap(ev *bootstrapping.Evaluator, ct *rlwe.Ciphertext, k int, inScale float64) (*rlwe.Ciphertext, error) {
	cp := ct.CopyNew()
	gap := e.params.MaxSlots() >> k
	cp.Scale = cp.Scale.Div(rlwe.NewScale(float64(gap))).Mul(rlwe.NewScale(inScale)) // (in_scale: relabelled)
	// the bootstrapper reads the slot count from the ciphertext too (CoeffsToSlots repacks
	// the imaginary half by a rotation of 2^LogSlots): label it sparse; the trace makes it so
	cp.LogDimensions.Cols = k
	// Evaluate (here phase by phase: evaluatePhased), not Bootstrap: in Lattigo v6.1.1
	// Bootstrap (BootstrapMany's packing) returns wrong values for a sparse ciphertext when
	// both rings have the same degree (Lattigo issue #505, fixed after v6.1.1; measured
	// here: every slot wrong at log N 12 and 14)
	out, err := evaluatePhased(ev, cp, e.st.BootstrapPhases, e.keys.waitSeconds)
	if err != nil {
		return nil, err
	}
	out.Scale = ev.ResidualParameters.DefaultScale() // as Bootstrap sets it
	out.LogDimensions = ct.LogDimensions
	return out, nil
}

func scaleOf(in instr) float64 {
	if in.Scale == nil {
		return 1
	}
	return *in.Scale
}

func inScaleOf(in instr) float64 {
	if in.InScale == nil {
		return 1
	}
	return *in.InScale
}

// bootstrapVariant runs bootstrap {log_slots[, halves][, scale]} (see the top of the file).
func (e *executor) bootstrapVariant(in instr) error {
	k := *in.LogSlots
	ev, err := e.variantEvaluator(k)
	if err != nil {
		return err
	}
	ct, err := e.operand(in.Src, true)
	if err != nil {
		return err
	}
	t := time.Now()
	inLevel := ct.Level()
	n, sc := 1<<k, scaleOf(in)
	halves := in.Halves != nil && *in.Halves
	kind := variantKind(in)
	e.beginBootstrap(in)
	defer e.endBootstrap()
	if halves && (in.Premasked == nil || !*in.Premasked) {
		if ct.Level() < e.params.LevelsConsumedPerRescaling() {
			return fmt.Errorf("field \"halves\": register %q is at level %d, but the halves packing multiplies by a mask before the bootstrap and needs the source at level >= 1", in.Src, ct.Level())
		}
		pre, err := e.mask(fmt.Sprintf("pre/%d", k), ct.Level(), blockMask(n, 1, 1i, true))
		if err != nil {
			return err
		}
		if ct, err = e.maskProducts([]*rlwe.Ciphertext{ct}, []*rlwe.Plaintext{pre}); err != nil {
			return fmt.Errorf("halves mask of %q: %w", in.Src, err)
		}
		defer e.recycle(ct)
	}
	z, err := e.sparseBootstrap(ev, ct, k, inScaleOf(in))
	if err != nil {
		return fmt.Errorf("sparse bootstrap at 2^%d slots of %q (level %d, scale 2^%.3f): %w", k, in.Src, inLevel, ct.Scale.Log2(), err)
	}
	var out *rlwe.Ciphertext
	if in.Replicas != nil && *in.Replicas {
		// not unpacked: z holds the copies of slots [0, n) in every block; the scale, an
		// integer, multiplied exactly (no level), as after a full-slot bootstrap
		out = z
		if sc != 1 {
			if err = e.eval.Mul(z, complex(sc, 0), z); err != nil {
				return fmt.Errorf("sparse bootstrap of %q: the result times %v: %w", in.Src, sc, err)
			}
		}
	} else if !halves {
		m, err := e.mask(fmt.Sprintf("s/%d/%v", k, sc), z.Level(), blockMask(n, complex(sc, 0), 0, false))
		if err != nil {
			return err
		}
		out, err = e.maskProducts([]*rlwe.Ciphertext{z}, []*rlwe.Plaintext{m})
		if err != nil {
			return err
		}
	} else {
		cz := e.newCt(z.Level())
		if err = e.eval.Conjugate(z, cz); err != nil {
			return fmt.Errorf("conjugation after the sparse bootstrap: %w", err)
		}
		h := complex(sc/2, 0)
		p1, err := e.mask(fmt.Sprintf("h1/%d/%v", k, sc), z.Level(), blockMask(n, h, -1i*h, true))
		if err != nil {
			return err
		}
		p2, err := e.mask(fmt.Sprintf("h2/%d/%v", k, sc), z.Level(), blockMask(n, h, 1i*h, true))
		if err != nil {
			return err
		}
		if out, err = e.maskProducts([]*rlwe.Ciphertext{z, cz}, []*rlwe.Plaintext{p1, p2}); err != nil {
			return err
		}
		e.recycle(cz)
	}
	e.noteVariant(kind, inLevel, time.Since(t).Seconds())
	e.set(in.Dst, out)
	return nil
}

// bootstrapPair runs bootstrap2 {dsts, srcs, log_slots[, scale]}.
func (e *executor) bootstrapPair(in instr) error {
	k := *in.LogSlots
	ev, err := e.variantEvaluator(k)
	if err != nil {
		return err
	}
	for _, r := range in.Srcs {
		if _, err := e.operand(r, true); err != nil {
			return err
		}
	}
	x, y, err := e.binaryOperands(in.Srcs[0], in.Srcs[1])
	if err != nil {
		return err
	}
	t := time.Now()
	inLevel := min(x.Level(), y.Level())
	kind := variantKind(in)
	e.beginBootstrap(in)
	defer e.endBootstrap()
	z := e.newCt(inLevel)
	if err = e.eval.Mul(y, complex(0, 1), z); err != nil {
		return err
	}
	if err = e.eval.Add(z, x, z); err != nil {
		return err
	}
	zb, err := e.sparseBootstrap(ev, z, k, 1)
	e.recycle(z)
	if err != nil {
		return fmt.Errorf("sparse bootstrap at 2^%d slots of %q + i*%q (level %d): %w", k, in.Srcs[0], in.Srcs[1], inLevel, err)
	}
	cz := e.newCt(zb.Level())
	if err = e.eval.Conjugate(zb, cz); err != nil {
		return fmt.Errorf("conjugation after the sparse bootstrap: %w", err)
	}
	re, im := e.newCt(zb.Level()), e.newCt(zb.Level())
	if err = e.eval.Add(zb, cz, re); err != nil {
		return err
	}
	if err = e.eval.Sub(zb, cz, im); err != nil {
		return err
	}
	e.recycle(cz)
	n, h := 1<<k, complex(scaleOf(in)/2, 0)
	for j, part := range []struct {
		ct   *rlwe.Ciphertext
		name string
		c    complex128
	}{{re, "pa", h}, {im, "pb", -1i * h}} {
		m, err := e.mask(fmt.Sprintf("%s/%d/%v", part.name, k, scaleOf(in)), zb.Level(), blockMask(n, part.c, 0, false))
		if err != nil {
			return err
		}
		out, err := e.maskProducts([]*rlwe.Ciphertext{part.ct}, []*rlwe.Plaintext{m})
		if err != nil {
			return err
		}
		e.recycle(part.ct)
		e.set(in.Dsts[j], out)
	}
	e.noteVariant(kind, inLevel, time.Since(t).Seconds())
	return nil
}

// noteVariant records a variant's time (the whole instruction: masks, bootstrap, unpacking).
func (e *executor) noteVariant(kind string, level int, sec float64) {
	e.st.BootstrapSeconds = append(e.st.BootstrapSeconds, sec)
	e.st.BootstrapInLevels = append(e.st.BootstrapInLevels, level)
	for len(e.st.BootstrapKinds) < len(e.st.BootstrapSeconds)-1 {
		e.st.BootstrapKinds = append(e.st.BootstrapKinds, "full")
	}
	e.st.BootstrapKinds = append(e.st.BootstrapKinds, kind)
}
