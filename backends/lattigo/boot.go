package slotlattigo

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/dft"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/mod1"
	"github.com/tuneinsight/lattigo/v6/circuits/ckks/polynomial"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
	"github.com/tuneinsight/lattigo/v6/utils"
)

// Bootstrapping plans (params carry a "boot" object, SPEC section 3).
//
// The whole plan runs on the bootstrapping parameters (btp.BootstrappingParameters): the
// residual chain (the plan's log_q) followed by the bootstrapping circuit's primes, with
// the bootstrapping P primes. Residual and bootstrapping P primes differ, so a key of one
// cannot serve an evaluator of the other; with one parameter set, plan rotations and the
// bootstrap's rotations share one key space (a plan rotation whose offset the block holds
// uses the block's key while the block is resident). Fresh ciphertexts are encrypted at
// the top residual level (levels_after), which is also the level a bootstrap returns.
//
// Only literals with a test that proves them are accepted: N16QP1546H192H32 (at any log_n
// the plan asks for; log_n 14 is the insecure test size). The shipped N15QP768H192H32
// returned wrong results in our runs (shared notes).

// bootParams is a plan's params.boot object.
type bootParams struct {
	Literal     string  `json:"literal"`
	LevelsAfter int     `json:"levels_after"`
	MaxAbs      float64 `json:"max_abs"`
	KeyOffsets  []int   `json:"key_offsets"`
	Conjugation *bool   `json:"conjugation"`
	KeyBytes    int64   `json:"key_bytes"`
	MatrixBytes int64   `json:"matrix_bytes"`
	// Variants: the sparse bootstraps the preset offers (issue 36, bootvariant.go)
	Variants []bootVariantParams `json:"variants"`
}

// bootLiterals are the bootstrapping parameter literals this backend runs.
var bootLiterals = map[string]struct {
	scheme ckks.ParametersLiteral
	btp    bootstrapping.ParametersLiteral
}{
	"N16QP1546H192H32": {bootstrapping.N16QP1546H192H32.SchemeParams, bootstrapping.N16QP1546H192H32.BootstrappingParams},
}

// evalSetup is what a plan executes on: the evaluator's parameters, the level of fresh
// ciphertexts, and for a bootstrapping plan its bootstrapping parameters.
type evalSetup struct {
	params ckks.Parameters // the evaluator's (and the keys') parameters
	top    int             // level of fresh ciphertexts (and of a bootstrap's output)
	btp    *bootstrapping.Parameters
	boot   *bootParams
	// variants: the sparse bootstrapping parameters of each log_slots the plan's bootstrap
	// variants use (bootvariant.go; nil: full-slot bootstraps only)
	variants map[int]*bootstrapping.Parameters
}

