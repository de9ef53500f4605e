package slotlattigo

import (
	"math/rand"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// productRing: n13's moduli (50, 40, 40, 40 and P 48 bits: every limb IFMA-eligible) and
// n14's 55-bit ones (Lattigo's path), in one ring, so one sum crosses both kernels.
func productRing(t testing.TB, logN int) *ring.Ring {
	t.Helper()
	var qs []uint64
	for _, c := range []struct{ bits, n int }{{50, 1}, {40, 3}, {48, 1}, {55, 2}, {49, 1}} {
		g := ring.NewNTTFriendlyPrimesGenerator(uint64(c.bits), uint64(2<<logN))
		p, err := g.NextAlternatingPrimes(c.n)
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, p...)
	}
	r, err := ring.NewRing(1<<logN, qs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// lazy: coefficients in [0, 2q), as lazily reduced babies; the plaintexts below q.
func randomPoly(r *ring.Ring, rng *rand.Rand, lazy bool) ring.Poly {
	p := r.NewPoly()
	for i, s := range r.SubRings[:r.Level()+1] {
		bound := s.Modulus
		if lazy {
			bound *= 2
		}
		for k := range p.Coeffs[i] {
			p.Coeffs[i][k] = rng.Uint64() % bound
		}
	}
	return p
}

// The kernel's sums equal Lattigo's lazy Montgomery sums, residue for residue, for sums
// of 1 to 300 terms with the executor's overflow-margin reductions, on IFMA limbs and on
// Lattigo's limbs of the same ring, and with the IFMA path off.
func TestProductKernelMatchesLattigo(t *testing.T) {
	full := productRing(t, 10)
	rng := rand.New(rand.NewSource(7))
	margin := 64 // as QiOverflowMargin>>1 for 55-bit moduli: reductions inside the sum
	for _, c := range []struct{ level, terms, ifmaLimbs int }{
		{7, 1, 6}, {7, 2, 6}, {7, 63, 6}, {7, 64, 6}, {7, 65, 6}, {7, 300, 6},
		{4, 65, 5}, {0, 3, 1}, // a ring at a lower level (AtLevel keeps every subring)
	} {
		r, terms := full.AtLevel(c.level), c.terms
		pts := make([]ring.Poly, terms)
		as := make([][2]ring.Poly, terms)
		for j := range pts {
			pts[j] = randomPoly(r, rng, false)
			as[j] = [2]ring.Poly{randomPoly(r, rng, true), randomPoly(r, rng, true)}
		}
		want0, want1 := r.NewPoly(), r.NewPoly()
		for j := range pts {
			if j == 0 {
				r.MulCoeffsMontgomeryLazy(pts[j], as[j][0], want0)
				r.MulCoeffsMontgomeryLazy(pts[j], as[j][1], want1)
			} else {
				r.MulCoeffsMontgomeryLazyThenAddLazy(pts[j], as[j][0], want0)
				r.MulCoeffsMontgomeryLazyThenAddLazy(pts[j], as[j][1], want1)
			}
			if j%margin == margin-1 {
				r.Reduce(want0, want0)
				r.Reduce(want1, want1)
			}
		}
		r.Reduce(want0, want0)
		r.Reduce(want1, want1)
		for _, useIFMA := range []bool{true, false} {
			saved := ifmaEnabled
			ifmaEnabled = useIFMA && ifmaCPU
			k := newProductKernel(r)
			ifmaEnabled = saved
			nIFMA := 0
			for _, l := range k.limbs {
				if l.ifma {
					nIFMA++
				}
			}
			if want := map[bool]int{true: c.ifmaLimbs, false: 0}[useIFMA && ifmaCPU]; nIFMA != want {
				t.Fatalf("%d IFMA limbs, want %d (moduli below 2^51 only)", nIFMA, want)
			}
			got0, got1 := r.NewPoly(), r.NewPoly()
			got0.Coeffs[0][0] = 12345 // overwritten by the first term
			for j := range pts {
				k.mulAdd(pts[j], as[j][0], as[j][1], got0, got1, j == 0)
				if j%margin == margin-1 {
					k.reduce(got0, got1)
				}
			}
			k.finish(got0, got1)
			if !r.Equal(got0, want0) || !r.Equal(got1, want1) {
				t.Fatalf("%d terms, IFMA %v: the sums differ from Lattigo's", terms, nIFMA > 0)
			}
		}
	}
	if !ifmaCPU {
		t.Log("this CPU has no AVX-512 IFMA: only Lattigo's path was compared")
	}
}

// The plain kernel (plaintexts in NTT form, not Montgomery: the fused blocks' products)
// gives the sums of the Montgomery kernel on the plaintexts' Montgomery forms, residue
// for residue, on IFMA limbs, Lattigo's limbs and with the IFMA path off.
func TestPlainProductKernel(t *testing.T) {
	full := productRing(t, 10)
	rng := rand.New(rand.NewSource(9))
	margin := 64
	for _, c := range []struct{ level, terms int }{{7, 1}, {7, 65}, {7, 300}, {0, 3}} {
		r := full.AtLevel(c.level)
		pts := make([]ring.Poly, c.terms)
		mont := make([]ring.Poly, c.terms)
		as := make([][2]ring.Poly, c.terms)
		for j := range pts {
			pts[j] = randomPoly(r, rng, false)
			mont[j] = r.NewPoly()
			r.MForm(pts[j], mont[j])
			as[j] = [2]ring.Poly{randomPoly(r, rng, true), randomPoly(r, rng, true)}
		}
		for _, useIFMA := range []bool{true, false} {
			saved := ifmaEnabled
			ifmaEnabled = useIFMA && ifmaCPU
			plain, montK := newPlainProductKernel(r), newProductKernel(r)
			ifmaEnabled = saved
			sum := func(k productKernel, ps []ring.Poly) (ring.Poly, ring.Poly) {
				a0, a1 := r.NewPoly(), r.NewPoly()
				for j := range ps {
					k.mulAdd(ps[j], as[j][0], as[j][1], a0, a1, j == 0)
					if j%margin == margin-1 {
						k.reduce(a0, a1)
					}
				}
				k.finish(a0, a1)
				return a0, a1
			}
			want0, want1 := sum(montK, mont)
			got0, got1 := sum(plain, pts)
			if !r.Equal(got0, want0) || !r.Equal(got1, want1) {
				t.Fatalf("level %d, %d terms, IFMA %v: the plain kernel's sums differ", c.level, c.terms, useIFMA && ifmaCPU)
			}
		}
	}
}

// go test -run xxx -bench BenchmarkProductKernel: one block's 1024 products at log N 13
// (5 limbs), each streaming its own plaintext, 64 babies per giant step; reduced per sum.
func BenchmarkProductKernel(b *testing.B) {
	for _, kernel := range []string{"avx512ifma", "lattigo"} {
		b.Run(kernel, func(b *testing.B) {
			if kernel == "avx512ifma" && !ifmaCPU {
				b.Skip("no AVX-512 IFMA on this CPU")
			}
			var qs []uint64
			for _, c := range []struct{ bits, n int }{{50, 1}, {40, 3}, {48, 1}} {
				g := ring.NewNTTFriendlyPrimesGenerator(uint64(c.bits), uint64(2<<13))
				p, _ := g.NextAlternatingPrimes(c.n)
				qs = append(qs, p...)
			}
			r, err := ring.NewRing(1<<13, qs)
			if err != nil {
				b.Fatal(err)
			}
			saved := ifmaEnabled
			ifmaEnabled = kernel == "avx512ifma"
			k := newProductKernel(r)
			ifmaEnabled = saved
			rng := rand.New(rand.NewSource(1))
			babies := make([][2]ring.Poly, 64)
			for i := range babies {
				babies[i] = [2]ring.Poly{randomPoly(r, rng, true), randomPoly(r, rng, true)}
			}
			pts := make([]ring.Poly, 1024)
			for i := range pts {
				pts[i] = randomPoly(r, rng, false)
			}
			acc0, acc1 := r.NewPoly(), r.NewPoly()
			b.ResetTimer()
			for range b.N {
				for g := range 16 {
					for j := range 64 {
						k.mulAdd(pts[g*64+j], babies[j][0], babies[j][1], acc0, acc1, j == 0)
					}
					k.finish(acc0, acc1)
				}
			}
		})
	}
}

// The executor's baby rotation equals Lattigo's AutomorphismHoistedLazy, residue for
// residue: one P limb (n13's shape: every limb on IFMA) and two 55-bit P limbs (Lattigo's
// path on them), at the top level and below it.
func TestHoistedBabyMatchesLattigo(t *testing.T) {
	for _, lit := range []ckks.ParametersLiteral{
		{LogN: 11, LogQ: []int{50, 40, 40, 40}, LogP: []int{48}, LogDefaultScale: 40},
		{LogN: 11, LogQ: []int{55, 40, 40, 40, 40}, LogP: []int{55, 55}, LogDefaultScale: 40},
	} {
		params, err := ckks.NewParametersFromLiteral(lit)
		if err != nil {
			t.Fatal(err)
		}
		kgen := rlwe.NewKeyGenerator(params)
		sk := kgen.GenSecretKeyNew()
		galEls := []uint64{params.GaloisElement(1), params.GaloisElement(5), params.GaloisElement(-3)}
		ev := ckks.NewEvaluator(params, rlwe.NewMemEvaluationKeySet(nil, kgen.GenGaloisKeysNew(galEls, sk)...))
		enc := rlwe.NewEncryptor(params, sk)
		for _, level := range []int{params.MaxLevel(), 1} {
			// the kernel's overflow margins are Lattigo's (its sums reduce as often)
			k := newQPProducts(params.RingQP().AtLevel(level, params.MaxLevelP()))
			if wq, wp := max(1, params.QiOverflowMargin(level)>>1), max(1, params.PiOverflowMargin(params.MaxLevelP())>>1); k.q.margin != wq || k.p.margin != wp {
				t.Fatalf("logP %v level %d: margins %d, %d; Lattigo's %d, %d", lit.LogP, level, k.q.margin, k.p.margin, wq, wp)
			}
			ct := rlwe.NewCiphertext(params, 1, level)
			if err := enc.EncryptZero(ct); err != nil {
				t.Fatal(err)
			}
			levelP := params.MaxLevelP()
			rqp := params.RingQP()
			decomp := make([]ringqp.Poly, params.BaseRNSDecompositionVectorSize(level, levelP))
			for i := range decomp {
				decomp[i] = rqp.NewPoly()
			}
			ev.DecomposeNTT(level, levelP, levelP+1, ct.Value[1], ct.IsNTT, decomp)
			rq := params.RingQ().AtLevel(level)
			pc0 := rq.NewPoly()
			rq.MulScalarBigint(ct.Value[0], params.RingP().AtLevel(levelP).ModulusAtLevel[levelP], pc0)
			for _, g := range galEls {
				want := rlwe.NewElementExtended(params, 1, level, levelP)
				got := rlwe.NewElementExtended(params, 1, level, levelP)
				if err := ev.AutomorphismHoistedLazy(level, ct, decomp, g, want); err != nil {
					t.Fatal(err)
				}
				if err := hoistedBaby(ev, params, ct, decomp, pc0, g, got); err != nil {
					t.Fatal(err)
				}
				rqpl := params.RingQP().AtLevel(level, levelP)
				for i := range 2 {
					if !rqpl.Equal(got.Value[i], want.Value[i]) {
						t.Fatalf("logP %v level %d galEl %d: polynomial %d differs from Lattigo's", lit.LogP, level, g, i)
					}
				}
			}
		}
	}
}
