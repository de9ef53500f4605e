package slotlattigo

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"sort"
	"strconv"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/polynomial"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
	"github.com/tuneinsight/lattigo/v6/utils/bignum"
)

// Level and scale policy (what the executor does so that any plan of SPEC section 4 runs):
//
//   - input: encrypted at the top level with the default scale 2^log_scale.
//   - pmul: the plaintext is encoded at the ciphertext's level with scale q_level (the
//     prime a rescale removes), so the following rescale restores the ciphertext's scale
//     exactly. cmul multiplies the scales (relinearised at once).
//   - An operand "carries an unrescaled product" when rescaling it would leave a scale of
//     at least 2^(log_scale/2). Before every multiplication (pmul, cmul, poly) such an
//     operand is rescaled automatically, so plans that never say "rescale" still work and
//     scales never overflow. The register is replaced by its rescaled value (same value).
//   - add/sub: operands whose scales differ are first auto-rescaled where possible (so a
//     fresh ciphertext plus an unrescaled product works). A remaining scale difference
//     (the drift of cmul results, whose scale is s_a*s_b/q, up to 2^-16 at n16boot)
//     between operands at different levels is removed exactly: the operand at the higher
//     level takes the other's scale with a constant product and a rescale (Lattigo's
//     SetScale; the sum is at the lower level anyway), counted as scale_sets. Between
//     operands at one level a relative difference below 2^-16 is absorbed by relabelling
//     one scale and reported as max_scale_fix; anything larger is an error. Operands at
//     different levels are combined at the lower level.
//   - padd/psub: the plaintext is encoded at the ciphertext's level and exact scale.
//   - rescale: a real Rescale when the operand carries an unrescaled product; otherwise the
//     value is passed through unchanged (counted as skipped_rescales), because dividing a
//     ciphertext at the default scale by q would destroy its precision.
//   - poly: Lattigo's polynomial evaluator (monomial basis, or Chebyshev basis for
//     basis "chebyshev"; baby-step giant-step); it uses ceil(log2(degree+1)) levels (none for
//     a constant), and one more for a Chebyshev domain other than [-1, 1] (the change of
//     variable (2x - a - b)/(b - a) is a constant multiplication and a rescale). Its target scale is the default
//     scale when the input's is within 2^-10 of it (this removes cmul drift), else the
//     input's scale.
//   - Multiplying at a level with nothing left to rescale is an error naming the register.
//   - rot/rot_hoisted: the key must be resident and generated at a level >= the
//     ciphertext's level (a lower-level key would give silently wrong results).
//   - bootstrap (bootstrapping plans, boot.go): an operand carrying an unrescaled product
//     is rescaled first; Lattigo's bootstrapper gets a copy at whatever level the operand
//     is (its ScaleDown drops the unneeded primes and matches the scale; at level 0 the
//     scale is the operand's own) and returns the value at the top residual level with
//     the default scale. The key block "boot" must be resident (load_key block "boot";
//     without a key schedule it is loaded up front with every other key).

type executor struct {
	params   ckks.Parameters
	top      int // level of fresh ciphertexts
	setup    *evalSetup
	btpEval  *bootstrapping.Evaluator // resident with the boot block
	bv       *bootVariants            // the sparse bootstrap variants' evaluators and masks (bootvariant.go)
	matBytes int64
	eval     *ckks.Evaluator
	polyEval *polynomial.Evaluator
	ecd      *ckks.Encoder
	emb      *embedder // ecd's Encode and Embed without per-coefficient allocations (encode.go)
	tracer   *opTracer // SLOTPLAN_OP_TRACE (optrace.go); nil: off
	store    *ptStore  // streamed plaintexts spilled and read back (ptstore.go); nil: none
	keys     *keyStore
	plan     *plan
	ptValues map[string][]float64
	ptFile   *plaintextFile // when set, plaintext vectors are read from it instead
	io       *ctIO          // input ciphertexts in, output ciphertexts out: nothing else

	scheduled bool
	regs      map[string]*rlwe.Ciphertext
	refs      map[*rlwe.Ciphertext]int
	lastUse   map[string]int
	nextBoot  []int // per instruction, the plan's next bootstrap (bootorder.go)

	liveBytes int64
	st        *stats

	// ciphertexts newCt made that no output holds: when their register dies they go to
	// the pool of the plaintext cache (ptCache.cts), reused by newCt
	owned   map[*rlwe.Ciphertext]bool
	freshMD rlwe.MetaData

	rescaleSec float64 // auto-rescale time inside the current instruction
	encodeSec  float64 // plaintext encoding time inside the current instruction
	cur        int     // index of the instruction being executed
	nInput     int
	nOutput    int

	// fused linear blocks (fused.go) and the plaintext cache
	cache        *ptCache
	fusion       *fusionPlan
	babies       map[string]*babyCache
	nWorkers     int
	sc           *evalScratch // eval, polyEval, ecd, emb, the workers and decomposition (kept in cache)
	fusedEvalSec float64
	prof         *phaseProfile    // phases of fused blocks (ProfileBlock; nil: not profiled)
	cins         *cinsPlan        // to_cins / fused bootstrap_cins (cins_exec.go)
	sumAcc       *rlwe.Ciphertext // degree-2 accumulator of product sums (relin.go)
	initErr      error            // a malformed "fused" annotation (plans not read by loadPlan)

	// the bootstrapping state (bootstate.go): its matrices while the block is resident;
	// keptBytes: those kept after the block's last drop for the next evaluation, until the
	// block is loaded again; bootKeep: the plan lets them stay (plan.bootKeepable)
	boot      *bootState
	keptBytes int64
	bootKeep  bool
}