// bootstrapParameters builds the bootstrapping parameters of a params object with "boot".
func (pp *planParams) bootstrapParameters() (*bootstrapping.Parameters, error) {
	b := pp.Boot
	lit, ok := bootLiterals[b.Literal]
	if !ok {
		known := make([]string, 0, len(bootLiterals))
		for k := range bootLiterals {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, fmt.Errorf("params.boot.literal %q is not supported (supported: %v)", b.Literal, known)
	}
	scheme := lit.scheme
	scheme.LogQ = slices.Clone(scheme.LogQ)
	scheme.LogP = slices.Clone(scheme.LogP)
	if !slices.Equal(pp.LogQ, scheme.LogQ) || !slices.Equal(pp.LogP, scheme.LogP) || pp.LogScale != scheme.LogDefaultScale {
		return nil, fmt.Errorf("params: log_q %v, log_p %v, log_scale %d differ from the residual chain of %s (log_q %v, log_p %v, log_scale %d)",
			pp.LogQ, pp.LogP, pp.LogScale, b.Literal, scheme.LogQ, scheme.LogP, scheme.LogDefaultScale)
	}
	scheme.LogN = pp.LogN
	residual, err := ckks.NewParametersFromLiteral(scheme)
	if err != nil {
		return nil, fmt.Errorf("params: Lattigo rejects the residual chain of %s at log_n %d: %w", b.Literal, pp.LogN, err)
	}
	blit := lit.btp
	blit.LogN = utils.Pointy(pp.LogN)
	btp, err := bootstrapping.NewParametersFromLiteral(residual, blit)
	if err != nil {
		return nil, fmt.Errorf("params: Lattigo rejects the bootstrapping parameters %s at log_n %d: %w", b.Literal, pp.LogN, err)
	}
	if b.LevelsAfter != residual.MaxLevel() {
		return nil, fmt.Errorf("params.boot.levels_after = %d but %s leaves %d levels after a bootstrap",
			b.LevelsAfter, b.Literal, residual.MaxLevel())
	}
	info := bootKeyInfo(btp)
	if b.KeyOffsets != nil {
		got := slices.Clone(b.KeyOffsets)
		sort.Ints(got)
		if !slices.Equal(got, info.offsets) {
			return nil, fmt.Errorf("params.boot.key_offsets %v differ from the rotations of %s at log_n %d: %v",
				b.KeyOffsets, b.Literal, pp.LogN, info.offsets)
		}
	}
	if b.Conjugation != nil && *b.Conjugation != info.conjugation {
		return nil, fmt.Errorf("params.boot.conjugation = %v but the bootstrapping keys of %s have conjugation = %v",
			*b.Conjugation, b.Literal, info.conjugation)
	}
	return &btp, nil
}

// setup builds what a plan executes on (plain CKKS parameters, or the bootstrapping ones).
func (pp *planParams) setup() (*evalSetup, error) {
	if pp.Boot == nil {
		params, err := pp.ckksParameters()
		if err != nil {
			return nil, err
		}
		return &evalSetup{params: params, top: params.MaxLevel()}, nil
	}
	if _, err := pp.ckksParameters(); err != nil { // same checks and messages for the chain
		return nil, err
	}
	btp, err := pp.bootstrapParameters()
	if err != nil {
		return nil, err
	}
	return &evalSetup{params: btp.BootstrappingParameters, top: btp.ResidualParameters.MaxLevel(), btp: btp, boot: pp.Boot}, nil
}

// bootKeys describes the bootstrapping key block's Galois elements.
type bootKeys struct {
	galEls      []uint64 // sorted, conjugation included
	offsets     []int    // the rotation offsets among them (sorted)
	byGalEl     map[uint64]int
	conjugation bool
}

// bootKeyInfo lists the Galois elements GenEvaluationKeys generates and the rotation
// offset of each (conjugation has none).
func bootKeyInfo(btp bootstrapping.Parameters) bootKeys {
	params := btp.BootstrappingParameters
	set := map[uint64]bool{params.GaloisElementForComplexConjugation(): true}
	for _, g := range btp.GaloisElements(params) {
		set[g] = true
	}
	return keyInfoOf(params, set)
}

// extendSecret is the secret of the bootstrapping parameters for a residual secret: the
// same key with its basis extended to the whole bootstrapping chain (what
// bootstrapping.Parameters.GenEvaluationKeys does when both rings have the same degree).
func extendSecret(btp bootstrapping.Parameters, skN1 *rlwe.SecretKey) *rlwe.SecretKey {
	paramsN2 := btp.BootstrappingParameters
	ringQ, ringP := paramsN2.RingQ(), paramsN2.RingP()
	skN2 := rlwe.NewSecretKey(paramsN2)
	buff := ringQ.NewPoly()
	rlwe.ExtendBasisSmallNormAndCenterNTTMontgomery(ringQ, ringQ, skN1.Value.Q, buff, skN2.Value.Q)
	rlwe.ExtendBasisSmallNormAndCenterNTTMontgomery(ringQ, ringP, skN1.Value.Q, buff, skN2.Value.P)
	return skN2
}

// newBootEvaluator builds Lattigo's bootstrapping evaluator around the executor's own
// evaluator (whose key set, the keyStore, serves the block's keys while it is resident).
//
// Memory order: bootstrapping.NewEvaluator encodes the DFT matrices before it checks the
// keys, so it is called with stand-in keys (empty objects under the right Galois
// elements) before the real keys are read; the encoder's big-float temporaries are then
// freed while no key is in memory yet. The key-dependent parts (evaluator, DFT and EvalMod
// evaluators, encapsulation keys) are then rebuilt from exported constructors.
func newBootEvaluator(btp bootstrapping.Parameters, galEls []uint64) (*bootstrapping.Evaluator, error) {
	standIn := make([]*rlwe.GaloisKey, len(galEls))
	for i, g := range galEls {
		standIn[i] = &rlwe.GaloisKey{GaloisElement: g}
	}
	evk := &bootstrapping.EvaluationKeys{
		MemEvaluationKeySet: rlwe.NewMemEvaluationKeySet(&rlwe.RelinearizationKey{}, standIn...),
		EvkDenseToSparse:    &rlwe.EvaluationKey{},
		EvkSparseToDense:    &rlwe.EvaluationKey{},
	}
	ev, err := bootstrapping.NewEvaluator(btp, evk)
	if err != nil {
		return nil, fmt.Errorf("cannot build the bootstrapping evaluator: %w", err)
	}
	ev.EvaluationKeys = nil
	ev.Evaluator, ev.DFTEvaluator, ev.Mod1Evaluator = nil, nil, nil
	return ev, nil
}

// wireBootEvaluator points a bootstrapping evaluator at the executor's evaluator and the
// block's encapsulation keys.
func wireBootEvaluator(ev *bootstrapping.Evaluator, eval *ckks.Evaluator, blk *bootBlock) {
	setBootKeys(ev, &bootstrapping.EvaluationKeys{
		EvkDenseToSparse:    blk.denseToSparse,
		EvkSparseToDense:    blk.sparseToDense,
		MemEvaluationKeySet: rlwe.NewMemEvaluationKeySet(blk.rlk, blk.galoisKeys()...),
	}, eval)
}

// setBootKeys wires a bootstrapping evaluator built under stand-in keys (newBootEvaluator:
// its DFT matrices stay) to evk and an evaluator of its bootstrapping parameters, as
// bootstrapping.NewEvaluator wires its own (eval nil: one made on evk).
func setBootKeys(ev *bootstrapping.Evaluator, evk *bootstrapping.EvaluationKeys, eval *ckks.Evaluator) {
	params := ev.BootstrappingParameters
	if eval == nil {
		eval = ckks.NewEvaluator(params, evk)
	}
	ev.EvaluationKeys = evk
	ev.Evaluator = eval
	ev.DFTEvaluator = dft.NewEvaluator(params, eval)
	ev.Mod1Evaluator = mod1.NewEvaluator(eval, polynomial.NewEvaluator(params, eval), ev.Mod1Parameters)
}

// matrixBytes is the size of a bootstrapping evaluator's encoded DFT matrices.
func matrixBytes(ev *bootstrapping.Evaluator) int64 {
	var n int64
	for _, m := range []dft.Matrix{ev.C2SDFTMatrix, ev.S2CDFTMatrix} {
		for _, lt := range m.Matrices {
			for _, p := range lt.Vec {
				n += int64(p.BinarySize())
			}
		}
	}
	return n
}

// bootstrap refreshes ct (left unchanged) with the bootstrapping evaluator and returns the
// result at the top residual level and the default scale.
func bootstrapCt(ev *bootstrapping.Evaluator, ct *rlwe.Ciphertext, inScale float64) (*rlwe.Ciphertext, float64, error) {
	t := time.Now()
	// Bootstrap works in place on the ciphertext's polynomials (ScaleDown): give it a copy,
	// its scale relabelled by inScale (in_scale, bootvariant.go: it refreshes ct / inScale)
	cp := ct.CopyNew()
	cp.Scale = cp.Scale.Mul(rlwe.NewScale(inScale))
	out, err := ev.Bootstrap(cp)
	if err != nil {
		return nil, 0, err
	}
	return out, time.Since(t).Seconds(), nil
}
