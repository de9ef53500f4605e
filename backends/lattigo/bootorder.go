package slotlattigo

import (
	"strings"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/dft"
	ltcommon "github.com/tuneinsight/lattigo/v6/circuits/common/lintrans"
	"github.com/tuneinsight/lattigo/v6/utils"
)

// The order in which a bootstrap asks for its Galois keys, predicted from its evaluator.
//
// A streamed block (bootstream.go) reads a bootstrap's keys ahead along their request
// order. Learning that order costs the first bootstrap of each kind in a run: it reads each
// key in line when asked, from storage when the page cache does not hold the block (at
// n16boot, ResNet-20's workload plan: six bootstraps, five of them a kind's first, 9.1 s of
// key waits and 12.6 GB read in line). The order is fixed by the evaluator's parameters and
// its DFT matrices, so it is predicted here by walking the same steps Lattigo v6.1.1 takes:
//
//   - ModUp of a sparse ciphertext (2^k < N/2 slots): the trace, one automorphism by 5^(2^i)
//     for i = k .. logN-2 (rlwe.Evaluator.Trace);
//   - CoeffsToSlots: each DFT matrix in turn (lintrans EvaluateSequential), then the
//     conjugation that splits real and imaginary parts and, sparse, the rotation by 2^k that
//     repacks the imaginary half (dft.Evaluator.CoeffsToSlots);
//   - EvalMod: no Galois key;
//   - SlotsToCoeffs: each DFT matrix in turn;
//
// and for one matrix with baby-step giant-step (N1 > 0): the baby rotations, sorted, each
// once, hoisted (PreRotatedCiphertextForDiagonalMatrixMultiplication), then the giant
// rotations, sorted (MultiplyByDiagMatrixBSGS); without (N1 = 0): its diagonals, sorted
// (MultiplyByDiagMatrix). Rotation 0 asks for no key.
//
// A prediction is only a read-ahead schedule: a request off it (another Lattigo, another
// path) drops the read-ahead and learns the order as before, and the executor counts the
// bootstraps that did so (stats boot_stream_misses; the tests require none).

// bootKeyOrder is the predicted request order of one bootstrap by ev, with the unpacking's
// conjugation after it (halves, pairs: bootvariant.go) when conjAfter; nil when ev does not
// take the steps above (iterated or 128-bit precision bootstrapping: Lattigo's Evaluate).
func bootKeyOrder(ev *bootstrapping.Evaluator, conjAfter bool) []uint64 {
	if ev == nil || ev.IterationsParameters != nil || len(ev.C2SDFTMatrix.Matrices) == 0 || len(ev.S2CDFTMatrix.Matrices) == 0 {
		return nil
	}
	p := ev.BootstrappingParameters
	conj := p.GaloisElementOrderTwoOrthogonalSubgroup()
	logSlots := ev.C2SDFTMatrix.LogSlots
	var seq []uint64
	if logSlots < p.LogN()-1 { // the trace (ModUp)
		for i := logSlots; i < p.LogN()-1; i++ {
			seq = append(seq, p.GaloisElement(1<<i))
		}
	}
	c2s, s2c := dftKeyOrder(ev.C2SDFTMatrix, p.GaloisElement), dftKeyOrder(ev.S2CDFTMatrix, p.GaloisElement)
	if c2s == nil || s2c == nil {
		return nil
	}
	seq = append(seq, c2s...)
	if f := ev.C2SDFTMatrix.Format; f == dft.RepackImagAsReal || f == dft.SplitRealAndImag {
		seq = append(seq, conj)
		if f == dft.RepackImagAsReal && logSlots < p.LogMaxSlots() {
			seq = append(seq, p.GaloisElement(1<<logSlots))
		}
	}
	seq = append(seq, s2c...)
	if conjAfter {
		seq = append(seq, conj)
	}
	return seq
}

// dftKeyOrder: the keys one DFT's matrices ask for, in order (nil when a matrix holds no
// diagonals: not encoded; never nil otherwise).
func dftKeyOrder(m dft.Matrix, galEl func(int) uint64) []uint64 {
	seq := []uint64{}
	for _, lt := range m.Matrices {
		if len(lt.Vec) == 0 {
			return nil
		}
		slots := 1 << lt.LogDimensions.Cols
		if lt.N1 == 0 {
			for _, k := range utils.GetSortedKeys(lt.Vec) {
				if k &= slots - 1; k != 0 {
					seq = append(seq, galEl(k))
				}
			}
			continue
		}
		index, _, babies := ltcommon.LinearTransformation(lt).BSGSIndex()
		for _, i := range babies {
			if i != 0 {
				seq = append(seq, galEl(i))
			}
		}
		for _, j := range utils.GetSortedKeys(index) {
			if j != 0 {
				seq = append(seq, galEl(j))
			}
		}
	}
	return seq
}

// bootKind is the stream kind of a bootstrap instruction and its order's prediction:
// "full", s<k> (replicas r<k> too: the same keys in the same order), h<k> and p<k> (the
// unpacking's conjugation last), "cins" (NeuJeans' bootstrap_cins: its own steps, learned).
func (e *executor) bootKind(in instr) (string, func() []uint64) {
	switch {
	case in.Op == "bootstrap_cins":
		return "cins", nil
	case in.LogSlots == nil:
		return "full", func() []uint64 { return bootKeyOrder(e.btpEval, false) }
	}
	kind := strings.Replace(variantKind(in), "r", "s", 1)
	conj := in.Op == "bootstrap2" || (in.Halves != nil && *in.Halves)
	k := *in.LogSlots
	return kind, func() []uint64 {
		if e.bv == nil {
			return nil
		}
		return bootKeyOrder(e.bv.evs[k], conj)
	}
}

// beginBootstrap: instruction in, a bootstrap, asks for its keys from here on.
func (e *executor) beginBootstrap(in instr) {
	e.keys.inBootstrap = true
	kind, predict := e.bootKind(in)
	next, _, ok := e.nextBootstrap()
	e.keys.beginBootstrapKind(kind, predict, ok && next == kind)
}

// endBootstrap: the current instruction's bootstrap is done; a streamed block reads ahead
// for the plan's next bootstrap, of whatever kind.
func (e *executor) endBootstrap() {
	e.keys.inBootstrap = false
	e.keys.endBootstrap()
	if next, predict, ok := e.nextBootstrap(); ok {
		e.keys.expectBootstrapKind(next, predict)
	}
}

// nextBootstrap: the kind of the plan's first bootstrap after the current instruction
// (nextBoot) and its order's prediction; false when none follows.
func (e *executor) nextBootstrap() (string, func() []uint64, bool) {
	if e.cur < len(e.nextBoot) {
		if j := e.nextBoot[e.cur]; j >= 0 {
			kind, predict := e.bootKind(e.plan.Program[j])
			return kind, predict, true
		}
	}
	return "", nil, false
}

// nextBootstraps maps each instruction to the index of the first bootstrap after it (-1:
// none).
func nextBootstraps(prog []instr) []int {
	next := make([]int, len(prog))
	j := -1
	for i := len(prog) - 1; i >= 0; i-- {
		next[i] = j
		switch prog[i].Op {
		case "bootstrap", "bootstrap2", "bootstrap_cins":
			j = i
		}
	}
	return next
}