// executorOptions: fuse linear blocks (default on), workers for fused blocks (0: GOMAXPROCS),
// a shared plaintext cache (nil: a fresh one per executor).
type executorOptions struct {
	NoFuse  bool
	Workers int
	Cache   *ptCache
	Store   *ptStore // run option plaintext_store (ptstore.go); nil: none
}

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// ctIO is all the evaluation side exchanges with the client: the input ciphertexts (one per
// "input" instruction, program order) and the output ciphertexts it hands back (one per
// "output" instruction). It is a concrete type holding ciphertexts only, so that nothing
// the executor holds can reach the client or its secret key (inference.go; the
// reflection test TestEvaluatorReachesNoSecret walks the types).
type ctIO struct {
	inputs  []*rlwe.Ciphertext
	outputs []*rlwe.Ciphertext
}

func (b *ctIO) input(n int) (*rlwe.Ciphertext, error) {
	if n >= len(b.inputs) {
		return nil, fmt.Errorf("no input ciphertext %d (%d given)", n, len(b.inputs))
	}
	return b.inputs[n], nil
}

func (b *ctIO) output(_ int, ct *rlwe.Ciphertext) error {
	b.outputs = append(b.outputs, ct)
	return nil
}

// reset prepares an executor for another evaluation of the same plan (the next sample of
// an evaluate call): fresh registers, io and stats; the evaluator, the plaintext cache, the
// fusion analysis and a resident bootstrapping block are kept.
func (e *executor) reset(io *ctIO, st *stats) {
	e.io, e.st = io, st
	e.regs = map[string]*rlwe.Ciphertext{}
	e.refs = map[*rlwe.Ciphertext]int{}
	e.owned = map[*rlwe.Ciphertext]bool{}
	e.babies = map[string]*babyCache{}
	e.liveBytes, e.nInput, e.nOutput, e.cur = 0, 0, 0, 0
	st.Workers = e.nWorkers
	if e.btpEval != nil { // keep-all: the block (keys and matrices) stayed resident
		st.BootMatrixBytes = e.matBytes
		st.BootKeyBytes = e.keys.block.bytes
		st.BootStateReused, st.BootStateKept = true, e.bootKeep
	}
}

func newExecutor(setup *evalSetup, keys *keyStore, p *plan, ptValues map[string][]float64, io *ctIO, st *stats, opts ...executorOptions) *executor {
	params := setup.params
	var opt executorOptions
	if len(opts) > 0 {
		opt = opts[0]
	}
	e := &executor{
		params:    params,
		top:       setup.top,
		setup:     setup,
		keys:      keys,
		plan:      p,
		ptValues:  ptValues,
		io:        io,
		scheduled: p.hasKeySchedule(),
		regs:      map[string]*rlwe.Ciphertext{},
		refs:      map[*rlwe.Ciphertext]int{},
		lastUse:   map[string]int{},
		owned:     map[*rlwe.Ciphertext]bool{},
		st:        st,
		cache:     opt.Cache,
		store:     opt.Store,
		babies:    map[string]*babyCache{},
		nWorkers:  opt.Workers,
	}
	if e.cache == nil {
		// one evaluation (slotplan run): every plaintext is encoded when read and not kept,
		// as the memory model assumes (a model-wide cache is BenchPlan's, across its runs)
		e.cache = newPtCache(-1)
	}
	e.sc = e.cache.scratchFor(params, keys)
	e.bootKeep, _ = p.bootKeepable()
	if e.bootKeep && e.cache.boot != nil { // an earlier evaluation's matrices, held until the block loads
		e.keptBytes = e.cache.boot.bytes
	}
	e.eval, e.polyEval, e.ecd, e.emb = e.sc.eval, e.sc.polyEval, e.sc.ecd, e.sc.emb
	e.tracer = currentTracer()
	if e.nWorkers <= 0 {
		e.nWorkers = runtime.GOMAXPROCS(0)
	}
	st.Workers = e.nWorkers
	e.cins = analyseCins(p, params.MaxSlots())
	if !opt.NoFuse && e.cins == nil { // (a CinS plan's convolutions fuse into its bootstraps: cins_exec.go)
		// the blocks of the plan's "fused" annotation, checked by loadPlan (fused.go)
		if p.fusion == nil {
			var err error
			if p.fusion, err = readFusion(p, params.MaxSlots()); err != nil {
				e.initErr = err
			}
		}
		e.fusion = p.fusion
	}
	for i, in := range p.Program {
		for _, r := range e.regsAt(i, in) {
			e.lastUse[r] = i
		}
	}
	e.nextBoot = nextBootstraps(p.Program)
	return e
}

