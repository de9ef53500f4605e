package slotlattigo

import (
	"math"
	"os"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// The products of a fused block: sum_j pt_j * ct_j over the limbs of Q (and P), with the
// ciphertexts in NTT form and the plaintexts in NTT and Montgomery form (pt * 2^64 mod q),
// accumulated lazily and reduced once per sum. They are half of a block's time at n13.
//
// On a CPU with AVX-512 IFMA, limbs whose modulus is below MaxIFMAModulus take the
// 8-lane kernel of product_amd64.s: a Montgomery product with radix 2^52, so each term is
// ct * pt * 2^12 mod q, in (0, 2q) as Lattigo's lazy product; finish multiplies the sum
// by 2^-12 (a Montgomery product by 2^52 mod q) and reduces it. Other limbs take Lattigo's
// MulCoeffsMontgomeryLazy[ThenAddLazy] and Reduce. Both give the same residues, bit for
// bit (TestProductKernelMatchesLattigo), so plans, errors and outputs do not depend on
// the CPU. Measured (go test -bench BenchmarkProductKernel, log N 13, 5 limbs, pinned
// core): 1024 products streaming their plaintexts take 42 ms against Lattigo's 129 ms.
//
// SLOTPLAN_PRODUCT_KERNEL=lattigo forces Lattigo's path (comparisons, calibration of the
// scalar path on a CPU with IFMA).

// MaxIFMAModulus bounds the limbs the IFMA kernel takes. With the plaintext below q and
// the ciphertext below 2q (lazy babies), both operands are below 2^52 and each term
// below 2q, as Lattigo's lazy product, so a lazy sum holds as many terms as Lattigo's
// (QiOverflowMargin). Lattigo's "50-bit" primes lie on both sides of 2^50.
const MaxIFMAModulus = uint64(1) << 51

// ifmaEnabled: the kernel is used where the CPU has it, unless the environment forbids it.
var ifmaEnabled = ifmaCPU && os.Getenv("SLOTPLAN_PRODUCT_KERNEL") != "lattigo"

// ProductKernelName names the kernel the products of this process use (reported with
// calibrations and benches).
func ProductKernelName() string {
	if ifmaEnabled {
		return "avx512ifma"
	}
	return "lattigo"
}

type limbKernel struct {
	s      *ring.SubRing
	ifma   bool
	qinv52 uint64 // q^-1 mod 2^52
	// fix: finish's Montgomery product by it brings a sum to sum_j pt_j * a_j mod q. With
	// plaintexts in Montgomery form: 2^52 mod q on IFMA limbs (a multiplication by 2^-12),
	// none on the others (fix 0: a reduction). With plain plaintexts (newPlainProductKernel):
	// 2^116 mod q on IFMA limbs (times 2^52), 2^128 mod q on the others (times 2^64).
	fix uint64
}

// productKernel holds the limb kernels of one ring (Q or P at a level) and its overflow
// margin; immutable, shared by the workers of a block.
type productKernel struct {
	limbs []limbKernel
	// margin: lazy terms a sum may hold before a reduction, Lattigo's QiOverflowMargin/2
	// (PiOverflowMargin/2 for P), 2^64 / max q / 2, as Lattigo's own lazy sums use
	margin int
}

func newProductKernel(r *ring.Ring) productKernel {
	return newKernel(r, false)
}

// newPlainProductKernel is the kernel for plaintexts in NTT form but not in Montgomery form
// (pt, not pt * 2^64 mod q): each term is then pt * a * 2^-64 (2^-52 on IFMA limbs) and
// finish multiplies the sum back once, instead of one Montgomery conversion per plaintext
// when it is encoded (9% of a streamed block's time at n14boot; fused.go).
func newPlainProductKernel(r *ring.Ring) productKernel {
	return newKernel(r, true)
}

func newKernel(r *ring.Ring, plain bool) productKernel {
	if r == nil {
		return productKernel{margin: 1}
	}
	subs := r.SubRings[:r.Level()+1] // AtLevel keeps every subring and sets the level
	k := productKernel{limbs: make([]limbKernel, len(subs))}
	maxQ := uint64(0)
	for i, s := range subs {
		q := s.Modulus
		maxQ = max(maxQ, q)
		k.limbs[i] = limbKernel{s: s, ifma: ifmaEnabled && q < MaxIFMAModulus && s.N%8 == 0}
		bred := s.BRedConstant
		switch {
		case k.limbs[i].ifma && plain:
			k.limbs[i].qinv52 = inverse52(q)
			k.limbs[i].fix = ring.MForm((uint64(1)<<52)%q, q, bred) // 2^116 mod q
		case k.limbs[i].ifma:
			k.limbs[i].qinv52 = inverse52(q)
			k.limbs[i].fix = (uint64(1) << 52) % q
		case plain:
			k.limbs[i].fix = ring.MForm(ring.MForm(1, q, bred), q, bred) // 2^128 mod q
		}
	}
	k.margin = max(1, int(math.Exp2(64)/float64(maxQ))>>1)
	return k
}

// inverse52 returns q^-1 mod 2^52 for an odd q (Newton's iteration doubles the correct bits).
func inverse52(q uint64) uint64 {
	x := q // q * q = 1 mod 8
	for range 5 {
		x *= 2 - q*x
	}
	return x & (1<<52 - 1)
}

// mulAdd sets (first) or adds to acc0, acc1 the lazy products pt * a0, pt * a1
// (pt below q, a0 and a1 below 2q).
func (k productKernel) mulAdd(pt, a0, a1, acc0, acc1 ring.Poly, first bool) {
	for i, l := range k.limbs {
		if l.ifma {
			f := mulAddLazy52
			if first {
				f = mulLazy52
			}
			f(&acc0.Coeffs[i][0], &acc1.Coeffs[i][0], &a0.Coeffs[i][0], &a1.Coeffs[i][0], &pt.Coeffs[i][0],
				l.s.N, l.s.Modulus, l.qinv52)
			continue
		}
		if first {
			l.s.MulCoeffsMontgomeryLazy(pt.Coeffs[i], a0.Coeffs[i], acc0.Coeffs[i])
			l.s.MulCoeffsMontgomeryLazy(pt.Coeffs[i], a1.Coeffs[i], acc1.Coeffs[i])
		} else {
			l.s.MulCoeffsMontgomeryLazyThenAddLazy(pt.Coeffs[i], a0.Coeffs[i], acc0.Coeffs[i])
			l.s.MulCoeffsMontgomeryLazyThenAddLazy(pt.Coeffs[i], a1.Coeffs[i], acc1.Coeffs[i])
		}
	}
}

// afterTerm: after the j-th term (from 0) of a lazy sum, the reduction its overflow
// margin asks for.
func (k productKernel) afterTerm(j int, acc0, acc1 ring.Poly) {
	if j%k.margin == k.margin-1 {
		k.reduce(acc0, acc1)
	}
}

// reduce brings lazy sums below q on every limb; the IFMA limbs stay scaled by 2^12
// until finish.
func (k productKernel) reduce(acc0, acc1 ring.Poly) {
	for i, l := range k.limbs {
		l.s.Reduce(acc0.Coeffs[i], acc0.Coeffs[i])
		l.s.Reduce(acc1.Coeffs[i], acc1.Coeffs[i])
	}
}

// finish ends a sum: every limb reduced below q and equal to sum_j pt_j * a_j mod q.
func (k productKernel) finish(acc0, acc1 ring.Poly) {
	for i, l := range k.limbs {
		if l.fix != 0 {
			l.s.MulScalarMontgomery(acc0.Coeffs[i], l.fix, acc0.Coeffs[i])
			l.s.MulScalarMontgomery(acc1.Coeffs[i], l.fix, acc1.Coeffs[i])
			continue
		}
		l.s.Reduce(acc0.Coeffs[i], acc0.Coeffs[i])
		l.s.Reduce(acc1.Coeffs[i], acc1.Coeffs[i])
	}
}

// qpProducts: the kernels of Q and P at a block's levels.
type qpProducts struct {
	q, p productKernel
}

func newQPProducts(r ringqp.Ring) qpProducts {
	return qpProducts{q: newProductKernel(r.RingQ), p: newProductKernel(r.RingP)}
}

// newPlainQPProducts: newPlainProductKernel on both parts.
func newPlainQPProducts(r ringqp.Ring) qpProducts {
	return qpProducts{q: newPlainProductKernel(r.RingQ), p: newPlainProductKernel(r.RingP)}
}

func (k qpProducts) mulAdd(pt, a0, a1, acc0, acc1 ringqp.Poly, first bool) {
	k.q.mulAdd(pt.Q, a0.Q, a1.Q, acc0.Q, acc1.Q, first)
	k.p.mulAdd(pt.P, a0.P, a1.P, acc0.P, acc1.P, first)
}

// afterTerm: productKernel.afterTerm on both parts.
func (k qpProducts) afterTerm(j int, acc0, acc1 ringqp.Poly) {
	k.q.afterTerm(j, acc0.Q, acc1.Q)
	k.p.afterTerm(j, acc0.P, acc1.P)
}

// finish ends a sum in QP (productKernel.finish on both parts).
func (k qpProducts) finish(acc0, acc1 ringqp.Poly) {
	k.q.finish(acc0.Q, acc1.Q)
	k.p.finish(acc0.P, acc1.P)
}

// hoistedBaby is Lattigo's AutomorphismHoistedLazy for an NTT ciphertext with the key's
// inner product (sum_i decomp_i * evk_i, in QP) on the product kernel, and P*c0 taken
// from the base's cache instead of recomputed per rotation: out = phi_galEl(sum_i decomp_i
// evk_i + (P c0, 0)), reduced, residue for residue Lattigo's (TestHoistedBabyMatchesLattigo).
// It uses the evaluator's BuffQP[0..1], as Lattigo's does; keys with a base-two
// decomposition and coefficient-domain ciphertexts take Lattigo's own.
func hoistedBaby(ev *ckks.Evaluator, params ckks.Parameters, ct *rlwe.Ciphertext, decomp []ringqp.Poly, pc0 ring.Poly,
	galEl uint64, out *rlwe.Element[ringqp.Poly]) error {
	levelQ := ct.Level()
	evk, err := ev.CheckAndGetGaloisKey(galEl)
	if err != nil {
		return err
	}
	if evk.BaseTwoDecomposition != 0 || !ct.IsNTT {
		return ev.AutomorphismHoistedLazy(levelQ, ct, decomp, galEl, out)
	}
	levelP := evk.LevelP()
	ringQP := params.RingQP().AtLevel(levelQ, levelP)
	k := newQPProducts(ringQP)
	c0, c1 := ev.BuffQP[0], ev.BuffQP[1]
	for i := range params.BaseRNSDecompositionVectorSize(levelQ, levelP) {
		g := evk.Value[i][0]
		k.mulAdd(decomp[i], g[0], g[1], c0, c1, i == 0)
		k.afterTerm(i, c0, c1)
	}
	k.finish(c0, c1)
	idx := ev.AutomorphismIndex(galEl)
	ringQP.AutomorphismNTTWithIndex(c1, idx, out.Value[1])
	ringQP.RingQ.Add(c0.Q, pc0, c0.Q)
	ringQP.AutomorphismNTTWithIndex(c0, idx, out.Value[0])
	return nil
}
