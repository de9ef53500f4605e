package slotlattigo

import (
	"encoding/json"
	"runtime"
	"sort"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// The executor's own memory, beside what the plan's memory model counts (keys, live
// ciphertexts, plaintexts): the sizes the Python side (backends/lattigo_memory.py) adds to
// the plan's memory series to model the process (docs/lattigo.md, "Memory").
//
// Every size is the BinarySize of an object the executor allocates, built here with the
// same constructors:
//   - evaluator: the ckks evaluator's buffers (rlwe.EvaluatorBuffers: a degree-2
//     ciphertext, 6 QP polys, one Q poly, the RNS decomposition's QP polys, N words; the
//     ckks evaluator's 3 Q polys; the encoder's Q poly and complex tables), once per worker
//     (workers > 1 shallow-copy the evaluator);
//   - fused: a fused linear block's working set (fused.go): the lazy baby rotations of its
//     base (extended ciphertexts in QP at the base's level), P*c0 and P*c1, the block's
//     plaintexts encoded in QP (with a plaintext cache, and for Q-mode blocks; otherwise
//     each worker encodes one or two at a time into its buffers), and per worker 8 QP polys
//     (accumulators, temporaries, cQP, two plaintext buffers) plus the decomposition
//     buffers (allocated at the first block, kept).
//
// The fused blocks are the plan's (its "fused" annotation, fused.go readFusion); the walk
// over blocks (which baby rotations are held, and the pool they return to) is replayed in
// Python from the blocks listed here.

// defaultGCPercent is GOGC during Run unless the options say otherwise: with Go's
// default 100 the heap grows to twice the live bytes (the resident keys) before a
// collection, so the process would hold up to the model's peak again in garbage.
const defaultGCPercent = 10

type fusedBlockInfo struct {
	Root  int    `json:"root"`  // instruction index the block is evaluated at
	First int    `json:"first"` // first instruction of the block
	Base  string `json:"base"`  // the origin: the bases are it or rotations of it, at its level
	// the registers the products read, each with the non-zero offsets it is rotated by
	// lazily (empty: the register is multiplied as it is, through P times it)
	Bases map[string][]int `json:"bases"`
	Terms int              `json:"terms"` // plaintext products (QP plaintexts encoded for the block)
	// QMode: evaluated in Q (the annotation's mode "q"); its plaintexts are encoded before it runs even
	// without a plaintext cache (a QP-mode block then streams them: one per worker)
	QMode bool `json:"qmode"`
	// The block's plaintexts (a cache across evaluations, BenchPlan's, keeps them in QP).
	Plaintexts []string `json:"plaintexts"`
}

type executorMemory struct {
	LogN    int `json:"log_n"`
	Top     int `json:"top"`
	Workers int `json:"workers"`
	// Per worker: the ckks evaluator's and encoder's buffers.
	EvaluatorBytes int64 `json:"evaluator_bytes"`
	// Once fusion runs: per worker 8 QP polys (accumulators, temporaries, cQP, two plaintexts), plus the
	// shared decomposition buffers.
	FusedWorkerBytes int64 `json:"fused_worker_bytes"`
	FusedDecompBytes int64 `json:"fused_decomp_bytes"`
	// By level 0..top: one baby rotation (extended ciphertext in QP), one QP plaintext,
	// one Q poly (P*c0, P*c1).
	QPElementBytes []int `json:"qp_element_bytes"`
	QPPolyBytes    []int `json:"qp_poly_bytes"`
	QPolyBytes     []int `json:"q_poly_bytes"`
	// The relinearisation key the run generates (at the plan's top level) and whether the
	// evaluation holds it beside the plan's keys (a keep-all bootstrapping plan uses the
	// one of the boot block, which the plan's memory model counts).
	RelinKeyBytes int  `json:"relin_key_bytes"`
	RelinResident bool `json:"relin_resident"`
	// The client Run keeps during the evaluation (secret key, key generator, encoder,
	// encryptor and decryptor with their buffers): the Go heap it allocates.
	ClientBytes int64 `json:"client_bytes"`
	// One rotation key as Run generates it without a key schedule (the plan's top level).
	GaloisKeyBytes int `json:"galois_key_bytes"`
	// GOGC during Run (defaultGCPercent): a benchmark that stands for Run passes it to
	// BenchPlan (gc_percent), so that its heap grows as Run's does.
	RunGCPercent int              `json:"run_gc_percent"`
	Fused        bool             `json:"fused"`
	Blocks       []fusedBlockInfo `json:"blocks"`
}

// ExecutorMemory reports the executor's memory beside the plan's values for one plan
// (options: {"workers": n}, default GOMAXPROCS, as Run uses).
func ExecutorMemory(planJSON string, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	var opt struct {
		Workers int  `json:"workers"`
		NoFuse  bool `json:"no_fuse"`
		commonOptions
	}
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	p, setup, slots, err := loadPlan(planJSON)
	if err != nil {
		return "", err
	}
	m := executorMemoryOf(setup, p, slots, opt.Workers, opt.NoFuse)
	data, err := json.Marshal(m)
	return string(data), err
}

func qpPolyBytes(params ckks.Parameters, levelQ, levelP int) int {
	return ringqp.Poly{Q: params.RingQ().AtLevel(levelQ).NewPoly(), P: params.RingP().AtLevel(levelP).NewPoly()}.BinarySize()
}

// evaluatorBytes is the BinarySize of the buffers of one ckks evaluator and its encoder.
func evaluatorBytes(params ckks.Parameters) int64 {
	ev := ckks.NewEvaluator(params, nil)
	b := ev.BuffCt.BinarySize() + ev.BuffInvNTT.BinarySize() + 8*len(ev.BuffBitDecomp)
	for i := range ev.BuffQP {
		b += ev.BuffQP[i].BinarySize()
	}
	for i := range ev.BuffDecompQP {
		b += ev.BuffDecompQP[i].BinarySize()
	}
	for _, q := range ev.BuffQ() {
		b += q.BinarySize()
	}
	// the encoder: a Q poly, the roots (NthRoot+1 complex128) and a slots-long complex buffer
	m := int(params.RingQ().NthRoot())
	b += params.RingQ().NewPoly().BinarySize() + 16*(m+1) + 16*params.MaxSlots()
	return int64(b)
}

func executorMemoryOf(setup *evalSetup, p *plan, slots, workers int, noFuse bool) *executorMemory {
	params := setup.params
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	levelP := params.MaxLevelP()
	m := &executorMemory{
		LogN: params.LogN(), Top: setup.top, Workers: workers,
		EvaluatorBytes: evaluatorBytes(params), RunGCPercent: defaultGCPercent,
		Blocks: []fusedBlockInfo{},
	}
	top := setup.top
	m.RelinKeyBytes = rlwe.NewRelinearizationKey(params, rlwe.EvaluationKeyParameters{LevelQ: &top, LevelP: &levelP}).BinarySize()
	m.ClientBytes = heapBytesOf(func() any { return newSetupClient(setup) })
	m.GaloisKeyBytes = rlwe.NewGaloisKey(params, rlwe.EvaluationKeyParameters{LevelQ: &top, LevelP: &levelP}).BinarySize()
	_, withBlock := p.usesBootBlock()
	withBlock = withBlock && setup.btp != nil
	m.RelinResident = p.needsRelin() && (p.hasKeySchedule() || !withBlock) // as run() decides
	full := qpPolyBytes(params, params.MaxLevel(), levelP)
	// and the two buffers streamed plaintexts are encoded into (a pair at a time,
	// encode_pair.go), with the embedder's N rounded coefficients of a pair
	m.FusedWorkerBytes = int64(8*full + 8*params.N())
	m.FusedDecompBytes = int64(params.BaseRNSDecompositionVectorSize(params.MaxLevel(), levelP) * full)
	for l := 0; l <= setup.top; l++ {
		m.QPElementBytes = append(m.QPElementBytes, rlwe.NewElementExtended(params, 1, l, levelP).BinarySize())
		m.QPPolyBytes = append(m.QPPolyBytes, qpPolyBytes(params, l, levelP))
		m.QPolyBytes = append(m.QPolyBytes, ring.Poly(params.RingQ().AtLevel(l).NewPoly()).BinarySize())
	}
	// the executor's fusion (under a key schedule: the blocks whose keys stay resident)
	if noFuse {
		return m
	}
	fp := p.fusion
	if fp == nil {
		var err error
		if fp, err = readFusion(p, slots); err != nil {
			return m // (loadPlan refuses such a plan before)
		}
	}
	for _, i := range sortedRoots(fp.roots) {
		f := fp.roots[i]
		bi := fusedBlockInfo{Root: i, First: i, Base: f.base, Terms: f.terms(), QMode: f.qmode, Bases: map[string][]int{}}
		for _, j := range f.instrs {
			bi.First = min(bi.First, j)
		}
		seen := map[baby]bool{}
		pts := map[string]bool{}
		for _, g := range f.groups {
			for _, t := range g {
				pts[t.pt] = true
				if _, ok := bi.Bases[t.base]; !ok {
					bi.Bases[t.base] = []int{}
				}
				if t.beta != 0 && !seen[baby{t.base, t.beta}] {
					seen[baby{t.base, t.beta}] = true
					bi.Bases[t.base] = append(bi.Bases[t.base], t.beta)
				}
			}
		}
		for _, bs := range bi.Bases {
			sort.Ints(bs)
		}
		for n := range pts {
			bi.Plaintexts = append(bi.Plaintexts, n)
		}
		sort.Strings(bi.Plaintexts)
		m.Blocks = append(m.Blocks, bi)
	}
	m.Fused = len(m.Blocks) > 0
	return m
}

// keepPoolAt drops the pooled baby rotations of every level but levelQ: a block at
// another level could not reuse them, and the memory model counts the pool of the level
// being worked at only (backends/lattigo_memory.py).
func (c *ptCache) keepPoolAt(levelQ int) {
	for l := range c.pool {
		if l != levelQ {
			delete(c.pool, l)
		}
	}
}

// heapBytesOf is the Go heap that the objects build returns keep alive (after collections
// before and after; nothing else runs in the extension meanwhile).
func heapBytesOf(build func() any) int64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	obj := build()
	runtime.GC()
	runtime.ReadMemStats(&b)
	runtime.KeepAlive(obj)
	return max(0, int64(b.HeapAlloc)-int64(a.HeapAlloc))
}
