package slotlattigo

import (
	"os"
	"sync"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
)

// QP-mode blocks with their babies in Q (streamed plaintexts).
//
// A QP block (giant steps, double hoisting) multiplies its plaintexts with babies kept in
// the extended basis QP, so each plaintext is encoded in QP: at n16boot 5 of the 10-15
// NTTs of every product's encoding are for the P primes, and every product runs on the P
// limbs too. When the plaintexts are streamed (Run: each diagonal encoded once, just
// before its product) and the block has many products per baby, it is cheaper to bring
// each baby down to Q once (two ModDowns, shared by every block on the same base, as
// Q-mode blocks do, but in the babies' own Q parts) and to run the products in Q, with
// Q-only plaintexts:
//
//	sum_g rot_g( sum_b pt_b * rot_b(x) )
//	   = ModDown( sum_g phi_g(KS_g(c1_g)) ) + sum_g (phi_g(c0_g), 0)      (c_g = sum_b pt_b * rot_b(x), in Q)
//
// The key switch of each giant's c1 sum is Lattigo's GadgetProductLazy (in QP, P times the
// switched value), accumulated in QP as before; the c0 sums (and the whole of a giantless
// group) are accumulated in Q after their automorphism and added after the final ModDown,
// which is exact for them. The giant steps lose their ModDown of c1 (the sum is in Q
// already). The result differs from the QP path by the rounding of the babies' ModDown
// (as a Q-mode block's), far below CKKS precision (TestFusedQBabiesMatchesQP).
//
// Which blocks: those the planner marks babies_in_q (planner/ir/fusion.py q_babies).
// SLOTPLAN_FUSED_QBABIES=0 forces the QP path (A/B comparisons), =always this one for every
// streamed QP block (tests on small rings, where it rarely pays).
var qBabiesMode = qBabiesModeOf(os.Getenv("SLOTPLAN_FUSED_QBABIES"))

const (
	qBabiesOff = iota
	qBabiesAuto
	qBabiesAlways
)

func qBabiesModeOf(env string) int {
	switch env {
	case "0":
		return qBabiesOff
	case "always":
		return qBabiesAlways
	}
	return qBabiesAuto
}

// useQBabies: a streamed QP block runs with its babies in Q when the plan's annotation says
// so (babies_in_q: the planner's rule, planner/ir/fusion.py q_babies, which weighs the NTTs
// of the P primes of every product's plaintext and of one ModDown per giant step against the
// babies' ModDowns), or when one of its bases had its babies brought down in place by an
// earlier such block (its QP babies are gone; the planner's rule marks these blocks too).
func (e *executor) useQBabies(f *fForm, caches map[string]*babyCache) bool {
	if qBabiesMode == qBabiesOff || f.qmode {
		return false
	}
	if qBabiesMode == qBabiesAlways || f.qbabies {
		return true
	}
	for _, b := range f.bases() {
		if caches[b].inPlace { // its QP babies are gone (babiesToQ in place)
			return true
		}
	}
	return false
}

// babiesToQ brings the babies the terms read down to Q, once per base (bc.rotQ).
// Not in place: into pooled ciphertexts (newCt; blockDone recycles them), for Q-mode
// blocks, whose base's QP babies may still be read by a later QP-path block. In place: in
// the babies' own Q parts (no memory besides the QP babies the memory model counts), for
// Q-babies blocks only, as no block on the base reads its QP babies after the first such
// block (useQBabies only grows more true as the base's babies come down); the Q views are
// not owned (blockDone's recycle skips them).
func (e *executor) babiesToQ(ev interface {
	ModDownQPtoQNTT(levelQ, levelP int, p1Q, p1P, p2Q ring.Poly)
}, terms []fTerm, caches map[string]*babyCache, levelQ, levelP int, inPlace bool) {
	for _, t := range terms {
		bc := caches[t.base]
		if t.beta == 0 || bc.rotQ[t.beta] != nil {
			continue
		}
		r := bc.rot[t.beta]
		if !inPlace {
			q := e.newCt(levelQ)
			ev.ModDownQPtoQNTT(levelQ, levelP, r.Value[0].Q, r.Value[0].P, q.Value[0])
			ev.ModDownQPtoQNTT(levelQ, levelP, r.Value[1].Q, r.Value[1].P, q.Value[1])
			bc.rotQ[t.beta] = q
			continue
		}
		bc.inPlace = true
		ev.ModDownQPtoQNTT(levelQ, levelP, r.Value[0].Q, r.Value[0].P, r.Value[0].Q)
		ev.ModDownQPtoQNTT(levelQ, levelP, r.Value[1].Q, r.Value[1].P, r.Value[1].Q)
		md := *r.MetaData
		bc.rotQ[t.beta] = &rlwe.Ciphertext{Element: rlwe.Element[ring.Poly]{
			Value:    []ring.Poly{{Coeffs: r.Value[0].Q.Coeffs[:levelQ+1]}, {Coeffs: r.Value[1].Q.Coeffs[:levelQ+1]}},
			MetaData: &md}}
	}
}