// regsAt lists the registers instruction i reads or writes as executed (a fused block
// reads its bases and writes its root; skipped instructions touch nothing).
func (e *executor) regsAt(i int, in instr) []string {
	if e.cins != nil {
		if e.cins.skip[i] {
			return nil
		}
		if f := e.cins.fused[i]; f != nil {
			return append(f.bases, in.Dsts...)
		}
	}
	if e.fusion != nil {
		if f := e.fusion.roots[i]; f != nil {
			return append(f.bases(), e.fusion.rootDst[i])
		}
		if ps := e.fusion.sums[i]; ps != nil {
			return append(ps.regs(), e.fusion.rootDst[i])
		}
		if e.fusion.skip[i] {
			return nil
		}
	}
	return append(in.uses(), in.defs()...)
}

// exec runs instruction i: a fused block, nothing (absorbed into one), or the instruction.
func (e *executor) exec(i int, in instr) (string, error) {
	if e.cins != nil && e.cins.skip[i] {
		return "", nil // part of a convolution fused into a bootstrap_cins
	}
	if e.fusion != nil {
		if f := e.fusion.roots[i]; f != nil {
			out, err := e.evalFused(f)
			if err != nil {
				return "", err
			}
			e.set(e.fusion.rootDst[i], out)
			return "bsgs_block", nil
		}
		if ps := e.fusion.sums[i]; ps != nil {
			out, err := e.evalProductSum(ps)
			if err != nil {
				return "", err
			}
			e.set(e.fusion.rootDst[i], out)
			return "cmul_sum", nil
		}
		if e.fusion.skip[i] {
			if e.fusion.pre[i] {
				return "", e.preBabies(in)
			}
			return "", nil
		}
	}
	e.cur = i
	if err := e.step(in); err != nil {
		return in.Op, err
	}
	return in.Op, e.dropLevel(i, in)
}

// dropLevel drops the register an input or full-slot bootstrap wrote to the level the plan
// hand-over gives it (plan.LevelDrops): the levels above are ones no consumer until the
// next bootstrap uses, and every operation on it and its descendants then runs on fewer
// primes. The dropped ciphertext is a new one (an input belongs to the caller); Lattigo's
// DropLevel itself only truncates.
func (e *executor) dropLevel(i int, in instr) error {
	lv, ok := e.plan.LevelDrops[strconv.Itoa(i)]
	if !ok || (in.Op != "input" && in.Op != "bootstrap") {
		return nil
	}
	ct := e.regs[in.Dst]
	if ct == nil || ct.Level() <= lv {
		return nil
	}
	if lv < 0 {
		return fmt.Errorf("level_drops[%d] = %d is below 0", i, lv)
	}
	out := e.newCt(lv)
	for j := range out.Value {
		for k := range out.Value[j].Coeffs {
			copy(out.Value[j].Coeffs[k], ct.Value[j].Coeffs[k])
		}
	}
	*out.MetaData = *ct.MetaData
	e.set(in.Dst, out)
	e.st.LevelDrops += ct.Level() - lv
	return nil
}

func (e *executor) run() (err error) {
	if e.initErr != nil {
		return e.initErr
	}
	defer func() {
		if err != nil {
			// a failed evaluation lets go of a streamed block: its reader ends, its mapped
			// keys are unmapped (pagecache.go), and the store holds no block afterwards
			e.keys.dropBlock()
		}
	}()
	if e.scheduled && e.plan.usesConjugation() {
		// the conjugation key is resident throughout (docs/formats.md): no schedule places it
		if err := e.keys.load(conjOffset); err != nil {
			return fmt.Errorf("conjugation key: %w", err)
		}
	}
	if !e.scheduled {
		if err := e.keys.loadAll(); err != nil {
			return fmt.Errorf("keep-all key policy: %w", err)
		}
		if e.keys.hasBlock() {
			if err := e.loadBlock(-1); err != nil {
				return fmt.Errorf("keep-all key policy: %w", err)
			}
		}
	}
	for i, in := range e.plan.Program {
		t := time.Now()
		e.rescaleSec, e.encodeSec = 0, 0
		op, err := e.exec(i, in)
		if err != nil {
			return fmt.Errorf("instruction %d (%s): %w", i, in.Op, err)
		}
		e.afterStep(i, in, op, time.Since(t).Seconds()-e.rescaleSec)
	}
	return nil
}

// set binds a register (nil unbinds it) and keeps the live ciphertext bytes; registers
// may share one ciphertext (skipped rescale, duplicate hoisted offsets).
func (e *executor) set(name string, ct *rlwe.Ciphertext) {
	if old, ok := e.regs[name]; ok {
		e.refs[old]--
		if e.refs[old] == 0 {
			delete(e.refs, old)
			e.liveBytes -= int64(old.BinarySize())
			e.recycle(old)
		}
		delete(e.regs, name)
	}
	if ct == nil {
		return
	}
	if e.refs[ct] == 0 {
		e.liveBytes += int64(ct.BinarySize())
	}
	e.refs[ct]++
	e.regs[name] = ct
}

// ctPoolBytes bounds the free ciphertexts kept for reuse (at least ctPoolMin per level).
const (
	ctPoolBytes = 64 << 20
	ctPoolMin   = 16
)

