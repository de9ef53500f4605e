package slotlattigo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/lintrans"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/polynomial"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// Fused linear blocks (Lattigo's lintrans BSGS evaluation, over a plan's instructions).
//
// A plan of SPEC section 4 spells a diagonal matrix product as rotations of one ciphertext
// x (rot_hoisted / rot: the baby steps), a pmul of each rotation (or of x itself) by a
// plaintext, add trees over those products, a rescale, a rotation of each partial sum (the
// giant steps) and an add tree over the giant steps:
//
//	y = sum_g rot_g( sum_{(b, pt) in g} pt * rot_b(x) )    (rescaled once, or not at all)
//
// Which instructions form such a block is decided once, by the planner
// (planner/ir/fusion.py, written into the plan as its "fused" annotation by
// planner/ir/fused_plan.py; docs/formats.md). The executor runs the blocks it is given and
// decides none itself: readFusion checks the annotation against the program (indices in
// range, operations, each block a tree whose only outside reads are its products'
// registers, one rescale state and at most one giant rotation per product, lazily rotated
// baby outputs read by block products only) and refuses a malformed one with one line
// naming the field. A plan without the annotation runs unfused (the Python backend adds it
// before a plan reaches Go). The plan stays executable instruction by instruction: the
// annotation changes no instruction.
//
// A block is evaluated like lintrans' MultiplyByDiagMatrixBSGS, with double hoisting:
//
//   - x's c1 is decomposed once; every baby step is a lazy hoisted automorphism kept in
//     the extended basis QP (no ModDown) and cached for every block on the same x;
//   - plaintexts are encoded once in QP at x's level (cached across evaluations, see
//     ptCache) and multiplied-accumulated lazily in QP;
//   - per giant step one ModDown (of c1) and one key switch; the giant steps accumulate in
//     QP and the block ends with one ModDown per output polynomial and one Rescale when
//     the plan rescales the block;
//   - the giant steps (and the baby steps) are split over the executor's workers (one
//     Lattigo evaluator each; partial sums added in QP at the end);
//   - a block of mode "q" (no giant step) accumulates its products in Q from the base's
//     babies brought down to Q once (evalFusedQ).
//
// Under a key schedule the annotation's baby rotations are computed where they stand, into
// the cache of the rotated register (their keys are resident there, and the schedule may
// drop them right after); without one every baby of a base is made at its first block.

type fTerm struct {
	base string // the register the baby rotation rotates (beta 0: the multiplied register)
	beta int
	pt   string
}

type fForm struct {
	// the origin of the form's registers: the terms' bases are it or rotations of it
	// (babies of babies, as a key schedule's two-hop rotations make them), all at its level
	base     string
	groups   map[int][]fTerm // giant offset -> products
	rescaled bool
	instrs   []int
	qmode    bool // evaluated in Q (the annotation's mode "q")
	qbabies  bool // a QP block with its babies in Q when the plaintexts are streamed (babies_in_q)
}

func (f *fForm) terms() int {
	n := 0
	for _, g := range f.groups {
		n += len(g)
	}
	return n
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

type fusionPlan struct {
	roots     map[int]*fForm // instruction index -> the fused block evaluated there (its dst)
	rootDst   map[int]string
	skip      []bool
	baseRoots map[string]int      // fused roots per base register (the baby cache is freed after the last)
	baseBetas map[string][]int    // non-zero baby offsets of all fused roots per base (sorted)
	pre       []bool              // skipped baby rotations computed where they stand (key schedule)
	sums      map[int]*productSum // product-sum roots (relin.go), by instruction
}

type baby struct {
	base string
	beta int
}

// fusedAnnotation is the plan's "fused" object (docs/formats.md, planner/ir/fused_plan.py).
type fusedAnnotation struct {
	Blocks []fusedBlockSpec `json:"blocks"`
	Babies []int            `json:"babies"`
}

type fusedBlockSpec struct {
	Instrs []int  `json:"instrs"`
	Mode   string `json:"mode"`
	// a "qp" block a streaming run evaluates with its babies in Q (fused_qbabies.go), as
	// the planner decided it (planner/ir/fusion.py q_babies)
	BabiesInQ bool `json:"babies_in_q"`
}

// decodeFused reads the raw "fused" object strictly (unknown keys refused).
func decodeFused(raw json.RawMessage) (*fusedAnnotation, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var a fusedAnnotation
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("plan field \"fused\": %s", strings.Join(strings.Fields(err.Error()), " "))
	}
	if a.Blocks == nil || a.Babies == nil {
		return nil, fmt.Errorf("plan field \"fused\": must be an object {\"blocks\": [...], \"babies\": [...]}")
	}
	return &a, nil
}

