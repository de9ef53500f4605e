package slotlattigo

import (
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/lintrans"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/polynomial"
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
//   - the registers a form multiplies may be its origin or rotations of rotations of it
//     (a key schedule's two-hop rotations): a form records each product's register and
//     offset; a baby rotation that runs as an instruction (another rotation reads its
//     output, or a product outside any block) is multiplied as it is (offset 0 on its
//     output), so no key is needed for it at the root;
//   - under a key schedule (load_key/drop_key) only blocks of two or more products are
//     fused; their skipped baby rotations are computed where they stand, into the cache of
//     the rotated register (their keys are resident there, and the schedule may drop them
//     right after). A block runs whole only when its giant rotations' keys stay resident
//     until its root (no drop_key of the offset or of the block "boot" in between) and
//     reach the base's level; otherwise the analysis is repeated with those giant
//     rotations not absorbed, so that each giant step's products (up to its rescale) are
//     one block and the plan's giant rotations and additions run as written.

type fTerm struct {
	base  string // the register the baby rotation rotates (beta 0: the multiplied register)
	beta  int
	pt    string
	rotAt int    // the instruction of the baby rotation (-1: beta 0, no rotation)
	reg   string // the register the plan multiplies (the baby rotation's output)
}

type fForm struct {
	// the origin of the form's registers: the terms' bases are it or rotations of it
	// (babies of babies, as a key schedule's two-hop rotations make them), all at its level
	base     string
	groups   map[int][]fTerm // giant offset -> products
	rescaled bool
	rotated  bool // some group carries its giant rotation (no further rot)
	instrs   []int
	// giant offsets the plan rotates after the form's rescale (one level below the base,
	// where the fused block rotates): their keys may have been generated a level lower
	lowGiants map[int]bool
	// qmode: evaluated in Q (set by buildFusion, see markQMode)
	qmode bool
}

// giantless: the form has no giant step (only the group of giant offset 0).
func (f *fForm) giantless() bool {
	return len(f.groups) == 1 && f.groups[0] != nil
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

// bases returns the registers the form's products read (rotated lazily or multiplied as
// they are), sorted.
func (f *fForm) bases() []string {
	seen := map[string]bool{}
	var out []string
	for _, ts := range f.groups {
		for _, t := range ts {
			if !seen[t.base] {
				seen[t.base] = true
				out = append(out, t.base)
			}
		}
	}
	sort.Strings(out)
	return out
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
	baseRoots map[string]int      // fused roots per base register (the baby cache is freed after the last)
	baseBetas map[string][]int    // non-zero baby offsets of all fused roots per base (sorted)
	babyAt    []bool              // instructions that rotate a base for a block (rot / rot_hoisted)
	pre       []bool              // skipped baby rotations computed where they stand (key schedule)
	sums      map[int]*productSum // product-sum roots (relin.go), by instruction
}

type baby struct {
	base string
	beta int
}

// analyseFusion finds the fused blocks of a plan (rules above).
func analyseFusion(p *plan, slots int) *fusionPlan {
	fp, split := analyseForms(p, slots, nil)
	if len(split) > 0 {
		// blocks whose giant rotations cannot run fused (their keys are dropped before
		// the root, or were generated a level below the base) are fused group by group:
		// each giant step's products as one block, rescaled, and the plan's own giant
		// rotations and additions as written
		fp, _ = analyseForms(p, slots, split)
	}
	return fp
}

// analyseForms finds the fused blocks of a plan, the giant rotations in noGiant not
// absorbed; it returns them and the giant rotations of the blocks it had to refuse for
// their giant keys.
func analyseForms(p *plan, slots int, noGiant map[int]bool) (*fusionPlan, map[int]bool) {
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
	origin := map[string]string{} // rotations (of rotations) of a register -> that register
	originOf := func(r string) string {
		if o, ok := origin[r]; ok {
			return o
		}
		return r
	}
	forms := map[string]*fForm{}
	absorbed := map[string]bool{}
	for i, in := range prog {
		switch in.Op {
		case "rot_hoisted":
			if forms[in.Src] == nil {
				for j, d := range in.Dsts {
					babies[d] = baby{in.Src, norm(in.Ks[j])}
					babyInstr[d] = i
					origin[d] = originOf(in.Src)
				}
			}
		case "rot":
			f := forms[in.Src]
			if f == nil {
				if in.K != nil {
					babies[in.Dst] = baby{in.Src, norm(*in.K)}
					babyInstr[in.Dst] = i
					origin[in.Dst] = originOf(in.Src)
				}
				continue
			}
			if single(in.Src) && !f.rotated && len(f.groups) == 1 && f.groups[0] != nil && in.K != nil && !noGiant[i] {
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
				forms[in.Dst] = &fForm{base: originOf(b.base),
					groups: map[int][]fTerm{0: {{b.base, b.beta, in.Pt, babyInstr[in.Src], in.Src}}}, instrs: []int{i}}
			} else if forms[in.Src] == nil {
				forms[in.Dst] = &fForm{base: originOf(in.Src), groups: map[int][]fTerm{0: {{in.Src, 0, in.Pt, -1, in.Src}}},
					instrs: []int{i}}
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
	split := map[int]bool{}
	for r, f := range forms {
		if absorbed[r] || !f.worth() {
			continue
		}
		if keyLevelsFit(f, levels) && (!scheduled || giantKeysStay(prog, f, norm)) {
			cands[r] = f
			continue
		}
		for _, i := range f.instrs {
			if prog[i].Op == "rot" {
				split[i] = true
			}
		}
	}
	if scheduled {
		dropLoneQPBlocks(cands)
	}
	fp := buildFusion(len(prog), cands, babyInstr, users)
	if !scheduled {
		analyseProductSums(p, fp)
		return fp, split
	}
	// the skipped baby rotations are computed where they stand (their keys are resident
	// there, and the schedule may drop them right after), into the cache of their base
	for i := range fp.skip {
		fp.pre[i] = fp.skip[i] && fp.babyAt[i]
	}
	return fp, split
}

// buildFusion makes the fusion plan of the chosen forms (by their root register).
func buildFusion(n int, chosen map[string]*fForm, babyInstr map[string]int, users map[string][]int) *fusionPlan {
	fp := &fusionPlan{roots: map[int]*fForm{}, rootDst: map[int]string{}, skip: make([]bool, n),
		baseRoots: map[string]int{}, baseBetas: map[string][]int{}, babyAt: make([]bool, n), pre: make([]bool, n),
		sums: map[int]*productSum{}}
	for r, f := range chosen {
		at := rootOf(f)
		fp.roots[at] = f
		fp.rootDst[at] = r
		for _, i := range f.instrs {
			fp.skip[i] = true
		}
	}
	byInstr := map[int][]string{}
	for d, i := range babyInstr {
		byInstr[i] = append(byInstr[i], d)
		fp.babyAt[i] = true
	}
	// baby rotations whose every use is fused are not executed; a rotation that another
	// baby rotation reads (a two-hop rotation's first hop) runs, since its output is rotated
	// again as a ciphertext, and so does a rotation nothing reads
	for i, ds := range byInstr {
		all, used := true, false
		for _, d := range ds {
			for _, u := range users[d] {
				used = true
				if !fp.skip[u] || fp.babyAt[u] {
					all = false
				}
			}
		}
		if all && used {
			fp.skip[i] = true
		}
	}
	// a product of a baby that the plan computes anyway multiplies that ciphertext (P times
	// it in QP, no second rotation): no key is needed for it at the root
	for _, f := range chosen {
		for g, ts := range f.groups {
			nt := make([]fTerm, len(ts))
			for j, t := range ts {
				if t.rotAt >= 0 && !fp.skip[t.rotAt] {
					t = fTerm{base: t.reg, beta: 0, pt: t.pt, rotAt: -1, reg: t.reg}
				}
				nt[j] = t
			}
			f.groups[g] = nt
		}
		for _, b := range f.bases() {
			fp.baseRoots[b]++
		}
	}
	// every register's lazily rotated offsets over all blocks (one decomposition each)
	seen := map[baby]bool{}
	for _, f := range chosen {
		for _, ts := range f.groups {
			for _, t := range ts {
				if t.beta != 0 && !seen[baby{t.base, t.beta}] {
					seen[baby{t.base, t.beta}] = true
					fp.baseBetas[t.base] = append(fp.baseBetas[t.base], t.beta)
				}
			}
		}
	}
	for _, bs := range fp.baseBetas {
		sort.Ints(bs)
	}
	markQMode(chosen)
	return fp
}

// dropLoneQPBlocks keeps a key schedule's one-product blocks only where they run in Q
// mode. A schedule's split groups leave many one-product blocks (a baby rotation and its
// pmul); in QP each pays two ModDowns where the plan's hoisted rotation pays one (LoLa at
// n14 under a half cap: 9181 such blocks, 36.7 s fused against 10.6 s as written). In Q
// mode they share their base's babies as without a schedule (ResNet-20 at n14boot: 2936
// of its 3068 Q-mode blocks have one product; run as written under a cap they cost
// 1.16x keep-all). planner/ir/fusion.py applies the same rule.
func dropLoneQPBlocks(cands map[string]*fForm) {
	markQMode(cands)
	for r, f := range cands {
		if f.terms() < 2 && !f.qmode {
			delete(cands, r)
		}
	}
}

// markQMode chooses how the giantless blocks of each base are evaluated. In QP (the
// lintrans way) every block ends with two ModDowns; in Q ("Q mode") each distinct baby
// rotation of the base is brought down to Q once (two ModDowns per baby, shared by the
// base's Q-mode blocks) and the products accumulate in Q, with no ModDown per block. A
// base's giantless blocks take Q mode when they outnumber the distinct non-zero baby
// offsets they use (a convolution's many small output blocks over a few rotations of one
// input: conv2 at n13 has 688 blocks of 1.3 products over 32 babies); blocks with giant
// steps always run in QP. planner/ir/fusion.py applies the same rule.
func markQMode(chosen map[string]*fForm) {
	// per origin: its giantless blocks and the distinct lazily rotated babies they read
	blocks := map[string]int{}
	betas := map[string]map[baby]bool{}
	for _, f := range chosen {
		f.qmode = false
		if !f.giantless() {
			continue
		}
		blocks[f.base]++
		if betas[f.base] == nil {
			betas[f.base] = map[baby]bool{}
		}
		for _, t := range f.groups[0] {
			if t.beta != 0 {
				betas[f.base][baby{t.base, t.beta}] = true
			}
		}
	}
	for _, f := range chosen {
		if f.giantless() && blocks[f.base] > len(betas[f.base]) {
			f.qmode = true
		}
	}
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
// a giant key (with a recorded level) must reach the base's level. Every lazily rotated
// baby's key reaches it (the plan rotates the base with it), so the base's level is at
// most the lowest of them (a key without a recorded level is at the top); without such a
// baby key the base's level is unknown here and the block runs unfused.
func keyLevelsFit(f *fForm, levels map[int]int) bool {
	if len(f.lowGiants) == 0 || len(levels) == 0 {
		return true
	}
	bound, babies := math.MaxInt, false
	for _, ts := range f.groups {
		for _, t := range ts {
			if t.beta == 0 {
				continue
			}
			babies = true
			if lvl, ok := levels[t.beta]; ok {
				bound = min(bound, lvl)
			}
		}
	}
	for g := range f.lowGiants {
		lvl, ok := levels[g]
		if ok && (!babies || lvl < bound) {
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
	// ciphertexts of dead registers by level, reused by the executor's newCt (ctBytes:
	// their size, bounded by ctPoolBytes)
	cts     map[int][]*rlwe.Ciphertext
	ctBytes int64
	// the evaluation's working state, kept for the next evaluation (evalScratch)
	scratch *evalScratch
	// CinS matrices (to_cins factors, fused convolutions, S_(N/2<-l)) encoded for
	// lintrans, by name and level (cins_exec.go): once per model
	lts map[ptKey]*lintrans.LinearTransformation
}

// evalScratch is the Lattigo state an evaluation works in besides its registers: the
// evaluator (with its key-switching buffers), the encoder, the fused blocks' workers and
// the base decomposition. A model evaluated again and again keeps it in its ptCache, as a
// server keeps its evaluator. Made anew per evaluation, its buffers (7 QP polys per worker
// and 4 for the decomposition: 165 MiB at n16, 3.4 MiB at n13, besides the evaluator's own)
// were fresh memory each time, and the first touch of every page is a page fault: 21,000
// of them (0.2 s of system time) in one base decomposition of the n16 2048x2048 plan,
// 0.21-0.37 s against 0.15 s without them, and a run-to-run spread that depended on
// whether a collection had freed the previous evaluation's buffers.
type evalScratch struct {
	keys     *keyStore
	eval     *ckks.Evaluator
	polyEval *polynomial.Evaluator
	ecd      *ckks.Encoder
	emb      *embedder
	workers  []*fusedWorker // workerPool
	decomp   []ringqp.Poly  // babiesFor: the decomposition of a base's c1
}

// scratchFor returns the cache's evaluation state for keys, made on first use (or when the
// key set changed).
func (c *ptCache) scratchFor(params ckks.Parameters, keys *keyStore) *evalScratch {
	if c.scratch != nil && c.scratch.keys == keys {
		return c.scratch
	}
	eval := ckks.NewEvaluator(params, keys)
	ecd := newEncoder(params)
	c.scratch = &evalScratch{keys: keys, eval: eval, polyEval: polynomial.NewEvaluator(params, eval), ecd: ecd,
		emb: newEmbedder(params, ecd)}
	return c.scratch
}

func newPtCache(limit int64) *ptCache {
	return &ptCache{q: map[ptKey]*rlwe.Plaintext{}, qp: map[ptKey]ringqp.Poly{}, limit: limit,
		pool: map[int][]*rlwe.Element[ringqp.Poly]{}, cts: map[int][]*rlwe.Ciphertext{}}
}

// pooledBytes: the bytes of the pooled baby rotations and ciphertexts (what an evaluation
// that starts with this cache inherits besides the plaintexts).
func (c *ptCache) pooledBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, es := range c.pool {
		for _, e := range es {
			n += int64(e.BinarySize())
		}
	}
	for _, cts := range c.cts {
		for _, ct := range cts {
			n += int64(ct.BinarySize())
		}
	}
	return n
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
	rotQ   map[int]*rlwe.Ciphertext // babies brought down to Q (Q-mode blocks)
}

type fusedWorker struct {
	eval       *ckks.Evaluator
	tmp0, tmp1 ringqp.Poly
	acc0, acc1 ringqp.Poly
	cQP        *rlwe.Element[ringqp.Poly]
	started    bool
	prodSec    float64 // products of the current block (seconds, without encoding)
	giantSec   float64 // giant steps of the current block
	// streamed plaintexts (evalFused without a plaintext cache): the worker's encoder and
	// the one QP plaintext it encodes each product's diagonal into
	emb    *embedder
	vecs   vecBuffers // the plaintext vectors it reads (no allocation per product)
	ptBuf  ringqp.Poly
	encSec float64 // encoding in the current block
}

func (e *executor) workerPool() []*fusedWorker {
	n := max(1, e.nWorkers)
	if len(e.sc.workers) == n {
		return e.sc.workers
	}
	e.sc.workers = nil
	rqp := e.params.RingQP()
	for w := 0; w < n; w++ {
		ev := e.eval
		if w > 0 {
			ev = e.eval.ShallowCopy()
		}
		fw := &fusedWorker{eval: ev, tmp0: rqp.NewPoly(), tmp1: rqp.NewPoly(), acc0: rqp.NewPoly(), acc1: rqp.NewPoly(),
			emb: newEmbedder(e.params, e.ecd.ShallowCopy()), ptBuf: rqp.NewPoly()}
		fw.cQP = &rlwe.Element[ringqp.Poly]{Value: []ringqp.Poly{rqp.NewPoly(), rqp.NewPoly()}, MetaData: &rlwe.MetaData{}}
		fw.cQP.IsNTT = true
		e.sc.workers = append(e.sc.workers, fw)
	}
	return e.sc.workers
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
	t := nowSeconds()             // reading the vector (from the plaintext file) and encoding it
	vals, err := e.ptVector(name) // []float64, or []complex128 (complex packing)
	if err != nil {
		return ringqp.Poly{}, err
	}
	poly := e.params.RingQP().AtLevel(level, e.params.MaxLevelP()).NewPoly()
	md := &rlwe.MetaData{}
	md.Scale = scale
	md.LogDimensions = e.params.LogMaxDimensions()
	md.IsBatched = true
	md.IsNTT = true
	md.IsMontgomery = true
	if err := e.emb.embed(vals, md, poly); err != nil {
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

// encodeInto encodes plaintext name in QP at (levelQ, levelP) into the worker's buffer
// (as ptQP, without the cache) and returns it. Safe in parallel with other workers.
func (e *executor) encodeInto(fw *fusedWorker, name string, levelQ, levelP int, scale rlwe.Scale) (ringqp.Poly, error) {
	vals, err := e.ptVectorInto(name, &fw.vecs)
	if err != nil {
		return ringqp.Poly{}, err
	}
	poly := ringqp.Poly{Q: ring.Poly{Coeffs: fw.ptBuf.Q.Coeffs[:levelQ+1]}, P: ring.Poly{Coeffs: fw.ptBuf.P.Coeffs[:levelP+1]}}
	md := &rlwe.MetaData{}
	md.Scale = scale
	md.LogDimensions = e.params.LogMaxDimensions()
	md.IsBatched, md.IsNTT, md.IsMontgomery = true, true, true
	if err := fw.emb.embed(vals, md, poly); err != nil {
		return ringqp.Poly{}, fmt.Errorf("cannot encode plaintext %q: %w", name, err)
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
			remain: e.fusion.baseRoots[base], rotQ: map[int]*rlwe.Ciphertext{}}
		pBig := e.params.RingP().AtLevel(levelP).ModulusAtLevel[levelP]
		rq.MulScalarBigint(ct.Value[0], pBig, bc.pc0)
		rq.MulScalarBigint(ct.Value[1], pBig, bc.pc1)
		e.babies[base] = bc
	}
	if !e.scheduled {
		// every baby the base's blocks need, at once: one decomposition of c1 per base
		// (blocks on one base asking for new offsets one after the other would decompose
		// it again each time)
		betas = e.fusion.baseBetas[base]
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
	if e.sc.decomp == nil {
		rqp := e.params.RingQP()
		n := e.params.BaseRNSDecompositionVectorSize(e.params.MaxLevel(), e.params.MaxLevelP())
		for i := 0; i < n; i++ {
			e.sc.decomp = append(e.sc.decomp, rqp.NewPoly())
		}
	}
	ws := e.workerPool()
	ws[0].eval.DecomposeNTT(levelQ, levelP, levelP+1, ct.Value[1], ct.IsNTT, e.sc.decomp)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for w := range ws {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for j := w; j < len(todo); j += len(ws) {
				b := todo[j]
				if err := hoistedBaby(ws[w].eval, e.params, ct, e.sc.decomp, bc.pc0, e.params.GaloisElement(b), bc.rot[b]); err != nil {
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
	// the registers the products read: all at one level (rotations of one origin)
	bases := f.bases()
	cts := make(map[string]*rlwe.Ciphertext, len(bases))
	var ct *rlwe.Ciphertext
	for _, b := range bases {
		c, err := e.operand(b, true)
		if err != nil {
			return nil, err
		}
		if ct == nil {
			if err = e.checkMulLevel(b, c, 1); err != nil {
				return nil, err
			}
			ct = c
		} else if c.Level() != ct.Level() {
			return nil, fmt.Errorf("fused block: register %s is at level %d, %s at %d", b, c.Level(), bases[0], ct.Level())
		}
		cts[b] = c
	}
	levelQ, levelP := ct.Level(), e.params.MaxLevelP()
	ptScale := e.rescaleFactor(levelQ)
	gammas := f.gammas()
	betaSet := map[string]map[int]bool{}
	for _, g := range gammas {
		if g != 0 {
			if err := e.rotationKey(g, ct); err != nil {
				return nil, err
			}
		}
		for _, t := range f.groups[g] {
			if betaSet[t.base] == nil {
				betaSet[t.base] = map[int]bool{}
			}
			betaSet[t.base][t.beta] = true
		}
	}
	// Without a plaintext cache (Run, BenchPlan's no_plaintext_cache) a QP-mode block's
	// workers encode each product's plaintext into their own buffer just before the
	// product, so a block never holds its plaintexts (LoLa's blocks at n14 held 1.6 GB of
	// them); otherwise they are encoded (or fetched) first, serially, and cached.
	stream := e.cache.limit < 0 && !f.qmode
	pts := map[int][]ringqp.Poly{}
	for _, g := range gammas {
		if stream {
			break
		}
		for _, t := range f.groups[g] {
			p, err := e.ptQP(t.pt, levelQ, ptScale)
			if err != nil {
				return nil, err
			}
			pts[g] = append(pts[g], p)
		}
	}
	tEval := nowSeconds()
	caches := make(map[string]*babyCache, len(bases))
	for _, b := range bases {
		betas := make([]int, 0, len(betaSet[b]))
		for k := range betaSet[b] {
			betas = append(betas, k)
		}
		bc, err := e.babiesFor(b, cts[b], betas)
		if err != nil {
			return nil, err
		}
		caches[b] = bc
	}
	if f.qmode {
		return e.evalFusedQ(f, ct, cts, caches, pts[0], ptScale, tEval)
	}
	tBabies := nowSeconds()
	ws := e.workerPool()
	ringQP := e.params.RingQP().AtLevel(levelQ, levelP)
	ringQ, ringP := ringQP.RingQ, ringQP.RingP
	prods := newQPProducts(ringQP)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for w := range ws {
		ws[w].started = false
		ws[w].prodSec, ws[w].giantSec, ws[w].encSec = 0, 0, 0
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			fw := ws[w]
			for gi := w; gi < len(gammas); gi += len(ws) {
				g := gammas[gi]
				tp, enc := nowSeconds(), fw.encSec
				for j, t := range f.groups[g] {
					var pt ringqp.Poly
					if stream {
						te := nowSeconds()
						var err error
						if pt, err = e.encodeInto(fw, t.pt, levelQ, levelP, ptScale); err != nil {
							errs[w] = err
							return
						}
						fw.encSec += nowSeconds() - te
					} else {
						pt = pts[g][j]
					}
					bc := caches[t.base]
					if t.beta == 0 {
						prods.q.mulAdd(pt.Q, bc.pc0, bc.pc1, fw.tmp0.Q, fw.tmp1.Q, j == 0)
						if j == 0 {
							fw.tmp0.P.Zero()
							fw.tmp1.P.Zero()
						}
					} else {
						r := bc.rot[t.beta]
						prods.mulAdd(pt, r.Value[0], r.Value[1], fw.tmp0, fw.tmp1, j == 0)
					}
					prods.afterTerm(j, fw.tmp0, fw.tmp1)
				}
				prods.finish(fw.tmp0, fw.tmp1)
				tg := nowSeconds()
				fw.prodSec += tg - tp - (fw.encSec - enc)
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
	if stream {
		// encoding is model preparation, timed apart (runTimed): the slowest worker's
		// encoding is its share of the block's wall time (all of it with one worker)
		enc, sum := 0.0, 0.0
		for _, fw := range ws {
			enc, sum = max(enc, fw.encSec), sum+fw.encSec
		}
		e.encodeSec += enc
		e.cache.mu.Lock()
		e.cache.seconds += sum
		e.cache.mu.Unlock()
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
	if len(bases) > 1 {
		e.st.FusedMultiBase++
	}
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
		if err := e.eval.Rescale(out, out); err != nil {
			return nil, err
		}
	}
	// release each baby cache after the last block on its base
	for _, b := range bases {
		e.blockDone(b, caches[b], levelQ)
	}
	e.fusedEvalSec += nowSeconds() - tEval
	return out, nil
}

// blockDone releases the base's baby cache after its last block: the QP babies go to the
// pool of the plaintext cache, the Q copies back to newCt's.
func (e *executor) blockDone(base string, bc *babyCache, levelQ int) {
	bc.remain--
	if bc.remain > 0 {
		return
	}
	delete(e.babies, base)
	for _, el := range bc.rot {
		if el != nil {
			e.cache.pool[levelQ] = append(e.cache.pool[levelQ], el)
		}
	}
	for _, q := range bc.rotQ {
		e.recycle(q)
	}
}

// evalFusedQ evaluates a giantless block in Q (markQMode): the products of the base's
// babies (brought down to Q once per base) or of the base itself accumulate lazily in Q
// with the plaintexts' Q parts (NTT, Montgomery), reduced as often as the QP path.
func (e *executor) evalFusedQ(f *fForm, ct *rlwe.Ciphertext, cts map[string]*rlwe.Ciphertext,
	caches map[string]*babyCache, pts []ringqp.Poly, ptScale rlwe.Scale, tEval float64) (*rlwe.Ciphertext, error) {
	levelQ, levelP := ct.Level(), e.params.MaxLevelP()
	ringQ := e.params.RingQ().AtLevel(levelQ)
	ev := e.workerPool()[0].eval
	terms := f.groups[0]
	for _, t := range terms {
		bc := caches[t.base]
		if t.beta == 0 || bc.rotQ[t.beta] != nil {
			continue
		}
		r := bc.rot[t.beta]
		q := rlwe.NewCiphertext(e.params, 1, levelQ)
		ev.ModDownQPtoQNTT(levelQ, levelP, r.Value[0].Q, r.Value[0].P, q.Value[0])
		ev.ModDownQPtoQNTT(levelQ, levelP, r.Value[1].Q, r.Value[1].P, q.Value[1])
		bc.rotQ[t.beta] = q
	}
	tBabies := nowSeconds()
	out := e.newCt(levelQ)
	prods := newProductKernel(ringQ)
	for j, t := range terms {
		src := cts[t.base]
		if t.beta != 0 {
			src = caches[t.base].rotQ[t.beta]
		}
		prods.mulAdd(pts[j].Q, src.Value[0], src.Value[1], out.Value[0], out.Value[1], j == 0)
		prods.afterTerm(j, out.Value[0], out.Value[1])
	}
	prods.finish(out.Value[0], out.Value[1])
	*out.MetaData = *ct.MetaData
	out.Scale = ct.Scale.Mul(ptScale)
	tProducts := nowSeconds()
	e.st.FusedBlocks++
	e.st.FusedQBlocks++
	e.st.FusedProducts += len(terms)
	if e.st.FusedPhaseSeconds == nil {
		e.st.FusedPhaseSeconds = map[string]float64{}
	}
	ph := e.st.FusedPhaseSeconds
	ph["babies"] += tBabies - tEval
	ph["products"] += tProducts - tBabies
	if f.rescaled {
		if err := e.eval.Rescale(out, out); err != nil {
			return nil, err
		}
	}
	ph["finish"] += nowSeconds() - tProducts
	if len(caches) > 1 {
		e.st.FusedMultiBase++
	}
	for _, b := range f.bases() {
		e.blockDone(b, caches[b], levelQ)
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