// newCt returns a ciphertext at level: one a dead register left (ptCache.cts: across
// evaluations when the cache is kept, as BenchPlan's) or a new one. Reuse avoids the
// allocation and zeroing of a fresh ciphertext per instruction (a hoisted group of 63
// rotations at n13: ~0.3 ms per rotation).
func (e *executor) newCt(level int) *rlwe.Ciphertext {
	c := e.cache
	if free := c.cts[level]; len(free) > 0 {
		ct := free[len(free)-1]
		c.cts[level] = free[:len(free)-1]
		c.ctBytes -= int64(ct.BinarySize())
		*ct.MetaData = e.freshMD // as a fresh ciphertext's (the operation sets its own)
		e.owned[ct] = true
		return ct
	}
	ct := ckks.NewCiphertext(e.params, 1, level)
	if e.freshMD.LogDimensions.Cols == 0 {
		e.freshMD = *ct.MetaData
	}
	e.owned[ct] = true
	return ct
}

// recycle keeps a dead register's ciphertext for newCt (only those newCt made and nothing
// else holds: not an input, not an output handed over).
func (e *executor) recycle(ct *rlwe.Ciphertext) {
	if !e.owned[ct] {
		return
	}
	delete(e.owned, ct)
	c, lv, n := e.cache, ct.Level(), int64(ct.BinarySize())
	if ct.Degree() != 1 || (c.ctBytes+n > ctPoolBytes && len(c.cts[lv]) >= ctPoolMin) {
		return
	}
	c.cts[lv] = append(c.cts[lv], ct)
	c.ctBytes += n
}

// rescaleFactor is the scale one rescale divides by at this level.
func (e *executor) rescaleFactor(level int) rlwe.Scale {
	f := rlwe.NewScale(1)
	q := e.params.Q()
	for i := 0; i < e.params.LevelsConsumedPerRescaling(); i++ {
		f = f.Mul(rlwe.NewScale(q[level-i]))
	}
	return f
}

// canRescale: the ciphertext carries an unrescaled product (see the policy above).
func (e *executor) canRescale(ct *rlwe.Ciphertext) bool {
	if ct.Level() < e.params.LevelsConsumedPerRescaling() {
		return false
	}
	// math.Log2 of the float64 value: Scale.Log2 (an arbitrary-precision logarithm) costs
	// ~60 us, which adds up over thousands of operations
	return math.Log2(ct.Scale.Div(e.rescaleFactor(ct.Level())).Float64()) >= float64(e.params.LogDefaultScale())/2
}

func (e *executor) rescale(ct *rlwe.Ciphertext) (*rlwe.Ciphertext, error) {
	out := e.newCt(ct.Level() - e.params.LevelsConsumedPerRescaling())
	if err := e.eval.Rescale(ct, out); err != nil {
		return nil, err
	}
	return out, nil
}

// operand returns a register's ciphertext, first rescaling it (and rebinding the
// register) when it carries an unrescaled product and rescaleFirst is set.
func (e *executor) operand(name string, rescaleFirst bool) (*rlwe.Ciphertext, error) {
	ct := e.regs[name]
	if ct == nil {
		return nil, fmt.Errorf("register %q is not live", name)
	}
	if !rescaleFirst || !e.canRescale(ct) {
		return ct, nil
	}
	t := time.Now()
	out, err := e.rescale(ct)
	if err != nil {
		return nil, fmt.Errorf("automatic rescale of %q: %w", name, err)
	}
	d := time.Since(t).Seconds()
	e.rescaleSec += d
	e.st.addOp("auto_rescale", d)
	e.set(name, out)
	return out, nil
}

// checkMulLevel refuses a multiplication whose result could not be rescaled.
func (e *executor) checkMulLevel(name string, ct *rlwe.Ciphertext, levels int) error {
	if need := levels * e.params.LevelsConsumedPerRescaling(); ct.Level() < need {
		return fmt.Errorf("register %q is at level %d but this multiplication needs %d level(s): the plan uses more multiplicative depth than log_q provides (%d levels)",
			name, ct.Level(), need, e.top)
	}
	return nil
}

// maxPolyMaskValues is planner.ir.MAX_POLY_MASK_VALUES: the most distinct nonzero values of a
// poly's mask (one polynomial, and a plaintext per coefficient, each).
const maxPolyMaskValues = 16