// evalFusedQBabies evaluates a QP block with its babies in Q and its plaintexts streamed
// in Q (the file's comment); the giant steps are split over the workers as in evalFused.
func (e *executor) evalFusedQBabies(f *fForm, ct *rlwe.Ciphertext, cts map[string]*rlwe.Ciphertext,
	caches map[string]*babyCache, ptScale rlwe.Scale, tEval float64) (*rlwe.Ciphertext, error) {
	levelQ, levelP := ct.Level(), e.params.MaxLevelP()
	gammas := f.gammas()
	ws := e.workerPool()
	e.prof.start()
	for _, g := range gammas {
		e.babiesToQ(ws[0].eval, f.groups[g], caches, levelQ, levelP, true)
	}
	e.prof.lap("baby_moddown")
	tBabies := nowSeconds()
	ringQP := e.params.RingQP().AtLevel(levelQ, levelP)
	ringQ := ringQP.RingQ
	prods := newPlainProductKernel(ringQ) // plaintexts not in Montgomery form
	errs := make([]error, len(ws))
	pf := e.prof // phases: with one worker only (one goroutine reads it)
	if len(ws) > 1 {
		pf = nil
	}
	pf.start()
	var wg sync.WaitGroup
	for w := range ws {
		fw := ws[w]
		fw.started = false
		fw.prodSec, fw.giantSec, fw.encSec = 0, 0, 0
		for _, a := range []ring.Poly{fw.accQ0, fw.accQ1} {
			for _, c := range a.Coeffs[:levelQ+1] {
				clear(c)
			}
		}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			fw := ws[w]
			t0, t1 := fw.tmp0.Q, fw.tmp1.Q
			for gi := w; gi < len(gammas); gi += len(ws) {
				g := gammas[gi]
				tp, enc := nowSeconds(), fw.encSec
				for j, t := range f.groups[g] {
					te := nowSeconds()
					pt, err := e.termPlaintext(fw, f.groups[g], j, levelQ, -1, ptScale)
					if err != nil {
						errs[w] = err
						return
					}
					fw.encSec += nowSeconds() - te
					pf.lap("encode")
					src := cts[t.base]
					if t.beta != 0 {
						src = caches[t.base].rotQ[t.beta]
					}
					prods.mulAdd(pt.Q, src.Value[0], src.Value[1], t0, t1, j == 0)
					prods.afterTerm(j, t0, t1)
					pf.lap("products")
				}
				prods.finish(t0, t1)
				tg := nowSeconds()
				fw.prodSec += tg - tp - (fw.encSec - enc)
				if g == 0 {
					ringQ.Add(fw.accQ0, t0, fw.accQ0)
					ringQ.Add(fw.accQ1, t1, fw.accQ1)
					fw.giantSec += nowSeconds() - tg
					pf.lap("products")
					continue
				}
				// giant step: one key switch of the c1 sum (already in Q), automorphisms
				ev := fw.eval
				galEl := e.params.GaloisElement(g)
				evk, err := ev.CheckAndGetGaloisKey(galEl)
				if err != nil {
					errs[w] = err
					return
				}
				if err = ev.GadgetProductLazy(levelQ, t1, &evk.GadgetCiphertext, fw.cQP); err != nil {
					errs[w] = err
					return
				}
				pf.lap("giant_keyswitch")
				idx := ev.AutomorphismIndex(galEl)
				fw.addGiant(ringQP, idx)
				ringQ.AutomorphismNTTWithIndexThenAddLazy(t0, idx, fw.accQ0)
				ringQ.Reduce(fw.accQ0, fw.accQ0)
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
	e.addWorkersEncoding(ws)
	tFinish := nowSeconds()
	e.prof.start()
	for _, fw := range ws[1:] {
		ringQ.Add(ws[0].accQ0, fw.accQ0, ws[0].accQ0)
		ringQ.Add(ws[0].accQ1, fw.accQ1, ws[0].accQ1)
	}
	first := sumGiants(ringQP, ws)
	out := e.newCt(levelQ)
	if first != nil {
		ws[0].eval.ModDownQPtoQNTT(levelQ, levelP, first.acc0.Q, first.acc0.P, out.Value[0])
		ws[0].eval.ModDownQPtoQNTT(levelQ, levelP, first.acc1.Q, first.acc1.P, out.Value[1])
		ringQ.Add(out.Value[0], ws[0].accQ0, out.Value[0])
		ringQ.Add(out.Value[1], ws[0].accQ1, out.Value[1])
	} else {
		out.Value[0].CopyLvl(levelQ, ws[0].accQ0)
		out.Value[1].CopyLvl(levelQ, ws[0].accQ1)
	}
	e.prof.lap("final_moddown")
	*out.MetaData = *ct.MetaData
	out.Scale = ct.Scale.Mul(ptScale)
	e.st.FusedQBabyBlocks++
	return e.fusedDone(f, out, gammas, ws, tEval, tBabies, tFinish, caches, levelQ)
}