// readFusion makes the fusion plan of the plan's "fused" annotation (no fused block
// without one; product sums as relin.go decides them), checked against the program.
func readFusion(p *plan, slots int) (*fusionPlan, error) {
	prog := p.Program
	n := len(prog)
	fp := &fusionPlan{roots: map[int]*fForm{}, rootDst: map[int]string{}, skip: make([]bool, n),
		baseRoots: map[string]int{}, baseBetas: map[string][]int{}, pre: make([]bool, n),
		sums: map[int]*productSum{}}
	if len(p.Fused) > 0 && string(p.Fused) != "null" {
		ann, err := decodeFused(p.Fused)
		if err != nil {
			return nil, err
		}
		if err = fp.readBlocks(prog, ann, slots, p.hasKeySchedule()); err != nil {
			return nil, err
		}
	}
	if !p.hasKeySchedule() {
		analyseProductSums(p, fp)
	}
	return fp, nil
}

// readBlocks checks the annotation's blocks and babies against the program (the rules of
// planner/ir/fused_plan.py read_fused) and fills fp with them.
func (fp *fusionPlan) readBlocks(prog []instr, ann *fusedAnnotation, slots int, scheduled bool) error {
	n := len(prog)
	norm := func(k int) int { return ((k % slots) + slots) % slots }
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("plan field \"fused%s\": %s", field, fmt.Sprintf(format, args...))
	}
	index := func(v int, field string) error {
		if v < 0 || v >= n {
			return bad(field, "%d is not an instruction index (0..%d)", v, n-1)
		}
		return nil
	}
	writer := map[string]int{}
	users := map[string][]int{}
	rotated := map[string]baby{} // a rotation's output -> (its source, offset mod slots)
	for i, in := range prog {
		for _, r := range in.defs() {
			writer[r] = i
		}
		for _, r := range in.uses() {
			users[r] = append(users[r], i)
		}
		switch in.Op {
		case "rot":
			if in.K != nil {
				rotated[in.Dst] = baby{in.Src, norm(*in.K)}
			}
		case "rot_hoisted":
			for j, d := range in.Dsts {
				if j < len(in.Ks) {
					rotated[d] = baby{in.Src, norm(in.Ks[j])}
				}
			}
		}
	}
	babySet := map[int]bool{}
	for j, i := range ann.Babies {
		f := fmt.Sprintf(".babies[%d]", j)
		if err := index(i, f); err != nil {
			return err
		}
		if op := prog[i].Op; op != "rot" && op != "rot_hoisted" {
			return bad(f, "instruction %d (%s) is no rot/rot_hoisted", i, prog[i].opName())
		}
		if babySet[i] {
			return bad(f, "instruction %d is listed twice", i)
		}
		babySet[i] = true
	}
	owner := map[int]int{}
	lazyReaders := map[int]bool{}
	for b, spec := range ann.Blocks {
		w := fmt.Sprintf(".blocks[%d]", b)
		if spec.Mode != "qp" && spec.Mode != "q" {
			return bad(w+".mode", "%q is not one of [\"qp\", \"q\"]", spec.Mode)
		}
		if spec.BabiesInQ && spec.Mode != "qp" {
			return bad(w+".babies_in_q", "is true, on a \"qp\" block only (absent: false)")
		}
		if len(spec.Instrs) == 0 {
			return bad(w+".instrs", "must be a non-empty list of instruction indices")
		}
		inside := map[int]bool{}
		for j, i := range spec.Instrs {
			f := fmt.Sprintf("%s.instrs[%d]", w, j)
			if err := index(i, f); err != nil {
				return err
			}
			if j > 0 && i <= spec.Instrs[j-1] {
				return bad(f, "indices must be strictly increasing (the root last)")
			}
			switch prog[i].Op {
			case "pmul", "add", "rescale", "rot":
			default:
				return bad(f, "instruction %d (%s) cannot be part of a block (only pmul, add, rescale, rot)", i, prog[i].opName())
			}
			if o, ok := owner[i]; ok {
				return bad(f, "instruction %d is already in block %d", i, o)
			}
			if babySet[i] {
				return bad(f, "instruction %d is also listed in \"fused.babies\"", i)
			}
			owner[i] = b
			inside[i] = true
		}
		root := spec.Instrs[len(spec.Instrs)-1]
		// the tree: every value but the root's is read once, inside the block; every operand
		// of an add/rescale/rot is a value of the block, a pmul's register comes from outside
		for j, i := range spec.Instrs {
			in := prog[i]
			f := fmt.Sprintf("%s.instrs[%d]", w, j)
			if i != root {
				us := users[in.Dst]
				if len(us) != 1 || !inside[us[0]] {
					return bad(f, "instruction %d (%s) writes %s, which must be read once, by an instruction of the same block", i, in.Op, in.Dst)
				}
			}
			if in.Op == "pmul" {
				continue
			}
			rs := in.uses()
			if in.Op == "add" && rs[0] == rs[1] {
				return bad(f, "instruction %d (add) adds %s to itself", i, rs[0])
			}
			for _, r := range rs {
				if wi, ok := writer[r]; !ok || !inside[wi] {
					return bad(f, "instruction %d (%s) reads %s, which no instruction of the block writes (a block's only outside reads are its products' registers)", i, in.Op, r)
				}
			}
		}
		// (rotations, rescales, giant offset) strictly above each instruction, root first
		type path struct{ rots, rescales, giant int }
		above := map[int]path{root: {}}
		for j := len(spec.Instrs) - 2; j >= 0; j-- {
			i := spec.Instrs[j]
			at := users[prog[i].Dst][0]
			pa := above[at]
			switch prog[at].Op {
			case "rot":
				pa.rots++
				if prog[at].K != nil { // (validate() refuses a rot without k)
					pa.giant = norm(*prog[at].K)
				}
			case "rescale":
				pa.rescales++
			}
			above[i] = pa
		}
		f := &fForm{groups: map[int][]fTerm{}, instrs: append([]int{}, spec.Instrs...), qmode: spec.Mode == "q",
			qbabies: spec.BabiesInQ}
		rescales := map[int]bool{}
		for j, i := range spec.Instrs {
			in := prog[i]
			if in.Op != "pmul" {
				continue
			}
			pa := above[i]
			if pa.rots > 1 || pa.rescales > 1 {
				return bad(fmt.Sprintf("%s.instrs[%d]", w, j), "product %d reaches the root through %d rotations and %d rescales (at most one of each)", i, pa.rots, pa.rescales)
			}
			rescales[pa.rescales] = true
			t := fTerm{base: in.Src, beta: 0, pt: in.Pt}
			if wi, ok := writer[in.Src]; ok && babySet[wi] {
				if rb, ok := rotated[in.Src]; ok {
					t.base, t.beta = rb.base, rb.beta
					lazyReaders[i] = true
				}
			}
			f.groups[pa.giant] = append(f.groups[pa.giant], t)
		}
		if len(f.groups) == 0 {
			return bad(w+".instrs", "a block has at least one pmul")
		}
		if len(rescales) > 1 {
			return bad(w+".instrs", "its products do not share one rescale state (every product is rescaled once, or none)")
		}
		f.rescaled = rescales[1]
		if f.qmode && (len(f.groups) != 1 || f.groups[0] == nil) {
			return bad(w+".mode", "\"q\" is for blocks without a giant rotation")
		}
		// the origin: the registers the products read are it or rotations (of rotations) of it
		f.base = f.bases()[0]
		for seen := 0; seen < n; seen++ {
			rb, ok := rotated[f.base]
			if !ok {
				break
			}
			f.base = rb.base
		}
		fp.roots[root] = f
		fp.rootDst[root] = prog[root].Dst
		for _, i := range spec.Instrs {
			fp.skip[i] = true
		}
	}
	// a lazily rotated baby's outputs are read only by block products (they are never made)
	for j, i := range ann.Babies {
		used := false
		for _, r := range prog[i].defs() {
			for _, u := range users[r] {
				used = true
				if !lazyReaders[u] {
					return bad(fmt.Sprintf(".babies[%d]", j), "instruction %d (%s): its outputs must be read, and only by the pmul products of blocks", i, prog[i].Op)
				}
			}
		}
		if !used {
			return bad(fmt.Sprintf(".babies[%d]", j), "instruction %d (%s): its outputs must be read, and only by the pmul products of blocks", i, prog[i].Op)
		}
		fp.skip[i] = true
		// under a key schedule computed where it stands, into the cache of its base
		fp.pre[i] = scheduled
	}
	// per base register: its blocks (the baby cache is freed after the last) and every
	// lazily rotated offset over all blocks (one decomposition each)
	seen := map[baby]bool{}
	for _, i := range sortedRoots(fp.roots) {
		f := fp.roots[i]
		for _, b := range f.bases() {
			fp.baseRoots[b]++
		}
		for _, g := range f.gammas() {
			for _, t := range f.groups[g] {
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
	return nil
}

// sortedRoots lists the blocks' root instructions in program order.
func sortedRoots(roots map[int]*fForm) []int {
	out := make([]int, 0, len(roots))
	for i := range roots {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

// ---------------------------------------------------------------------------------------
// Plaintext cache: plaintexts encoded once per model (plan + weights) and reused by every
// evaluation; encoding time is reported apart (model preparation).

type ptKey struct {
	name  string // (ptQP's Q-only plaintexts: "\x00q/" + name)
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
	// the bootstrapping evaluators with their encoded DFT matrices, kept for the next
	// evaluation (bootstate.go; under mu)
	boot *bootState
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
	// some babies were brought down in their own Q parts (babiesToQInPlace): every later
	// QP block on the base runs with its babies in Q
	inPlace bool
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
	// two products' plaintexts encoded together (termPlaintext, encode_pair.go): the
	// second vector's buffers, the second plaintext and the term it belongs to
	vecs2    vecBuffers
	ptBuf2   ringqp.Poly
	pairTerm *fTerm
	noPair   bool // SLOTPLAN_PAIR_ENCODE=off: one at a time (for A/B timings)
	// evalFusedQBabies: the block's sums kept in Q (giantless groups, giants' c0 parts)
	accQ0, accQ1 ring.Poly
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
			emb: newEmbedder(e.params, e.ecd.ShallowCopy()), ptBuf: rqp.NewPoly(), ptBuf2: rqp.NewPoly(), noPair: pairEncodeOff(),
			accQ0: e.params.RingQ().NewPoly(), accQ1: e.params.RingQ().NewPoly()}
		fw.cQP = &rlwe.Element[ringqp.Poly]{Value: []ringqp.Poly{rqp.NewPoly(), rqp.NewPoly()}, MetaData: &rlwe.MetaData{}}
		fw.cQP.IsNTT = true
		e.sc.workers = append(e.sc.workers, fw)
	}
	return e.sc.workers
}

// ptQP returns plaintext name encoded in QP at (level, levelP) with the given scale, or in
// Q alone for levelP -1 (a Q-mode block reads no P part: encoding one would be 5 NTTs of
// 15 at n16boot's top level, wasted), in NTT form but not in Montgomery form: the block's
// product kernel (newPlainProductKernel) multiplies each sum by 2^64 once instead.
func (e *executor) ptQP(name string, level, levelP int, scale rlwe.Scale) (ringqp.Poly, error) {
	key := ptKey{name, level, scale.Float64()}
	if levelP < 0 {
		key.name = "\x00q/" + name
	}
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
	poly := ringqp.Poly{Q: e.params.RingQ().AtLevel(level).NewPoly()}
	if levelP >= 0 {
		poly.P = e.params.RingP().AtLevel(levelP).NewPoly()
	}
	// the plaintext store (ptstore.go) where the process has one: read back, or encoded
	// and added (the same encoding as a streamed block's: entries serve both paths)
	var sk ptStoreKey
	stored, hit := false, false
	if e.store != nil {
		if sk, stored = e.store.key(vals, level, levelP, scale); stored {
			if hit, err = e.store.get(sk, poly); err != nil {
				return ringqp.Poly{}, err
			}
		}
	}
	if !hit {
		te := nowSeconds()
		if err := e.emb.embed(vals, e.streamMeta(scale), poly); err != nil {
			return ringqp.Poly{}, fmt.Errorf("cannot encode plaintext %q: %w", name, err)
		}
		if stored {
			e.store.noteEncode(nowSeconds()-te, int64(len(polyLimbs(poly)))*e.store.limbBytes)
			e.store.put(sk, poly)
		}
	}
	d := nowSeconds() - t
	c.seconds += d
	e.encodeSec += d
	if c.keep(int64(poly.BinarySize())) {
		c.qp[key] = poly
	}
	return poly, nil
}

// encodeInto encodes plaintext name in QP at (levelQ, levelP) (levelP -1: Q only) into the
// worker's buffer (as ptQP, without the cache) and returns it. Safe in parallel with other
// workers.
func (e *executor) encodeInto(fw *fusedWorker, name string, levelQ, levelP int, scale rlwe.Scale) (ringqp.Poly, error) {
	vals, err := e.ptVectorInto(name, &fw.vecs)
	if err != nil {
		return ringqp.Poly{}, err
	}
	poly := streamPoly(fw.ptBuf, levelQ, levelP)
	if err := fw.emb.embed(vals, e.streamMeta(scale), poly); err != nil {
		return ringqp.Poly{}, fmt.Errorf("cannot encode plaintext %q: %w", name, err)
	}
	return poly, nil
}

// termPlaintext is encodeInto for terms[j] of a block whose plaintexts are streamed, the
// terms taken in order: an even j is encoded together with j+1 (embedPair: one inverse FFT
// and one NTT per prime for both real diagonals) and the second kept in the worker's
// second buffer for the call with j+1; terms the pair path does not take (complex or CinS
// plaintexts, sparse slot counts, huge values) are encoded one by one.
func (e *executor) termPlaintext(fw *fusedWorker, terms []fTerm, j, levelQ, levelP int, scale rlwe.Scale) (ringqp.Poly, error) {
	if e.store != nil {
		return e.storedTermPlaintext(fw, terms, j, levelQ, levelP, scale)
	}
	return e.encodeTerm(fw, terms, j, levelQ, levelP, scale)
}

// storedTermPlaintext is termPlaintext with the plaintext store (ptstore.go): the entry of
// terms[j]'s values read into the worker's buffer, or, when the store has none, the term
// encoded as without it (paired with j+1 where it can be) and added.
func (e *executor) storedTermPlaintext(fw *fusedWorker, terms []fTerm, j, levelQ, levelP int, scale rlwe.Scale) (ringqp.Poly, error) {
	if fw.pairTerm != nil && fw.pairTerm == &terms[j] { // encoded with j-1, and added then
		fw.pairTerm = nil
		return streamPoly(fw.ptBuf2, levelQ, levelP), nil
	}
	fw.pairTerm = nil
	v, err := e.ptVectorInto(terms[j].pt, &fw.vecs)
	if err != nil {
		return ringqp.Poly{}, err
	}
	k, ok := e.store.key(v, levelQ, levelP, scale)
	dst := streamPoly(fw.ptBuf, levelQ, levelP)
	if ok {
		hit, err := e.store.get(k, dst)
		if err != nil || hit {
			return dst, err
		}
	}
	te := nowSeconds()
	p, err := e.encodeTerm(fw, terms, j, levelQ, levelP, scale)
	if err != nil || !ok {
		return p, err
	}
	n := int64(len(polyLimbs(p))) * e.store.limbBytes
	if j+1 < len(terms) && fw.pairTerm == &terms[j+1] {
		n *= 2 // the pair's two plaintexts in one encoding
	}
	e.store.noteEncode(nowSeconds()-te, n)
	e.store.put(k, p)
	if j+1 < len(terms) && fw.pairTerm == &terms[j+1] { // encoded with j: added now
		v2, err := e.ptVectorInto(terms[j+1].pt, &fw.vecs2)
		if err != nil {
			return ringqp.Poly{}, err
		}
		if k2, ok2 := e.store.key(v2, levelQ, levelP, scale); ok2 {
			e.store.put(k2, streamPoly(fw.ptBuf2, levelQ, levelP))
		}
	}
	return p, nil
}

// encodeTerm is termPlaintext without the store.
func (e *executor) encodeTerm(fw *fusedWorker, terms []fTerm, j, levelQ, levelP int, scale rlwe.Scale) (ringqp.Poly, error) {
	if fw.pairTerm != nil && fw.pairTerm == &terms[j] {
		fw.pairTerm = nil
		return streamPoly(fw.ptBuf2, levelQ, levelP), nil
	}
	fw.pairTerm = nil
	if j%2 == 0 && j+1 < len(terms) && !fw.noPair {
		v1, err := e.ptVectorInto(terms[j].pt, &fw.vecs)
		if err != nil {
			return ringqp.Poly{}, err
		}
		v2, err := e.ptVectorInto(terms[j+1].pt, &fw.vecs2)
		if err != nil {
			return ringqp.Poly{}, err
		}
		r1, ok1 := v1.([]float64)
		r2, ok2 := v2.([]float64)
		if ok1 && ok2 {
			p1 := streamPoly(fw.ptBuf, levelQ, levelP)
			if fw.emb.embedPair(r1, r2, e.streamMeta(scale), p1, streamPoly(fw.ptBuf2, levelQ, levelP)) {
				fw.pairTerm = &terms[j+1]
				atomic.AddInt64(&e.st.PairedPlaintexts, 2) // workers run in parallel
				return p1, nil
			}
		}
	}
	return e.encodeInto(fw, terms[j].pt, levelQ, levelP, scale)
}

// streamPoly is a worker's plaintext buffer at (levelQ, levelP) (levelP -1: Q only).
func streamPoly(buf ringqp.Poly, levelQ, levelP int) ringqp.Poly {
	poly := ringqp.Poly{Q: ring.Poly{Coeffs: buf.Q.Coeffs[:levelQ+1]}}
	if levelP >= 0 {
		poly.P = ring.Poly{Coeffs: buf.P.Coeffs[:levelP+1]}
	}
	return poly
}

// streamMeta is a streamed plaintext's metadata: full slots, NTT form, not Montgomery
// (newPlainQPProducts, ptQP).
func (e *executor) streamMeta(scale rlwe.Scale) *rlwe.MetaData {
	md := &rlwe.MetaData{}
	md.Scale = scale
	md.LogDimensions = e.params.LogMaxDimensions()
	md.IsBatched, md.IsNTT = true, true
	return md
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
		e.prof.start()
		rq.MulScalarBigint(ct.Value[0], pBig, bc.pc0)
		rq.MulScalarBigint(ct.Value[1], pBig, bc.pc1)
		e.prof.lap("baby_pct")
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
	e.prof.start()
	ws[0].eval.DecomposeNTT(levelQ, levelP, levelP+1, ct.Value[1], ct.IsNTT, e.sc.decomp)
	e.prof.lap("decompose")
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
	e.prof.lap("baby_rotations")
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
	stream := e.cache.limit < 0
	pts := map[int][]ringqp.Poly{}
	e.prof.start()
	for _, g := range gammas {
		if stream {
			break
		}
		for _, t := range f.groups[g] {
			lp := levelP
			if f.qmode {
				lp = -1
			}
			p, err := e.ptQP(t.pt, levelQ, lp, ptScale)
			if err != nil {
				return nil, err
			}
			pts[g] = append(pts[g], p)
		}
	}
	if !stream {
		e.prof.lap("encode")
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
		return e.evalFusedQ(f, ct, cts, caches, pts[0], stream, ptScale, tEval)
	}
	if stream && e.useQBabies(f, caches) {
		return e.evalFusedQBabies(f, ct, cts, caches, ptScale, tEval)
	}
	tBabies := nowSeconds()
	ws := e.workerPool()
	ringQP := e.params.RingQP().AtLevel(levelQ, levelP)
	prods := newPlainQPProducts(ringQP) // plaintexts not in Montgomery form (ptQP)
	errs := make([]error, len(ws))
	pf := e.prof // phases: with one worker only (one goroutine reads it)
	if len(ws) > 1 {
		pf = nil
	}
	pf.start()
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
						if pt, err = e.termPlaintext(fw, f.groups[g], j, levelQ, levelP, ptScale); err != nil {
							errs[w] = err
							return
						}
						fw.encSec += nowSeconds() - te
						pf.lap("encode")
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
					pf.lap("products")
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
					pf.lap("products")
					continue
				}
				// giant step: one ModDown of c1, one key switch, automorphism in QP
				ev := fw.eval
				ev.ModDownQPtoQNTT(levelQ, levelP, fw.tmp1.Q, fw.tmp1.P, fw.tmp1.Q)
				pf.lap("giant_moddown")
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
				pf.lap("giant_keyswitch")
				ringQP.Add(fw.cQP.Value[0], fw.tmp0, fw.cQP.Value[0])
				idx := ev.AutomorphismIndex(galEl)
				fw.addGiant(ringQP, idx)
				fw.started = true
				fw.giantSec += nowSeconds() - tg
				pf.lap("giant_automorphism")
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
		e.addWorkersEncoding(ws)
	}
	tFinish := nowSeconds()
	e.prof.start()
	first := sumGiants(ringQP, ws)
	out := e.newCt(levelQ)
	ws[0].eval.ModDownQPtoQNTT(levelQ, levelP, first.acc0.Q, first.acc0.P, out.Value[0])
	ws[0].eval.ModDownQPtoQNTT(levelQ, levelP, first.acc1.Q, first.acc1.P, out.Value[1])
	e.prof.lap("final_moddown")
	*out.MetaData = *ct.MetaData
	out.Scale = ct.Scale.Mul(ptScale)
	return e.fusedDone(f, out, gammas, ws, tEval, tBabies, tFinish, caches, levelQ)
}

