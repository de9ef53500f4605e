package slotlattigo

import (
	"math"
	"math/rand"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// embedPair gives, for two real vectors, the encodings Lattigo gives each alone, up to one
// unit in a coefficient (its rounding of the antisymmetric coefficients; encode_pair.go),
// in Q and P at every level, and the plaintexts decode to the vectors; where it does not
// apply (sparse slots, Montgomery form, scaled values past 2^62) it says so.
func TestEmbedPairMatchesLattigo(t *testing.T) {
	params := embedTestParams(t)
	ecd := newEncoder(params)
	em := newEmbedder(params, ecd)
	rng := rand.New(rand.NewSource(7))
	slots := params.MaxSlots()
	n := params.N()
	md := &rlwe.MetaData{}
	md.Scale = params.DefaultScale()
	md.LogDimensions = params.LogMaxDimensions()
	md.IsBatched, md.IsNTT = true, true
	rqp := params.RingQP()
	for trial := 0; trial < 6; trial++ {
		v1 := make([]float64, slots-trial) // fewer values than slots: zeros after
		v2 := make([]float64, slots)
		for i := range v1 {
			v1[i] = 2*rng.Float64() - 1
			if i%5 == 0 {
				v1[i] = 0
			}
		}
		for i := range v2 {
			v2[i] = math.Ldexp(2*rng.Float64()-1, trial*3) // up to 2^15: scaled 2^55
		}
		if trial == 5 {
			v2 = v2[:0] // an all-zero vector
		}
		for level := 0; level <= params.MaxLevel(); level++ {
			levelP := params.MaxLevelP()
			if level%2 == 1 {
				levelP = -1 // Q only
			}
			mk := func() ringqp.Poly {
				p := ringqp.Poly{Q: rqp.RingQ.AtLevel(level).NewPoly()}
				if levelP >= 0 {
					p.P = rqp.RingP.NewPoly()
				}
				return p
			}
			a, b, wantA, wantB := mk(), mk(), mk(), mk()
			if !em.embedPair(v1, v2, md, a, b) {
				t.Fatalf("trial %d level %d: the pair path refused real full-slot vectors", trial, level)
			}
			if err := ecd.Embed(v1, md, wantA); err != nil {
				t.Fatal(err)
			}
			if err := ecd.Embed(v2, md, wantB); err != nil {
				t.Fatal(err)
			}
			for name, pair := range map[string][2]ringqp.Poly{"v1": {a, wantA}, "v2": {b, wantB}} {
				got, want := pair[0], pair[1]
				rings := []*ring.Ring{rqp.RingQ.AtLevel(level)}
				polys := [][2]ring.Poly{{got.Q, want.Q}}
				if levelP >= 0 {
					rings = append(rings, rqp.RingP)
					polys = append(polys, [2]ring.Poly{got.P, want.P})
				}
				// both round a float inverse FFT: beyond one unit, its error at the vectors' size
				maxAbs := 1.0
				for _, x := range append(append([]float64{}, v1...), v2...) {
					maxAbs = math.Max(maxAbs, math.Abs(x))
				}
				tol := uint64(1) + uint64(math.Ldexp(maxAbs*md.Scale.Float64(), -46))
				for ri, r := range rings {
					d := r.NewPoly()
					r.Sub(polys[ri][0], polys[ri][1], d)
					r.INTT(d, d)
					ones := 0
					for i, s := range r.SubRings[:r.Level()+1] {
						for k, c := range d.Coeffs[i][:n] {
							if c > tol && c < s.Modulus-tol {
								t.Fatalf("trial %d level %d %s ring %d prime %d coefficient %d: differs from Lattigo's by %d",
									trial, level, name, ri, i, k, c)
							}
							if c != 0 {
								ones++
							}
						}
					}
					if tol == 1 && ones > n/64 { // a unit here and there (rounding), not a pattern
						t.Fatalf("trial %d level %d %s: %d coefficients differ by one unit", trial, level, name, ones)
					}
				}
			}
			// and they decode to the vectors
			for vi, pair := range []struct {
				p ringqp.Poly
				v []float64
			}{{a, v1}, {b, v2}} {
				pt := ckks.NewPlaintext(params, level)
				pt.Scale = md.Scale
				pt.IsNTT = true
				copy(pt.Value.Coeffs, pair.p.Q.Coeffs)
				got := make([]float64, slots)
				if err := ecd.Decode(pt, got); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					want := 0.0
					if i < len(pair.v) {
						want = pair.v[i]
					}
					if math.Abs(got[i]-want) > 1e-9*math.Max(1, math.Abs(want)) {
						t.Fatalf("trial %d level %d vector %d slot %d: decoded %g, want %g", trial, level, vi+1, i, got[i], want)
					}
				}
			}
		}
	}
	// where it does not apply
	full := make([]float64, slots)
	p1, p2 := ringqp.Poly{Q: rqp.RingQ.NewPoly()}, ringqp.Poly{Q: rqp.RingQ.NewPoly()}
	sparse := *md
	sparse.LogDimensions.Cols = 5
	if em.embedPair(full, full, &sparse, p1, p2) {
		t.Fatal("the pair path took a sparse slot count")
	}
	mont := *md
	mont.IsMontgomery = true
	if em.embedPair(full, full, &mont, p1, p2) {
		t.Fatal("the pair path took a Montgomery-form plaintext")
	}
	huge := make([]float64, slots)
	for i := range huge {
		huge[i] = math.Ldexp(1, 30) // x 2^40 = 2^70: the constant coefficient
	}
	if em.embedPair(full, huge, md, p1, p2) {
		t.Fatal("the pair path took a value past 2^62 once scaled")
	}
	if em.embedPair(full, full, md, p1, ringqp.Poly{Q: rqp.RingQ.AtLevel(1).NewPoly()}) {
		t.Fatal("the pair path took outputs at two levels")
	}
}
