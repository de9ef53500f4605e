package slotlattigo

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

func benchParams16(b *testing.B) ckks.Parameters {
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{
		LogN: 16, LogQ: []int{60, 40, 40, 40, 40, 40, 40, 40, 40, 40}, LogP: []int{61, 61, 61, 61, 61}, LogDefaultScale: 40})
	if err != nil {
		b.Fatal(err)
	}
	return params
}

// BenchmarkEncodeParts16: where a streamed plaintext's encoding goes at log N 16 (one
// diagonal at level 6, as ResNet-20's n16boot blocks encode them): the whole embedding in
// QP (12 primes) and in Q (7), the inverse FFT, the fixed-point conversion (QP) and the
// NTTs (one prime; QP).
func BenchmarkEncodeParts16(b *testing.B) {
	params := benchParams16(b)
	ecd := newEncoder(params)
	em := newEmbedder(params, ecd)
	rng := rand.New(rand.NewSource(1))
	vals := make([]float64, params.MaxSlots())
	for i := range vals {
		vals[i] = 2*rng.Float64() - 1
	}
	level := 6
	rqp := params.RingQP().AtLevel(level, params.MaxLevelP())
	poly := ringqp.Poly{Q: params.RingQ().AtLevel(level).NewPoly(), P: params.RingP().NewPoly()}
	md := &rlwe.MetaData{}
	md.Scale = params.DefaultScale()
	md.LogDimensions = params.LogMaxDimensions()
	md.IsBatched, md.IsNTT = true, true
	b.Run("embed_qp_l6", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := em.embed(vals, md, poly); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("embed_q_l6", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := em.embed(vals, md, ringqp.Poly{Q: poly.Q}); err != nil {
				b.Fatal(err)
			}
		}
	})
	buf := make([]complex128, params.MaxSlots())
	b.Run("ifft", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			for j, x := range vals {
				buf[j] = complex(x, 0)
			}
			if err := ecd.IFFT(buf, params.LogMaxSlots()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fixedpoint_qp_l6", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			ex := em.magnitudes(buf, md.Scale.Float64())
			em.toFixedPointCRT(rqp.RingQ, buf, md.Scale.Float64(), poly.Q.Coeffs, ex)
			em.toFixedPointCRT(rqp.RingP, buf, md.Scale.Float64(), poly.P.Coeffs, ex)
		}
	})
	b.Run("ntt_one_prime", func(b *testing.B) {
		r := params.RingQ().AtLevel(0)
		p := r.NewPoly()
		for i := 0; i < b.N; i++ {
			r.NTT(p, p)
		}
	})
	b.Run("ntt_qp_l6", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rqp.NTT(poly, poly)
		}
	})
	// two diagonals: one after the other, and as one pair (encode_pair.go)
	vals2 := make([]float64, len(vals))
	for i := range vals2 {
		vals2[i] = 2*rng.Float64() - 1
	}
	poly2 := ringqp.Poly{Q: params.RingQ().AtLevel(level).NewPoly(), P: params.RingP().NewPoly()}
	for _, qp := range []bool{true, false} {
		p1, p2, suffix := poly, poly2, "qp_l6"
		if !qp {
			p1, p2, suffix = ringqp.Poly{Q: poly.Q}, ringqp.Poly{Q: poly2.Q}, "q_l6"
		}
		b.Run("two_embeds_"+suffix, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if em.embed(vals, md, p1) != nil || em.embed(vals2, md, p2) != nil {
					b.Fatal("embed")
				}
			}
		})
		b.Run("embed_pair_"+suffix, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if !em.embedPair(vals, vals2, md, p1, p2) {
					b.Fatal("embedPair refused")
				}
			}
		})
	}
}

// BenchmarkQBabiesParts16: the parts fused_qbabies.go trades at log N 16, per level: a
// plaintext's embedding in QP and in Q, one product (two polynomials) on QP limbs and on Q
// limbs, and one ModDown of a polynomial (a baby brought down to Q takes two).
func BenchmarkQBabiesParts16(b *testing.B) {
	params := benchParams16(b)
	ecd := newEncoder(params)
	em := newEmbedder(params, ecd)
	ev := ckks.NewEvaluator(params, nil)
	rng := rand.New(rand.NewSource(1))
	vals := make([]float64, params.MaxSlots())
	for i := range vals {
		vals[i] = 2*rng.Float64() - 1
	}
	md := &rlwe.MetaData{}
	md.Scale = params.DefaultScale()
	md.LogDimensions = params.LogMaxDimensions()
	md.IsBatched, md.IsNTT = true, true
	levelP := params.MaxLevelP()
	for _, level := range []int{3, 5, 7} {
		rqp := params.RingQP().AtLevel(level, levelP)
		pt, a0, a1, s0, s1 := rqp.NewPoly(), rqp.NewPoly(), rqp.NewPoly(), rqp.NewPoly(), rqp.NewPoly()
		_ = em.embed(vals, md, pt)
		kqp, kq := newPlainQPProducts(rqp), newPlainProductKernel(rqp.RingQ)
		b.Run(fmt.Sprintf("embed_qp_l%d", level), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				_ = em.embed(vals, md, pt)
			}
		})
		b.Run(fmt.Sprintf("embed_q_l%d", level), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				_ = em.embed(vals, md, ringqp.Poly{Q: pt.Q})
			}
		})
		b.Run(fmt.Sprintf("product_qp_l%d", level), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				kqp.mulAdd(pt, a0, a1, s0, s1, i == 0)
				kqp.afterTerm(i, s0, s1)
			}
		})
		b.Run(fmt.Sprintf("product_q_l%d", level), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				kq.mulAdd(pt.Q, a0.Q, a1.Q, s0.Q, s1.Q, i == 0)
				kq.afterTerm(i, s0.Q, s1.Q)
			}
		})
		b.Run(fmt.Sprintf("moddown_l%d", level), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				ev.ModDownQPtoQNTT(level, levelP, a0.Q, a0.P, s0.Q)
			}
		})
	}
}
