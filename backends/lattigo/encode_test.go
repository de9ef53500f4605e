package slotlattigo

import (
	"math"
	"math/rand"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// The embedder's encodings equal Lattigo's, coefficient for coefficient: float64 and
// complex128 values (zeros, both signs, magnitudes whose scaled value passes 2^64), full
// and sparse slot counts, Q plaintexts at every level and QP polynomials.
func TestEmbedderMatchesLattigo(t *testing.T) {
	params := embedTestParams(t)
	ecd := newEncoder(params)
	em := newEmbedder(params, ecd)
	rng := rand.New(rand.NewSource(1))
	big := true
	value := func(i int) float64 {
		switch i % 7 {
		case 0:
			return 0
		case 1:
			if !big { // x 2^40 in [2^61, 2^62): reduced, on the row-wise path (magnitudes)
				return -math.Ldexp(1+rng.Float64(), 21)
			}
			return -math.Ldexp(1+rng.Float64(), 30) // x 2^40 passes 2^64: the big-integer path
		case 2:
			if !big {
				return math.Ldexp(1+rng.Float64(), 21)
			}
			return math.Ldexp(1+rng.Float64(), 26)
		case 3:
			return -math.Ldexp(rng.Float64(), -45) // rounds to 0 (a negative zero: q)
		default:
			return 2*rng.Float64() - 1
		}
	}
	for _, c := range []struct {
		logSlots int
		big      bool
	}{{params.LogMaxSlots(), true}, {5, true}, {params.LogMaxSlots(), false}, {5, false}} {
		logSlots := c.logSlots
		big = c.big
		slots := 1 << logSlots
		reals := make([]float64, slots-3) // fewer values than slots: the rest are zeros
		cplx := make([]complex128, slots)
		for i := range reals {
			reals[i] = value(i)
		}
		for i := range cplx {
			cplx[i] = complex(value(i), value(i+3))
		}
		for level := 0; level <= params.MaxLevel(); level++ {
			for _, vals := range []interface{}{reals, cplx} {
				want, got := ckks.NewPlaintext(params, level), ckks.NewPlaintext(params, level)
				want.LogDimensions.Cols, got.LogDimensions.Cols = logSlots, logSlots
				if err := ecd.Encode(vals, want); err != nil {
					t.Fatal(err)
				}
				if err := em.encode(vals, got); err != nil {
					t.Fatal(err)
				}
				if !want.Value.Equal(&got.Value) {
					t.Fatalf("logSlots %d level %d %T: Q plaintexts differ", logSlots, level, vals)
				}
				md := &rlwe.MetaData{}
				md.Scale = rlwe.NewScale(math.Ldexp(1, 40))
				md.LogDimensions = params.LogMaxDimensions()
				md.LogDimensions.Cols = logSlots
				md.IsBatched, md.IsNTT, md.IsMontgomery = true, true, true
				rqp := params.RingQP().AtLevel(level, params.MaxLevelP())
				wq, gq := rqp.NewPoly(), rqp.NewPoly()
				if err := ecd.Embed(vals, md, wq); err != nil {
					t.Fatal(err)
				}
				if err := em.embed(vals, md, gq); err != nil {
					t.Fatal(err)
				}
				if !wq.Equal(&gq) {
					t.Fatalf("logSlots %d level %d %T: QP polynomials differ", logSlots, level, vals)
				}
			}
		}
	}
	// zeros of both signs (no sign bit for an exact zero) and a zero vector
	zs := make([]float64, params.MaxSlots())
	for i := range zs {
		if i%3 == 1 {
			zs[i] = math.Copysign(0, -1)
		} else if i%3 == 2 {
			zs[i] = -math.Ldexp(1, -60)
		}
	}
	for _, vals := range [][]float64{zs, make([]float64, params.MaxSlots())} {
		want, got := ckks.NewPlaintext(params, params.MaxLevel()), ckks.NewPlaintext(params, params.MaxLevel())
		if err := ecd.Encode(vals, want); err != nil {
			t.Fatal(err)
		}
		if err := em.encode(vals, got); err != nil {
			t.Fatal(err)
		}
		if !want.Value.Equal(&got.Value) {
			t.Fatalf("zeros: plaintexts differ")
		}
	}
	// Lattigo's errors stay Lattigo's
	if err := em.encode(make([]float64, params.MaxSlots()+1), ckks.NewPlaintext(params, 0)); err == nil {
		t.Fatal("too many values: no error")
	}
}

// BenchmarkEncode: Lattigo's Encode against the embedder at log N 14, top level.
func BenchmarkEncode(b *testing.B) {
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{
		LogN: 14, LogQ: []int{55, 40, 40, 40, 40, 40, 40, 40, 40}, LogP: []int{55, 55}, LogDefaultScale: 40})
	if err != nil {
		b.Fatal(err)
	}
	ecd := newEncoder(params)
	em := newEmbedder(params, ecd)
	vals := make([]float64, params.MaxSlots())
	for i := range vals {
		vals[i] = 2*rand.Float64() - 1
	}
	pt := ckks.NewPlaintext(params, params.MaxLevel())
	b.Run("lattigo", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_ = ecd.Encode(vals, pt)
		}
	})
	b.Run("embedder", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_ = em.encode(vals, pt)
		}
	})
}

// embedTestParams: log N 12 with Q and P primes, the embedder tests' ring.
func embedTestParams(t *testing.T) ckks.Parameters {
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{
		LogN: 12, LogQ: []int{55, 40, 40, 40}, LogP: []int{50, 50}, LogDefaultScale: 40})
	if err != nil {
		t.Fatal(err)
	}
	return params
}
