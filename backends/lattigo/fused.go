package slotlattigo

import (
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// Fused linear blocks (what Lattigo's lintrans does, recognised in any plan).
//
// A plan of SPEC section 4 spells a diagonal matrix product as rotations of one ciphertext
// x (rot_hoisted / rot: the baby steps), a pmul of each rotation (or of x itself) by a
// plaintext, add trees over those products, a rescale, a rotation of each partial sum (the
// giant steps) and an add tree over the giant steps:
//
//	y = sum_g rot_g( sum_{(b, pt) in g} pt * rot_b(x) )    (rescaled once, or not at all)
//
// The executor recognises such a block from the dataflow alone (no attribute, no new op;
// a plan stays executable instruction by instruction) and evaluates it like lintrans'
// MultiplyByDiagMatrixBSGS, with double hoisting:
//
//   - x's c1 is decomposed once; every baby step is a lazy hoisted automorphism kept in
//     the extended basis QP (no ModDown) and cached for every block on the same x;
//   - plaintexts are encoded once in QP at x's level (cached across evaluations, see
//     ptCache) and multiplied-accumulated lazily in QP;
//   - per giant step one ModDown (of c1) and one key switch; the giant steps accumulate in
//     QP and the block ends with one ModDown per output polynomial and one Rescale when
//     the plan rescales the block;
//   - the giant steps (and the baby steps) are split over the executor's workers (one
//     Lattigo evaluator each; partial sums added in QP at the end).
//
// Recognition rules (abstract interpretation of the program, fusionAnalysis):
//   - a "baby" is a register written by rot_hoisted/rot of a register that is no linear
//     form; pmul of a baby (or of any other register that is no form: beta 0) starts a form;
//   - add of two forms on the same x with the same rescale state merges them (groups with
//     the same giant offset merge); rescale marks a not-yet-rescaled form rescaled; rot of
//     a form made only of unrotated products makes it one giant step;
//   - a form is absorbed into the instruction that consumes it only when that is its only
//     use; a form that is not absorbed is a root: it is evaluated fused where its last
//     instruction stood (when it has more than one product or any rotation), and the
//     instructions of its tree are skipped. Rotations whose every use is skipped are
//     skipped too.
//   - under a key schedule (load_key/drop_key) only blocks of two or more products are
//     fused; their skipped baby rotations are computed
//     where they stand, into the block's baby cache (their keys are resident there, and
//     the schedule may drop them right after), and a block is fused only when the keys it
//     still needs at its root stay resident until then: its giant rotations' keys, and
//     those of baby rotations that also run as instructions (no drop_key of the offset
//     and no drop of the block "boot" in between); the other blocks run instruction by
//     instruction.

type fTerm struct {
	beta  int
	pt    string
	rotAt int // the instruction of the baby rotation (-1: beta 0, no rotation)
}

type fForm struct {
	base     string
	groups   map[int][]fTerm // giant offset -> products
	rescaled bool
	rotated  bool // some group carries its giant rotation (no further rot)
	instrs   []int
	// giant offsets the plan rotates after the form's rescale (one level below the base,
	// where the fused block rotates): their keys may have been generated a level lower
	lowGiants map[int]bool
}

func (f *fForm) terms() int {
	n := 0
	for _, g := range f.groups {
		n += len(g)
	}
	return n
}

func (f *fForm) worth() bool {
	if f.terms() > 1 {
		return true
	}
	for g, ts := range f.groups {
		if g != 0 {
			return true
		}
		for _, t := range ts {
			if t.beta != 0 {
				return true
			}
		}
	}
	return false
}

// gammas returns the giant offsets in increasing order.
func (f *fForm) gammas() []int {
	out := make([]int, 0, len(f.groups))
	for g := range f.groups {
		out = append(out, g)
	}
	sort.Ints(out)
	return out
}

func mergeForms(a, b *fForm, rotated bool) *fForm {
	out := &fForm{base: a.base, groups: map[int][]fTerm{}, rescaled: a.rescaled, rotated: rotated,
		lowGiants: map[int]bool{}}
	for _, f := range []*fForm{a, b} {
		for g := range f.lowGiants {
			out.lowGiants[g] = true
		}
		for g, ts := range f.groups {
			out.groups[g] = append(out.groups[g], ts...)
		}
		out.instrs = append(out.instrs, f.instrs...)
	}
	return out
}

type fusionPlan struct {
	roots     map[int]*fForm // instruction index -> the fused block evaluated there (its dst)
	rootDst   map[int]string
	skip      []bool
	baseRoots map[string]int // fused roots per base register (the baby cache is freed after the last)
	babyAt    []bool         // instructions that rotate a base for a block (rot / rot_hoisted)
	pre       []bool         // skipped baby rotations computed where they stand (key schedule)
}

type baby struct {
	base string
	beta int
}

// analyseFusion finds the fused blocks of a plan (rules above).
func analyseFusion(p *plan, slots int) *fusionPlan {
	scheduled := p.hasKeySchedule()
	levels, err := p.keyLevels()
	if err != nil {
		levels = nil // validate() refuses such a plan before it runs
	}
	prog := p.Program
	users := map[string][]int{}
	for i, in := range prog {
		for _, r := range in.uses() {
			users[r] = append(users[r], i)
		}
	}
	single := func(r string) bool { return len(users[r]) == 1 }
	norm := func(k int) int { return ((k % slots) + slots) % slots }
	babies := map[string]baby{}
	babyInstr := map[string]int{}
	forms := map[string]*fForm{}
	absorbed := map[string]bool{}
	for i, in := range prog {
		switch in.Op {
		case "rot_hoisted":
			if forms[in.Src] == nil {
				for j, d := range in.Dsts {
					babies[d] = baby{in.Src, norm(in.Ks[j])}
					babyInstr[d] = i
				}
			}
		case "rot":
			f := forms[in.Src]
			if f == nil {
				if in.K != nil {
					babies[in.Dst] = baby{in.Src, norm(*in.K)}
					babyInstr[in.Dst] = i
				}
				continue
			}
			if single(in.Src) && !f.rotated && len(f.groups) == 1 && f.groups[0] != nil && in.K != nil {
				g := norm(*in.K)
				nf := &fForm{base: f.base, groups: map[int][]fTerm{g: f.groups[0]}, rescaled: f.rescaled, rotated: true,
					lowGiants: map[int]bool{}, instrs: append(append([]int{}, f.instrs...), i)}
				if f.rescaled {
					nf.lowGiants[g] = true
				}
				forms[in.Dst] = nf
				absorbed[in.Src] = true
			}
		case "pmul":
			if b, ok := babies[in.Src]; ok {
				forms[in.Dst] = &fForm{base: b.base, groups: map[int][]fTerm{0: {{b.beta, in.Pt, babyInstr[in.Src]}}},
					instrs: []int{i}}
			} else if forms[in.Src] == nil {
				forms[in.Dst] = &fForm{base: in.Src, groups: map[int][]fTerm{0: {{0, in.Pt, -1}}}, instrs: []int{i}}
			}
		case "add":
			fa, fb := forms[in.A], forms[in.B]
			if fa == nil || fb == nil || in.A == in.B || !single(in.A) || !single(in.B) ||
				fa.base != fb.base || fa.rescaled != fb.rescaled {
				continue
			}
			nf := mergeForms(fa, fb, fa.rotated || fb.rotated)
			nf.instrs = append(nf.instrs, i)
			forms[in.Dst] = nf
			absorbed[in.A], absorbed[in.B] = true, true
		case "rescale":
			f := forms[in.Src]
			if f == nil || f.rescaled || !single(in.Src) {
				continue
			}
			forms[in.Dst] = &fForm{base: f.base, groups: f.groups, rescaled: true, rotated: f.rotated, lowGiants: f.lowGiants,
				instrs: append(append([]int{}, f.instrs...), i)}
			absorbed[in.Src] = true
		}
	}
	cands := map[string]*fForm{}
	for r, f := range forms {
		// under a key schedule only blocks of several products: the schedule's split groups
		// leave many one-product blocks (a baby rotation and its pmul), which fused pay two
		// ModDowns where the plan's hoisted rotation pays one (LoLa at n14 under a half cap:
		// 9181 such blocks, 36.7 s fused against 10.6 s as written)
		if !absorbed[r] && f.worth() && keyLevelsFit(f, levels) &&
			(!scheduled || (f.terms() > 1 && giantKeysStay(prog, f, norm))) {
			cands[r] = f
		}
	}
	for {
		fp := buildFusion(len(prog), cands, babyInstr, users)
		if !scheduled {
			return fp
		}
		// a baby rotation that still runs as an instruction is rotated again by its block
		// at the root: its key must stay resident until then (blocks dropped until stable)
		dropped := false
		for r, f := range cands {
			if !babyKeysStay(prog, f, fp.skip, norm) {
				delete(cands, r)
				dropped = true
			}
		}
		if !dropped {
			// the skipped baby rotations are computed where they stand (their keys are
			// resident there), into the block's baby cache
			for i := range fp.skip {
				fp.pre[i] = fp.skip[i] && fp.babyAt[i]
			}
			return fp
		}
	}
}

// buildFusion makes the fusion plan of the chosen forms (by their root register).
func buildFusion(n int, chosen map[string]*fForm, babyInstr map[string]int, users map[string][]int) *fusionPlan {
	fp := &fusionPlan{roots: map[int]*fForm{}, rootDst: map[int]string{}, skip: make([]bool, n),
		baseRoots: map[string]int{}, babyAt: make([]bool, n), pre: make([]bool, n)}
	for r, f := range chosen {
		at := rootOf(f)
		fp.roots[at] = f
		fp.rootDst[at] = r
		fp.baseRoots[f.base]++
		for _, i := range f.instrs {
			fp.skip[i] = true
		}
	}
	// baby rotations whose every use is fused are not executed
	byInstr := map[int][]string{}
	for d, i := range babyInstr {
		byInstr[i] = append(byInstr[i], d)
	}
	for i, ds := range byInstr {
		fp.babyAt[i] = true
		all, used := true, false // a rotation nothing reads runs as written
		for _, d := range ds {
			for _, u := range users[d] {
				used = true
				if !fp.skip[u] {
					all = false
				}
			}
		}
		if all && used {
			fp.skip[i] = true
		}
	}
	return fp
}

// dropsBetween reports whether a drop_key of one of keys (or of the block "boot") stands
// strictly between instructions lo and hi.
func dropsBetween(prog []instr, lo, hi int, keys map[int]bool, norm func(int) int) bool {
	for q := lo + 1; q < hi; q++ {
		in := prog[q]
		if in.Op == "drop_key" && (in.Block != "" || (in.K != nil && keys[norm(*in.K)])) {
			return true
		}
	}
	return false
}

// keyLevelsFit: a fused block rotates its giant steps at the base's level, where the plan
// may rotate one level lower (after the form's rescale) with a key generated there. Such
// a giant key (with a recorded level) must reach the base's level, bounded below by its
// baby keys' levels (a key without a recorded level is at the top); without a baby key
// the base's level is unknown here and the block runs instruction by instruction.
func keyLevelsFit(f *fForm, levels map[int]int) bool {
	if len(f.lowGiants) == 0 || len(levels) == 0 {
		return true
	}
	need, babies := -1, false
	for _, ts := range f.groups {
		for _, t := range ts {
			if t.beta == 0 {
				continue
			}
			babies = true
			lvl, ok := levels[t.beta]
			if !ok {
				lvl = math.MaxInt
			}
			need = max(need, lvl)
		}
	}
	for g := range f.lowGiants {
		lvl, ok := levels[g]
		if ok && (!babies || lvl < need) {
			return false
		}
	}
	return true
}

// rootOf is the last instruction of a form, where the fused block runs (a form's
// instructions are appended in program order, the consuming one last).
func rootOf(f *fForm) int {
	return f.instrs[len(f.instrs)-1]
}

// giantKeysStay: every giant rotation's key stays resident from its instruction to the
// block's root, where the fused block rotates.
func giantKeysStay(prog []instr, f *fForm, norm func(int) int) bool {
	root := rootOf(f)
	for _, i := range f.instrs {
		in := prog[i]
		if in.Op == "rot" && in.K != nil && dropsBetween(prog, i, root, map[int]bool{norm(*in.K): true}, norm) {
			return false
		}
	}
	return true
}

// babyKeysStay: every baby rotation of f that runs as an instruction (not skipped) keeps
// its key resident until the root, where the block rotates the base again.
func babyKeysStay(prog []instr, f *fForm, skip []bool, norm func(int) int) bool {
	root := rootOf(f)
	for _, ts := range f.groups {
		for _, t := range ts {
			if t.rotAt >= 0 && !skip[t.rotAt] && dropsBetween(prog, t.rotAt, root, map[int]bool{t.beta: true}, norm) {
				return false
			}
		}
	}
	return true
}

// ---------------------------------------------------------------------------------------
// Plaintext cache: plaintexts encoded once per model (plan + weights) and reused by every
// evaluation; encoding time is reported apart (model preparation).

type ptKey struct {
	name  string
	level int
	scale float64 // the scale (Scale.Float64; Scale.Log2 is an expensive big-float logarithm)
}

type ptCache struct {
	mu      sync.Mutex
	q       map[ptKey]*rlwe.Plaintext
	qp      map[ptKey]ringqp.Poly
	bytes   int64
	seconds float64 // encoding time spent so far
	limit   int64   // > 0: encode without caching above this many bytes; < 0: keep nothing
	// baby rotations released by finished blocks, by level, reused by later blocks and
	// evaluations (no allocation per block)
	pool map[int][]*rlwe.Element[ringqp.Poly]
}

func newPtCache(limit int64) *ptCache {
	return &ptCache{q: map[ptKey]*rlwe.Plaintext{}, qp: map[ptKey]ringqp.Poly{}, limit: limit,
		pool: map[int][]*rlwe.Element[ringqp.Poly]{}}
}

func (c *ptCache) keep(n int64) bool {
	if c.limit < 0 || (c.limit > 0 && c.bytes+n > c.limit) {
		return false
	}
	c.bytes += n
	return true
}

// ---------------------------------------------------------------------------------------
// Fused evaluation.

// babyCache holds the lazily rotated copies of one base ciphertext (in QP) and P*ct.
type babyCache struct {
	ct     *rlwe.Ciphertext
	rot    map[int]*rlwe.Element[ringqp.Poly]
	pc0    ring.Poly // P * c0 (mod Q)
	pc1    ring.Poly // P * c1 (mod Q)
	remain int
}

type fusedWorker struct {
	eval       *ckks.Evaluator
	tmp0, tmp1 ringqp.Poly
	acc0, acc1 ringqp.Poly
	cQP        *rlwe.Element[ringqp.Poly]
	started    bool
	prodSec    float64 // products of the current block (seconds)
	giantSec   float64 // giant steps of the current block
}

func (e *executor) workerPool() []*fusedWorker {
	if e.workers != nil {
		return e.workers
	}
	n := max(1, e.nWorkers)
	rqp := e.params.RingQP()
	for w := 0; w < n; w++ {
		ev := e.eval
		if w > 0 {
			ev = e.eval.ShallowCopy()
		}
		fw := &fusedWorker{eval: ev, tmp0: rqp.NewPoly(), tmp1: rqp.NewPoly(), acc0: rqp.NewPoly(), acc1: rqp.NewPoly()}
		fw.cQP = &rlwe.Element[ringqp.Poly]{Value: []ringqp.Poly{rqp.NewPoly(), rqp.NewPoly()}, MetaData: &rlwe.MetaData{}}
		fw.cQP.IsNTT = true
		e.workers = append(e.workers, fw)
	}
	return e.workers
}

// ptQP returns plaintext name encoded in QP at (level, levelP) with the given scale
// (NTT and Montgomery form, as lintrans stores its diagonals).
func (e *executor) ptQP(name string, level int, scale rlwe.Scale) (ringqp.Poly, error) {
	key := ptKey{name, level, scale.Float64()}
	c := e.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.qp[key]; ok {
		return p, nil
	}
	vals, err := e.ptVector(name) // []float64, or []complex128 (complex packing)
	if err != nil {
		return ringqp.Poly{}, err
	}
	t := nowSeconds()
	poly := e.params.RingQP().AtLevel(level, e.params.MaxLevelP()).NewPoly()
	md := &rlwe.MetaData{}
	md.Scale = scale
	md.LogDimensions = e.params.LogMaxDimensions()
	md.IsBatched = true
	md.IsNTT = true
	md.IsMontgomery = true
	if err := e.ecd.Embed(vals, md, poly); err != nil {
		return ringqp.Poly{}, fmt.Errorf("cannot encode plaintext %q: %w", name, err)
	}
	d := nowSeconds() - t
	c.seconds += d
	e.encodeSec += d
	if c.keep(int64(poly.BinarySize())) {
		c.qp[key] = poly
	}
	return poly, nil
}

// babiesFor returns the cache of lazy baby rotations of base, computing the missing ones
// (split over the workers).
func (e *executor) babiesFor(base string, ct *rlwe.Ciphertext, betas []int) (*babyCache, error) {
	bc := e.babies[base]
	if bc == nil || bc.ct != ct {
		levelQ, levelP := ct.Level(), e.params.MaxLevelP()
		rq := e.params.RingQ().AtLevel(levelQ)
		bc = &babyCache{ct: ct, rot: map[int]*rlwe.Element[ringqp.Poly]{}, pc0: rq.NewPoly(), pc1: rq.NewPoly(),
			remain: e.fusion.baseRoots[base]}
		pBig := e.params.RingP().AtLevel(levelP).ModulusAtLevel[levelP]
		rq.MulScalarBigint(ct.Value[0], pBig, bc.pc0)
		rq.MulScalarBigint(ct.Value[1], pBig, bc.pc1)
		e.babies[base] = bc
	}
	var todo []int
	for _, b := range betas {
		if _, ok := bc.rot[b]; !ok && b != 0 {
			todo = append(todo, b)
			bc.rot[b] = nil
		}
	}
	if len(todo) == 0 {
		return bc, nil
	}
	sort.Ints(todo)
	levelQ, levelP := ct.Level(), e.params.MaxLevelP()
	e.cache.keepPoolAt(levelQ)
	pool := e.cache.pool[levelQ]
	for _, b := range todo {
		if err := e.rotationKey(b, ct); err != nil {
			return nil, err
		}
		if n := len(pool); n > 0 {
			bc.rot[b], pool = pool[n-1], pool[:n-1]
		} else {
			bc.rot[b] = rlwe.NewElementExtended(e.params, 1, levelQ, levelP)
		}
	}
	e.cache.pool[levelQ] = pool
	if e.decomp == nil {
		rqp := e.params.RingQP()
		n := e.params.BaseRNSDecompositionVectorSize(e.params.MaxLevel(), e.params.MaxLevelP())
		for i := 0; i < n; i++ {
			e.decomp = append(e.decomp, rqp.NewPoly())
		}
	}
	ws := e.workerPool()
	ws[0].eval.DecomposeNTT(levelQ, levelP, levelP+1, ct.Value[1], ct.IsNTT, e.decomp)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for w := range ws {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for j := w; j < len(todo); j += len(ws) {
				b := todo[j]
				if err := ws[w].eval.AutomorphismHoistedLazy(levelQ, ct, e.decomp, e.params.GaloisElement(b), bc.rot[b]); err != nil {
					errs[w] = err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	e.st.Rotations += len(todo)
	e.st.FusedBabies += len(todo)
	return bc, nil
}

// preBabies computes a skipped baby rotation instruction's rotations of its base into the
// base's baby cache, where the instruction stands (under a key schedule its keys are
// resident there); the block's root finds them cached.
func (e *executor) preBabies(in instr) error {
	ct, err := e.operand(in.Src, true)
	if err != nil {
		return err
	}
	slots := e.params.MaxSlots()
	var betas []int
	if in.Op == "rot_hoisted" {
		for _, k := range in.Ks {
			betas = append(betas, ((k%slots)+slots)%slots)
		}
	} else if in.K != nil {
		betas = append(betas, ((*in.K%slots)+slots)%slots)
	}
	_, err = e.babiesFor(in.Src, ct, betas)
	return err
}

// evalFused evaluates one fused block (its root register is dst).
func (e *executor) evalFused(f *fForm) (*rlwe.Ciphertext, error) {
	ct, err := e.operand(f.base, true)
	if err != nil {
		return nil, err
	}
	if err = e.checkMulLevel(f.base, ct, 1); err != nil {
		return nil, err
	}
	levelQ, levelP := ct.Level(), e.params.MaxLevelP()
	ptScale := e.rescaleFactor(levelQ)
	gammas := f.gammas()
	betaSet := map[int]bool{}
	for _, g := range gammas {
		if g != 0 {
			if err = e.rotationKey(g, ct); err != nil {
				return nil, err
			}
		}
		for _, t := range f.groups[g] {
			betaSet[t.beta] = true
		}
	}
	betas := make([]int, 0, len(betaSet))
	for b := range betaSet {
		betas = append(betas, b)
	}
	// encode (or fetch) the plaintexts first, serially
	pts := map[int][]ringqp.Poly{}
	for _, g := range gammas {
		for _, t := range f.groups[g] {
			p, err := e.ptQP(t.pt, levelQ, ptScale)
			if err != nil {
				return nil, err
			}
			pts[g] = append(pts[g], p)
		}
	}
	tEval := nowSeconds()
	bc, err := e.babiesFor(f.base, ct, betas)
	if err != nil {
		return nil, err
	}
	tBabies := nowSeconds()
	ws := e.workerPool()
	ringQP := e.params.RingQP().AtLevel(levelQ, levelP)
	ringQ, ringP := ringQP.RingQ, ringQP.RingP
	qMargin := max(1, e.params.QiOverflowMargin(levelQ)>>1)
	pMargin := max(1, e.params.PiOverflowMargin(levelP)>>1)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for w := range ws {
		ws[w].started = false
		ws[w].prodSec, ws[w].giantSec = 0, 0
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			fw := ws[w]
			for gi := w; gi < len(gammas); gi += len(ws) {
				g := gammas[gi]
				tp := nowSeconds()
				for j, t := range f.groups[g] {
					pt := pts[g][j]
					if t.beta == 0 {
						if j == 0 {
							ringQ.MulCoeffsMontgomeryLazy(pt.Q, bc.pc0, fw.tmp0.Q)
							ringQ.MulCoeffsMontgomeryLazy(pt.Q, bc.pc1, fw.tmp1.Q)
							fw.tmp0.P.Zero()
							fw.tmp1.P.Zero()
						} else {
							ringQ.MulCoeffsMontgomeryLazyThenAddLazy(pt.Q, bc.pc0, fw.tmp0.Q)
							ringQ.MulCoeffsMontgomeryLazyThenAddLazy(pt.Q, bc.pc1, fw.tmp1.Q)
						}
					} else {
						r := bc.rot[t.beta]
						if j == 0 {
							ringQP.MulCoeffsMontgomeryLazy(pt, r.Value[0], fw.tmp0)
							ringQP.MulCoeffsMontgomeryLazy(pt, r.Value[1], fw.tmp1)
						} else {
							ringQP.MulCoeffsMontgomeryLazyThenAddLazy(pt, r.Value[0], fw.tmp0)
							ringQP.MulCoeffsMontgomeryLazyThenAddLazy(pt, r.Value[1], fw.tmp1)
						}
					}
					if j%qMargin == qMargin-1 {
						ringQ.Reduce(fw.tmp0.Q, fw.tmp0.Q)
						ringQ.Reduce(fw.tmp1.Q, fw.tmp1.Q)
					}
					if j%pMargin == pMargin-1 {
						ringP.Reduce(fw.tmp0.P, fw.tmp0.P)
						ringP.Reduce(fw.tmp1.P, fw.tmp1.P)
					}
				}
				ringQ.Reduce(fw.tmp0.Q, fw.tmp0.Q)
				ringQ.Reduce(fw.tmp1.Q, fw.tmp1.Q)
				ringP.Reduce(fw.tmp0.P, fw.tmp0.P)
				ringP.Reduce(fw.tmp1.P, fw.tmp1.P)
				tg := nowSeconds()
				fw.prodSec += tg - tp
				if g == 0 {
					if !fw.started {
						fw.acc0.CopyLvl(levelQ, levelP, fw.tmp0)
						fw.acc1.CopyLvl(levelQ, levelP, fw.tmp1)
					} else {
						ringQP.Add(fw.acc0, fw.tmp0, fw.acc0)
						ringQP.Add(fw.acc1, fw.tmp1, fw.acc1)
					}
					fw.started = true
					fw.giantSec += nowSeconds() - tg
					continue
				}
				// giant step: one ModDown of c1, one key switch, automorphism in QP
				ev := fw.eval
				ev.ModDownQPtoQNTT(levelQ, levelP, fw.tmp1.Q, fw.tmp1.P, fw.tmp1.Q)
				galEl := e.params.GaloisElement(g)
				evk, err := ev.CheckAndGetGaloisKey(galEl)
				if err != nil {
					errs[w] = err
					return
				}
				if err = ev.GadgetProductLazy(levelQ, fw.tmp1.Q, &evk.GadgetCiphertext, fw.cQP); err != nil {
					errs[w] = err
					return
				}
				ringQP.Add(fw.cQP.Value[0], fw.tmp0, fw.cQP.Value[0])
				idx := ev.AutomorphismIndex(galEl)
				if !fw.started {
					ringQP.AutomorphismNTTWithIndex(fw.cQP.Value[0], idx, fw.acc0)
					ringQP.AutomorphismNTTWithIndex(fw.cQP.Value[1], idx, fw.acc1)
				} else {
					ringQP.AutomorphismNTTWithIndexThenAddLazy(fw.cQP.Value[0], idx, fw.acc0)
					ringQP.AutomorphismNTTWithIndexThenAddLazy(fw.cQP.Value[1], idx, fw.acc1)
					ringQ.Reduce(fw.acc0.Q, fw.acc0.Q)
					ringQ.Reduce(fw.acc1.Q, fw.acc1.Q)
					ringP.Reduce(fw.acc0.P, fw.acc0.P)
					ringP.Reduce(fw.acc1.P, fw.acc1.P)
				}
				fw.started = true
				fw.giantSec += nowSeconds() - tg
			}
		}(w)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	tFinish := nowSeconds()
	var first *fusedWorker
	for _, fw := range ws {
		if !fw.started {
			continue
		}
		if first == nil {
			first = fw
			continue
		}
		ringQP.Add(first.acc0, fw.acc0, first.acc0)
		ringQP.Add(first.acc1, fw.acc1, first.acc1)
	}
	out := e.newCt(levelQ)
	ws[0].eval.ModDownQPtoQNTT(levelQ, levelP, first.acc0.Q, first.acc0.P, out.Value[0])
	ws[0].eval.ModDownQPtoQNTT(levelQ, levelP, first.acc1.Q, first.acc1.P, out.Value[1])
	*out.MetaData = *ct.MetaData
	out.Scale = ct.Scale.Mul(ptScale)
	for _, g := range gammas {
		if g != 0 {
			e.st.Rotations++
		}
	}
	e.st.FusedBlocks++
	e.st.FusedProducts += f.terms()
	e.st.FusedGiants += len(gammas) - btoi(gammas[0] == 0)
	if e.st.FusedPhaseSeconds == nil {
		e.st.FusedPhaseSeconds = map[string]float64{}
	}
	ph := e.st.FusedPhaseSeconds
	ph["babies"] += tBabies - tEval
	for _, fw := range ws {
		ph["products"] += fw.prodSec
		ph["giants"] += fw.giantSec
	}
	defer func() { ph["finish"] += nowSeconds() - tFinish }()
	if f.rescaled {
		// in place: no second ciphertext per block (Lattigo's Rescale drops the last
		// prime of out itself)
		if err = e.eval.Rescale(out, out); err != nil {
			return nil, err
		}
	}
	// release the baby cache after the last block on this base
	bc.remain--
	if bc.remain <= 0 {
		delete(e.babies, f.base)
		for _, el := range bc.rot {
			if el != nil {
				e.cache.pool[levelQ] = append(e.cache.pool[levelQ], el)
			}
		}
	}
	e.fusedEvalSec += nowSeconds() - tEval
	return out, nil
}

// cpuSeconds is the process's CPU time (all threads; clock_gettime
// CLOCK_PROCESS_CPUTIME_ID): next to wall time it shows how much of a loaded machine a
// timed section got.
func cpuSeconds() float64 { return clockSeconds(2) }

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