// fusedDone ends a QP-mode block (evalFused, evalFusedQBabies): its statistics and phases,
// its rescale, and the release of the baby caches after their last block.
func (e *executor) fusedDone(f *fForm, out *rlwe.Ciphertext, gammas []int, ws []*fusedWorker, tEval, tBabies, tFinish float64,
	caches map[string]*babyCache, levelQ int) (*rlwe.Ciphertext, error) {
	bases := f.bases()
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
		e.prof.lap("rescale")
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

// evalFusedQ evaluates a giantless block in Q (the annotation's mode "q"): the products of the base's
// babies (brought down to Q once per base) or of the base itself accumulate lazily in Q
// with the plaintexts' Q parts (NTT, Montgomery), reduced as often as the QP path.
func (e *executor) evalFusedQ(f *fForm, ct *rlwe.Ciphertext, cts map[string]*rlwe.Ciphertext,
	caches map[string]*babyCache, pts []ringqp.Poly, stream bool, ptScale rlwe.Scale, tEval float64) (*rlwe.Ciphertext, error) {
	levelQ, levelP := ct.Level(), e.params.MaxLevelP()
	ringQ := e.params.RingQ().AtLevel(levelQ)
	fw := e.workerPool()[0]
	ev := fw.eval
	terms := f.groups[0]
	e.prof.start()
	e.babiesToQ(ev, terms, caches, levelQ, levelP, false)
	e.prof.lap("baby_moddown")
	tBabies := nowSeconds()
	out := e.newCt(levelQ)
	prods := newPlainProductKernel(ringQ) // plaintexts not in Montgomery form (ptQP)
	enc := 0.0
	for j, t := range terms {
		src := cts[t.base]
		if t.beta != 0 {
			src = caches[t.base].rotQ[t.beta]
		}
		var pt ring.Poly
		if stream {
			// (Run: encoded into the worker's buffer just before its product, its Q part only;
			// a fresh plaintext per product was fresh memory and 0.4 page faults per KiB)
			te := nowSeconds()
			p, err := e.termPlaintext(fw, terms, j, levelQ, -1, ptScale)
			if err != nil {
				return nil, err
			}
			pt = p.Q
			enc += nowSeconds() - te
			e.prof.lap("encode")
		} else {
			pt = pts[j].Q
		}
		prods.mulAdd(pt, src.Value[0], src.Value[1], out.Value[0], out.Value[1], j == 0)
		prods.afterTerm(j, out.Value[0], out.Value[1])
		if stream {
			e.prof.lap("products")
		}
	}
	prods.finish(out.Value[0], out.Value[1])
	*out.MetaData = *ct.MetaData
	out.Scale = ct.Scale.Mul(ptScale)
	e.prof.lap("products")
	tProducts := nowSeconds()
	if stream { // model preparation, timed apart (runTimed)
		e.encodeSec += enc
		e.cache.mu.Lock()
		e.cache.seconds += enc
		e.cache.mu.Unlock()
	}
	e.st.FusedBlocks++
	e.st.FusedQBlocks++
	e.st.FusedProducts += len(terms)
	if e.st.FusedPhaseSeconds == nil {
		e.st.FusedPhaseSeconds = map[string]float64{}
	}
	ph := e.st.FusedPhaseSeconds
	ph["babies"] += tBabies - tEval
	ph["products"] += tProducts - tBabies - enc
	if f.rescaled {
		if err := e.eval.Rescale(out, out); err != nil {
			return nil, err
		}
		e.prof.lap("rescale")
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

// addWorkersEncoding books the plaintext encoding the block's workers did while streaming:
// encoding is model preparation, timed apart (runTimed); the slowest worker's encoding is
// its share of the block's wall time (all of it with one worker), the sum is the cache's.
func (e *executor) addWorkersEncoding(ws []*fusedWorker) {
	enc, sum := 0.0, 0.0
	for _, fw := range ws {
		enc, sum = max(enc, fw.encSec), sum+fw.encSec
	}
	e.encodeSec += enc
	e.cache.mu.Lock()
	e.cache.seconds += sum
	e.cache.mu.Unlock()
}

// addGiant adds the giant step's key-switched sum (cQP) under the automorphism idx into the
// worker's accumulators (acc0, acc1: set by the worker's first giant, lazily added and
// reduced after).
func (fw *fusedWorker) addGiant(ringQP ringqp.Ring, idx []uint64) {
	if !fw.started {
		ringQP.AutomorphismNTTWithIndex(fw.cQP.Value[0], idx, fw.acc0)
		ringQP.AutomorphismNTTWithIndex(fw.cQP.Value[1], idx, fw.acc1)
		return
	}
	ringQP.AutomorphismNTTWithIndexThenAddLazy(fw.cQP.Value[0], idx, fw.acc0)
	ringQP.AutomorphismNTTWithIndexThenAddLazy(fw.cQP.Value[1], idx, fw.acc1)
	ringQP.RingQ.Reduce(fw.acc0.Q, fw.acc0.Q)
	ringQP.RingQ.Reduce(fw.acc1.Q, fw.acc1.Q)
	ringQP.RingP.Reduce(fw.acc0.P, fw.acc0.P)
	ringQP.RingP.Reduce(fw.acc1.P, fw.acc1.P)
}

// sumGiants adds the accumulators of the workers that ran a giant step into the first such
// worker's and returns it (nil when none did).
func sumGiants(ringQP ringqp.Ring, ws []*fusedWorker) *fusedWorker {
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
	return first
}