// maskedPoly evaluates mask * poly(ct) at poly's depth: Lattigo's PolynomialVector with
// poly times v on the slots where the mask is v (one polynomial per distinct nonzero v, in
// increasing order of real then imaginary part) and zero on the slots where it is 0; the
// products by the coefficients are products by plaintext vectors, so the mask costs no
// level of its own. A complex mask (complex coefficients) packs a premasked halves
// bootstrap's source (bootvariant.go).
func (e *executor) maskedPoly(ct *rlwe.Ciphertext, in instr, d int, target rlwe.Scale) (*rlwe.Ciphertext, error) {
	raw, err := e.ptVector(in.Mask)
	if err != nil {
		return nil, err
	}
	var vals []complex128
	switch v := raw.(type) {
	case []float64:
		vals = make([]complex128, len(v))
		for s, x := range v {
			vals[s] = complex(x, 0)
		}
	case []complex128: // a halves bootstrap's packing (its high half times i: premasked)
		vals = v
	default:
		return nil, fmt.Errorf("poly: the mask %q must be a slot plaintext", in.Mask)
	}
	bySlot := map[complex128][]int{}
	for s, v := range vals {
		if v != 0 {
			bySlot[v] = append(bySlot[v], s)
		}
	}
	if len(bySlot) > maxPolyMaskValues {
		return nil, fmt.Errorf("poly: the mask %q holds %d distinct nonzero values (at most %d)", in.Mask, len(bySlot), maxPolyMaskValues)
	}
	keys := make([]complex128, 0, len(bySlot))
	for v := range bySlot {
		keys = append(keys, v)
	}
	sort.Slice(keys, func(a, b int) bool {
		if real(keys[a]) != real(keys[b]) {
			return real(keys[a]) < real(keys[b])
		}
		return imag(keys[a]) < imag(keys[b])
	})
	newPoly := func(v complex128) bignum.Polynomial {
		c := make([]complex128, d+1)
		for k := range c {
			c[k] = complex(in.Coeffs[k], 0) * v
		}
		if in.Basis == "chebyshev" {
			return bignum.NewPolynomial(bignum.Chebyshev, c, [2]float64{in.Domain[0], in.Domain[1]})
		}
		return bignum.NewPolynomial(bignum.Monomial, c, nil)
	}
	polys := make([]bignum.Polynomial, 0, max(1, len(keys)))
	mapping := make(map[int][]int, len(keys))
	for j, v := range keys {
		polys = append(polys, newPoly(v))
		mapping[j] = bySlot[v]
	}
	if len(keys) == 0 { // a mask of zeros: the poly times 0 on no slot (all slots 0)
		polys = append(polys, newPoly(0))
	}
	pv, err := polynomial.NewPolynomialVector(polys, mapping)
	if err != nil {
		return nil, fmt.Errorf("poly: the mask %q: %w", in.Mask, err)
	}
	return e.polyEval.Evaluate(ct, pv, target)
}

// chebyshevVariable maps x to (2x - a - b)/(b - a), the variable of a Chebyshev series over
// [a, b] (Lattigo's evaluator expects it done): a constant multiplication and a rescale.
func (e *executor) chebyshevVariable(ct *rlwe.Ciphertext, poly bignum.Polynomial) (*rlwe.Ciphertext, error) {
	scalar, constant := poly.ChangeOfBasis()
	out, err := e.eval.MulNew(ct, scalar)
	if err != nil {
		return nil, err
	}
	if err = e.eval.Add(out, constant, out); err != nil {
		return nil, err
	}
	if err = e.eval.Rescale(out, out); err != nil {
		return nil, err
	}
	return out, nil
}

// setScale returns a copy of ct whose scale is exactly scale (same value; one level less):
// an operand at a higher level meets the other's scale exactly (policy above). The register
// keeps ct (its other readers expect its scale). The copy is the add's operand only: not
// from newCt's pool (owned ciphertexts stay referenced until the evaluation ends), so the
// collector frees it after the add.
func (e *executor) setScale(ct *rlwe.Ciphertext, scale rlwe.Scale) (*rlwe.Ciphertext, error) {
	t := time.Now()
	out := ct.CopyNew()
	if err := e.eval.SetScale(out, scale); err != nil {
		return nil, fmt.Errorf("matching the scale 2^%.3f at level %d: %w", scale.Log2(), ct.Level(), err)
	}
	e.st.ScaleSets++
	e.st.addOp("scale_set", time.Since(t).Seconds())
	return out, nil
}

// binaryOperands prepares add/sub operands so that their scales agree (policy above).
func (e *executor) binaryOperands(an, bn string) (*rlwe.Ciphertext, *rlwe.Ciphertext, error) {
	a, b := e.regs[an], e.regs[bn]
	if a.Scale.Cmp(b.Scale) != 0 {
		var err error
		if a, err = e.operand(an, true); err != nil {
			return nil, nil, err
		}
		if b, err = e.operand(bn, true); err != nil {
			return nil, nil, err
		}
	}
	if a.Scale.Cmp(b.Scale) != 0 && a.Level() != b.Level() {
		var err error
		if a.Level() > b.Level() {
			a, err = e.setScale(a, b.Scale)
		} else {
			b, err = e.setScale(b, a.Scale)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if a.Scale.Cmp(b.Scale) != 0 {
		ratio := a.Scale.Div(b.Scale).Float64()
		rel := math.Abs(ratio - 1)
		if rel > 1.0/65536 {
			return nil, nil, fmt.Errorf("operands %q (level %d, scale 2^%.3f) and %q (level %d, scale 2^%.3f) have incompatible scales",
				an, a.Level(), a.Scale.Log2(), bn, b.Level(), b.Scale.Log2())
		}
		// Relabel b's scale (shallow copy: the polynomials are shared, read only).
		md := *b.MetaData
		md.Scale = a.Scale
		b = &rlwe.Ciphertext{Element: rlwe.Element[ring.Poly]{Value: b.Value, MetaData: &md}}
		if rel > e.st.MaxScaleFix {
			e.st.MaxScaleFix = rel
		}
	}
	return a, b, nil
}

// plaintext returns plaintext name encoded at (level, scale), from the cache when it was
// encoded before (by this evaluation or an earlier one of the same model).
func (e *executor) plaintext(name string, level int, scale rlwe.Scale) (*rlwe.Plaintext, error) {
	key := ptKey{name, level, scale.Float64()}
	c := e.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if pt, ok := c.q[key]; ok {
		return pt, nil
	}
	t := nowSeconds()
	pt := ckks.NewPlaintext(e.params, level)
	pt.Scale = scale
	values, err := e.ptVector(name)
	if err != nil {
		return nil, err
	}
	if err := e.emb.encode(values, pt); err != nil {
		return nil, fmt.Errorf("cannot encode plaintext %q: %w", name, err)
	}
	d := nowSeconds() - t
	c.seconds += d
	e.encodeSec += d
	if c.keep(int64(pt.BinarySize())) {
		c.q[key] = pt
	}
	return pt, nil
}

// ptVector returns plaintext name's values as the encoder takes them: []float64, or
// []complex128 for a complex plaintext (packed as 2*slots values: real, then imaginary).
func (e *executor) ptVector(name string) (any, error) {
	return e.ptVectorInto(name, nil)
}

// vecBuffers are a reader's buffers for ptVectorInto (nil: fresh slices).
type vecBuffers struct {
	raw  []byte
	vals []float64
	cplx []complex128
}

// ptVectorInto is ptVector reading through b's buffers when b is not nil: the result
// aliases them and is valid until the next call with b.
func (e *executor) ptVectorInto(name string, b *vecBuffers) (any, error) {
	vals, ok := e.ptValues[name]
	if e.ptFile != nil { // large models pass their plaintexts through a file
		var err error
		if b == nil {
			vals, err = e.ptFile.vector(name)
		} else {
			vals, err = e.ptFile.vectorInto(name, &b.raw, &b.vals)
		}
		if err != nil {
			return nil, err
		}
		ok = true
	}
	if !ok {
		return nil, fmt.Errorf("no values for plaintext %q", name)
	}
	slots := e.params.MaxSlots()
	if l := e.plan.Plaintexts[name].L; l > 0 { // a cins(l) plaintext: its CinS slots
		if len(vals) != 2*slots {
			return nil, fmt.Errorf("cins plaintext %q: %d values, expected %d local coefficients", name, len(vals), 2*slots)
		}
		return cinsSlots(vals, l), nil
	}
	if e.plan.Plaintexts[name].ImagTable == "" {
		return vals, nil
	}
	if len(vals) != 2*slots {
		return nil, fmt.Errorf("complex plaintext %q: %d values, expected %d (real, then imaginary parts)", name, len(vals), 2*slots)
	}
	var cv []complex128
	if b != nil && cap(b.cplx) >= slots {
		cv = b.cplx[:slots]
	} else {
		cv = make([]complex128, slots)
		if b != nil {
			b.cplx = cv
		}
	}
	for s := range cv {
		cv[s] = complex(vals[s], vals[slots+s])
	}
	return cv, nil
}

// inPlace: the register's ciphertext may be overwritten by instruction i (its last use,
// held by no other register).
func (e *executor) inPlace(name string, i int) *rlwe.Ciphertext {
	ct := e.regs[name]
	if ct == nil || e.lastUse[name] != i || e.refs[ct] != 1 {
		return nil
	}
	return ct
}

// rotationKey checks that the key for offset k can rotate ct.
func (e *executor) rotationKey(k int, ct *rlwe.Ciphertext) error {
	gk := e.keys.residentKey(k)
	if gk == nil && k == conjOffset {
		return fmt.Errorf("no conjugation key")
	}
	if gk == nil {
		if e.scheduled {
			return fmt.Errorf("no key for k=%d resident (the key schedule must load_key it before this rotation)", k)
		}
		return fmt.Errorf("no key for k=%d", k)
	}
	if gk.LevelQ() < ct.Level() && k == conjOffset {
		return fmt.Errorf("the conjugation key was generated at level %d, below the ciphertext's level %d", gk.LevelQ(), ct.Level())
	}
	if gk.LevelQ() < ct.Level() {
		return fmt.Errorf("rotation key k=%d was generated at level %d, below the ciphertext's level %d (it would give wrong results)",
			k, gk.LevelQ(), ct.Level())
	}
	return nil
}

func (e *executor) step(in instr) error {
	switch in.Op {
	case "input":
		ct, err := e.io.input(e.nInput)
		if err != nil {
			return err
		}
		e.nInput++
		e.set(in.Dst, ct)

	case "output":
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		if err = e.io.output(e.nOutput, ct); err != nil {
			return err
		}
		delete(e.owned, ct) // handed over: never reused
		e.nOutput++

	case "rot":
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		if err = e.rotationKey(*in.K, ct); err != nil {
			return err
		}
		out := e.newCt(ct.Level())
		if err = e.eval.Rotate(ct, *in.K, out); err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "rot_hoisted":
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		outs := map[int]*rlwe.Ciphertext{}
		var ks []int
		for _, k := range in.Ks {
			if err = e.rotationKey(k, ct); err != nil {
				return err
			}
			if _, ok := outs[k]; !ok {
				outs[k] = e.newCt(ct.Level())
				ks = append(ks, k)
			}
		}
		if err = e.eval.RotateHoisted(ct, ks, outs); err != nil {
			return err
		}
		for j, k := range in.Ks {
			e.set(in.Dsts[j], outs[k])
		}

	case "add", "sub":
		a, b, err := e.binaryOperands(in.A, in.B)
		if err != nil {
			return err
		}
		// in place into a when this is a's last use (no allocation)
		out := e.inPlace(in.A, e.cur)
		if out != a || in.A == in.B || a.Level() != b.Level() || out.BinarySize() != a.BinarySize() {
			out = e.newCt(min(a.Level(), b.Level()))
		}
		if in.Op == "add" {
			err = e.eval.Add(a, b, out)
		} else {
			err = e.eval.Sub(a, b, out)
		}
		if err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "padd", "psub":
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		pt, err := e.plaintext(in.Pt, ct.Level(), ct.Scale)
		if err != nil {
			return err
		}
		out := e.newCt(ct.Level())
		if in.Op == "padd" {
			err = e.eval.Add(ct, pt, out)
		} else {
			err = e.eval.Sub(ct, pt, out)
		}
		if err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "pmul":
		ct, err := e.operand(in.Src, true)
		if err != nil {
			return err
		}
		if err = e.checkMulLevel(in.Src, ct, 1); err != nil {
			return err
		}
		pt, err := e.plaintext(in.Pt, ct.Level(), e.rescaleFactor(ct.Level()))
		if err != nil {
			return err
		}
		out := e.inPlace(in.Src, e.cur)
		if out != ct {
			out = e.newCt(ct.Level())
		}
		if err = e.eval.Mul(ct, pt, out); err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "cmul":
		a, err := e.operand(in.A, true)
		if err != nil {
			return err
		}
		b, err := e.operand(in.B, true)
		if err != nil {
			return err
		}
		if err = e.checkMulLevel(in.A, a, 1); err != nil {
			return err
		}
		if err = e.checkMulLevel(in.B, b, 1); err != nil {
			return err
		}
		rlk, err := e.keys.GetRelinearizationKey()
		if err != nil {
			return fmt.Errorf("no relinearisation key resident: %w", err)
		}
		if lv := min(a.Level(), b.Level()); rlk.LevelQ() < lv {
			return fmt.Errorf("the relinearisation key was generated at level %d, below the operands' level %d (it would give wrong results)",
				rlk.LevelQ(), lv)
		}
		out := e.newCt(min(a.Level(), b.Level()))
		if err = e.eval.MulRelin(a, b, out); err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "poly":
		ct, err := e.operand(in.Src, true)
		if err != nil {
			return err
		}
		d := polyDegree(in.Coeffs)
		var out *rlwe.Ciphertext
		if d == 0 {
			// c0 everywhere: 0 * ct + c0 keeps level and scale.
			if out, err = e.eval.MulNew(ct, 0); err == nil {
				err = e.eval.Add(out, in.Coeffs[0], out)
			}
		} else {
			cheb := in.Basis == "chebyshev"
			levels := bits.Len(uint(d))
			if cheb && !in.unitDomain() {
				levels++ // the change of variable multiplies by a constant
			}
			if err = e.checkMulLevel(in.Src, ct, levels); err != nil {
				return err
			}
			// Target the default scale when the input is close to it: this also removes
			// the small scale drift that cmul results carry.
			target := ct.Scale
			if math.Abs(ct.Scale.Div(e.params.DefaultScale()).Float64()-1) < 1.0/1024 {
				target = e.params.DefaultScale()
			}
			var poly bignum.Polynomial
			if cheb {
				poly = bignum.NewPolynomial(bignum.Chebyshev, in.Coeffs[:d+1], [2]float64{in.Domain[0], in.Domain[1]})
				if !in.unitDomain() {
					if ct, err = e.chebyshevVariable(ct, poly); err != nil {
						return err
					}
				}
			} else {
				poly = bignum.NewPolynomial(bignum.Monomial, in.Coeffs[:d+1], nil)
			}
			if in.Mask != "" {
				out, err = e.maskedPoly(ct, in, d, target)
			} else {
				out, err = e.polyEval.Evaluate(ct, poly, target)
			}
		}
		if err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "rescale":
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		if !e.canRescale(ct) {
			e.st.SkippedRescales++
			e.set(in.Dst, ct)
			return nil
		}
		out, err := e.rescale(ct)
		if err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "bootstrap2":
		return e.bootstrapPair(in)

	case "bootstrap":
		if in.LogSlots != nil {
			return e.bootstrapVariant(in)
		}
		if e.btpEval == nil {
			return fmt.Errorf("the key block \"boot\" is not resident (the key schedule must load_key block \"boot\" before a bootstrap)")
		}
		ct, err := e.operand(in.Src, true)
		if err != nil {
			return err
		}
		e.beginBootstrap(in)
		out, sec, err := bootstrapCt(e.btpEval, ct, inScaleOf(in)) // (in_scale: relabelled, bootvariant.go)
		e.endBootstrap()
		if err != nil {
			return fmt.Errorf("bootstrap of %q (level %d, scale 2^%.3f, in_scale %v): %w", in.Src, ct.Level(), ct.Scale.Log2(), inScaleOf(in), err)
		}
		if in.Scale != nil && *in.Scale != 1 { // an integer: exact, no level
			up := e.newCt(out.Level())
			if err = e.eval.Mul(out, complex(*in.Scale, 0), up); err != nil {
				return fmt.Errorf("bootstrap of %q: the result times %v: %w", in.Src, *in.Scale, err)
			}
			out = up
		}
		e.st.BootstrapSeconds = append(e.st.BootstrapSeconds, sec)
		e.st.BootstrapInLevels = append(e.st.BootstrapInLevels, ct.Level())
		e.st.BootstrapKinds = append(e.st.BootstrapKinds, "full")
		e.set(in.Dst, out)

	case "to_cins":
		return e.toCins(in)

	case "bootstrap_cins":
		return e.bootstrapCins(in)

	case "mul_i": // i * src: a Gaussian-integer constant, exact (no scale, no level)
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		out := e.newCt(ct.Level())
		if err = e.eval.Mul(ct, complex(0, 1), out); err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "conj": // one key switch with the conjugation key
		ct, err := e.operand(in.Src, false)
		if err != nil {
			return err
		}
		if err = e.rotationKey(conjOffset, ct); err != nil {
			return err
		}
		out := e.newCt(ct.Level())
		if err = e.eval.Conjugate(ct, out); err != nil {
			return err
		}
		e.set(in.Dst, out)

	case "load_key":
		if in.Block != "" {
			stream := -1
			if in.Stream != nil {
				stream = *in.Stream
			}
			return e.loadBlock(stream)
		}
		return e.keys.load(*in.K)

	case "drop_key":
		if in.Block != "" {
			e.dropBlock()
			return nil
		}
		e.keys.drop(*in.K)

	default:
		return fmt.Errorf("unknown op %q", in.Op)
	}
	return nil
}

// afterStep records an executed instruction's time and rotations, tracks the peak of live
// ciphertext bytes, and frees the registers the instruction used for the last time.
func (e *executor) afterStep(i int, in instr, op string, seconds float64) {
	if op != "" {
		e.st.addOp(op, seconds)
		if tr := e.tracer; tr != nil {
			level := -1
			if ct := e.regs[in.Dst]; ct != nil {
				level = ct.Level()
			}
			tr.record(i, op, level, seconds)
		}
	}
	if op == "rot_hoisted" {
		e.st.Rotations += len(in.Ks)
	} else if op == "rot" || op == "conj" { // (a conjugation is a key switch: counted as the plan does)
		e.st.Rotations++
	}
	if e.liveBytes > e.st.PeakCiphertextBytes {
		e.st.PeakCiphertextBytes = e.liveBytes
	}
	e.notePeak()
	for _, r := range e.regsAt(i, in) {
		if e.lastUse[r] == i {
			e.set(r, nil)
		}
	}
}

// notePeak tracks the largest sum of what the memory model counts: live ciphertexts,
// resident keys (plan keys and the boot block), the relinearisation key and the resident
// DFT matrices (and those kept for the next evaluation after the block's last drop:
// keptBytes, bootstate.go).
func (e *executor) notePeak() {
	if kb := e.keys.residentBytes + e.matBytes + e.keptBytes; kb > e.st.PeakKeyBlockBytes {
		e.st.PeakKeyBlockBytes = kb
	}
	total := e.liveBytes + e.keys.residentBytes + e.matBytes + e.keptBytes
	if e.keys.rlk != nil {
		total += int64(e.keys.rlk.BinarySize())
	}
	if total > e.st.PeakTrackedBytes {
		e.st.PeakTrackedBytes = total
	}
}

// loadBlock makes the bootstrapping block resident: the DFT matrices are encoded first
// (under stand-in keys, boot.go) unless an earlier evaluation left them (bootstate.go), then
// the block's keys are read from the key directory and the bootstrapping evaluator is wired
// to the executor's evaluator.
func (e *executor) loadBlock(stream int) error {
	if e.btpEval != nil {
		return nil
	}
	if e.setup.btp == nil {
		return fmt.Errorf("the plan's params carry no \"boot\" object")
	}
	galEls := e.setup.blockKeys().galEls // the full-slot bootstrap's and the variants' (bootvariant.go)
	bs, reused, err := e.bootStateFor(galEls)
	if err != nil {
		return err
	}
	if reused {
		e.st.BootStateReused = true
	} else {
		e.st.BootMatrixSeconds += bs.seconds
		e.st.BootMatrixBuilds++
		e.encodeSec += bs.seconds // encoding public matrices: model preparation, timed apart (runTimed)
	}
	e.boot, e.keptBytes = bs, 0
	ev := copyEvaluator(bs.full)
	e.useVariantEvaluators(bs)
	e.matBytes = bs.bytes
	e.st.BootMatrixBytes = e.matBytes
	if err = e.keys.loadBlock(stream); err != nil {
		return err
	}
	wireBootEvaluator(ev, e.eval, e.keys.block)
	e.wireVariantEvaluators()
	e.btpEval = ev
	e.st.BootKeyBytes = e.keys.block.bytes
	if !e.scheduled {
		// keep-all: the block stays resident to the end, the state for the next evaluation
		e.keepBootState(e.bootKeep)
	}
	e.notePeak()
	return nil
}

// dropBlock forgets the bootstrapping block (keys and matrices). At the program's last
// drop of a plan that lets it (plan.bootKeepable), the matrices stay for the next
// evaluation (bootstate.go): tracked as kept bytes until the block is loaded again.
func (e *executor) dropBlock() {
	e.keys.dropBlock()
	keep := e.bootKeep && e.plan.isLastBlockDrop(e.cur)
	e.keepBootState(keep)
	if keep && e.boot != nil {
		e.keptBytes = e.boot.bytes
	}
	e.boot = nil
	e.btpEval = nil
	if e.bv != nil {
		e.bv.evs = nil
	}
	e.matBytes = 0
	releaseMemory()
}
