package slotlattigo

import (
	"math"
	"os"
	"sync"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
)

// Two real plaintexts for the price of one embedding.
//
// A real slot vector v encodes to a polynomial m with m(X^-1) = m(X) mod X^N + 1 (its
// coefficients are antisymmetric: m_(N-k) = -m_k, m_(N/2) = 0), because the slots are the
// values of m at the 2N-th roots of unity and conjugating a real value changes nothing.
// Multiplying the slots by i multiplies the polynomial by X^(N/2) (every root in the
// 5^j orbit raised to N/2 is i). So the complex vector v1 + i v2 encodes to
// c = m1 + X^(N/2) m2, and one inverse FFT, one fixed-point conversion and one NTT per
// prime give NTT(c). At the NTT point psi^e and its inverse psi^-e (both evaluated by the
// NTT, at two output indices j and j'):
//
//	NTT(c)_j  = m1(psi^e) + t_j m2(psi^e),   NTT(c)_j' = m1(psi^e) - t_j m2(psi^e),
//
// with t_j = psi^(e N/2) = +-I (I^2 = -1), since m1 and m2 take the same value at psi^e and
// psi^-e. Hence NTT(m1)_j = NTT(m1)_j' = (X + Y)/2 and NTT(m2)_j = NTT(m2)_j' = (X - Y)/(2 t_j):
// two modular multiplications per pair of points instead of a second NTT (8 N modular
// multiplications at log N 16) and a second inverse FFT and fixed-point pass.
//
// This needs the integer coefficients of m1 and m2 exactly antisymmetric: the rounded
// coefficients are formed from the antisymmetric and symmetric parts of c, each rounded
// once (round half away from zero, which is odd), so they are. Lattigo's Encode of v1 alone
// rounds each coefficient of its own inverse FFT, which can differ from these by one unit
// in a coefficient (a 2^-log_scale change of a slot, far below CKKS noise); the tests bound
// the difference.
//
// Measured at log N 16, one diagonal at level 6 in QP (12 primes) on this repository's
// 2-core Zen 3 (docs/lattigo.md "Two real plaintexts per embedding").

// pairEncodeOff: SLOTPLAN_PAIR_ENCODE=off encodes streamed plaintexts one at a time (the
// executor before pairing; for A/B timings).
func pairEncodeOff() bool {
	return os.Getenv("SLOTPLAN_PAIR_ENCODE") == "off"
}

// pairPoints: for one ring degree, the NTT output indices paired with their inverse point.
type pairPoints struct {
	js, jps []int32 // pairs (js[k], jps[k]), js[k] < jps[k], N/2 of them
	plus    []bool  // t_(js[k]) = +I (the I of each prime is its t at index 0)
}

// pairPrime: one prime's constants (Montgomery multiplications by them give the results in
// standard form: MRed(x, c R) = x c).
type pairPrime struct {
	half  uint64 // 2^-1 R mod q
	gPlus uint64 // (2 I)^-1 R mod q; (2 (-I))^-1 R is q - gPlus
	ok    bool
}

var (
	pairMu     sync.Mutex
	pairTables = map[int]*pairPoints{}  // by N
	pairPrimes = map[uint64]pairPrime{} // by modulus (N fixed per modulus: 2N | q - 1 tables)
)

// pairPointsFor returns the pairing of NTT outputs for the subring s (of degree N), built
// from s's own NTT of X (the points) and of X^(N/2) (their t), and the constants of s's
// prime; ok false when the NTT does not pair as expected (then the caller encodes singly).
func pairPointsFor(s *ring.SubRing) (*pairPoints, pairPrime) {
	pairMu.Lock()
	defer pairMu.Unlock()
	n := s.N
	q := s.Modulus
	pts := pairTables[n]
	pp, havePrime := pairPrimes[q]
	if pts != nil && havePrime {
		return pts, pp
	}
	x := make([]uint64, n)
	x[1] = 1
	s.NTT(x, x)
	t := make([]uint64, n)
	t[n/2] = 1
	s.NTT(t, t)
	iq := t[0]
	if pts == nil {
		index := make(map[uint64]int32, n)
		for j, v := range x {
			index[v] = int32(j)
		}
		pts = &pairPoints{js: make([]int32, 0, n/2), jps: make([]int32, 0, n/2), plus: make([]bool, 0, n/2)}
		for j := range x {
			inv := ring.ModExp(x[j], q-2, q)
			jp, found := index[inv]
			if !found || int(jp) == j {
				pairPrimes[q] = pairPrime{}
				return nil, pairPrime{}
			}
			if int(jp) > j {
				pts.js = append(pts.js, int32(j))
				pts.jps = append(pts.jps, jp)
				pts.plus = append(pts.plus, t[j] == iq)
			}
		}
		if len(pts.js) != n/2 {
			pairPrimes[q] = pairPrime{}
			return nil, pairPrime{}
		}
		pairTables[n] = pts
	}
	// this prime's points must pair the same way (the same ordering of exponents) and its
	// t must be +-I as the table says
	bred := ring.GenBRedConstant(q)
	for k, j := range pts.js {
		jp := pts.jps[k]
		if ring.BRed(x[j], x[jp], q, bred) != 1 || (t[j] == iq) != pts.plus[k] || (t[j] != iq && t[j] != q-iq) {
			pairPrimes[q] = pairPrime{}
			return pts, pairPrime{}
		}
	}
	if ring.BRed(iq, iq, q, bred) != q-1 {
		pairPrimes[q] = pairPrime{}
		return pts, pairPrime{}
	}
	inv2 := (q + 1) / 2
	g := ring.ModExp(ring.BRed(2, iq, q, bred), q-2, q)
	pp = pairPrime{half: ring.MForm(inv2, q, bred), gPlus: ring.MForm(g, q, bred), ok: true}
	pairPrimes[q] = pp
	return pts, pp
}

// embedPair is embed(v1, md, out1) and embed(v2, md, out2) for two real vectors at the
// full slot count, in NTT form (not Montgomery), with one inverse FFT and one NTT per
// prime (the file's comment). out1 and out2 have the same levels. False (nothing written
// that matters) when this path does not apply: the caller then embeds them one by one.
func (em *embedder) embedPair(v1, v2 []float64, md *rlwe.MetaData, out1, out2 ringqp.Poly) bool {
	logSlots := md.LogDimensions.Cols
	if em.ecd.Prec() > 53 || em.params.RingType() != ring.Standard || logSlots != em.params.LogMaxSlots() ||
		!md.IsNTT || md.IsMontgomery || !md.IsBatched {
		return false
	}
	slots := 1 << logSlots
	if len(v1) > slots || len(v2) > slots || out1.Q.Level() != out2.Q.Level() || out1.P.Level() != out2.P.Level() {
		return false
	}
	n := em.params.N()
	buf := em.buf[:slots]
	for i := range buf {
		var a, b float64
		if i < len(v1) {
			a = v1[i]
		}
		if i < len(v2) {
			b = v2[i]
		}
		buf[i] = complex(a, b)
	}
	if err := em.ecd.IFFT(buf, logSlots); err != nil {
		return false
	}
	if cap(em.comb) < n {
		em.comb = make([]int64, n)
	}
	comb := em.comb[:n]
	if !combinePair(buf, md.Scale.Float64(), comb) {
		return false
	}
	rq := em.params.RingQ().AtLevel(out1.Q.Level())
	if !em.pairNTT(rq, comb, out1.Q, out2.Q) {
		return false
	}
	if out1.P.Level() > -1 {
		rp := em.params.RingP().AtLevel(out1.P.Level())
		if !em.pairNTT(rp, comb, out1.P, out2.P) {
			return false
		}
	}
	return true
}

// combinePair writes the rounded coefficients of c = m1 + X^(N/2) m2 (scaled) from the
// inverse FFT of v1 + i v2: c_k is real(buf[k]) for k < N/2, imag(buf[k - N/2]) above; the
// antisymmetric part (m1) and the symmetric part (X^(N/2) m2) are rounded separately.
// False when a scaled part reaches 2^62 (Lattigo's big-integer path is then needed).
func combinePair(buf []complex128, scale float64, comb []int64) bool {
	n := len(comb)
	h := n / 2
	const limit = 4.611686018427388e+18 // 2^62
	at := func(k int) float64 {
		if k < h {
			return real(buf[k])
		}
		return imag(buf[k-h])
	}
	c0 := math.Round(at(0) * scale)
	ch := math.Round(at(h) * scale)
	if math.Abs(c0) >= limit || math.Abs(ch) >= limit {
		return false
	}
	comb[0], comb[h] = int64(c0), int64(ch)
	for k := 1; k < h; k++ {
		a, b := at(k), at(n-k)
		u := math.Round((a - b) * 0.5 * scale)
		w := math.Round((a + b) * 0.5 * scale)
		if math.Abs(u) >= limit || math.Abs(w) >= limit {
			return false
		}
		comb[k] = int64(u) + int64(w)
		comb[n-k] = int64(w) - int64(u)
	}
	return true
}

// pairNTT reduces comb modulo each prime of r into out1, NTTs it, and splits it into
// NTT(m1) (out1, in place) and NTT(m2) (out2).
func (em *embedder) pairNTT(r *ring.Ring, comb []int64, out1, out2 ring.Poly) bool {
	for i, s := range r.SubRings[:r.Level()+1] {
		pts, pp := pairPointsFor(s)
		if pts == nil || !pp.ok {
			return false
		}
		q := s.Modulus
		bred := s.BRedConstant
		row := out1.Coeffs[i][:len(comb)]
		for k, c := range comb {
			if c >= 0 {
				row[k] = ring.BRedAdd(uint64(c), q, bred)
			} else if m := ring.BRedAdd(uint64(-c), q, bred); m != 0 {
				row[k] = q - m
			} else {
				row[k] = 0
			}
		}
		s.NTT(row, row)
		row2 := out2.Coeffs[i][:len(comb)]
		mred := s.MRedConstant
		gPlus, gMinus := pp.gPlus, q-pp.gPlus
		js, jps, plus := pts.js, pts.jps[:len(pts.js)], pts.plus[:len(pts.js)]
		for k, j := range js {
			jp := jps[k]
			x, y := row[j], row[jp]
			a := ring.MRed(x+y, pp.half, q, mred)
			g := gMinus
			if plus[k] {
				g = gPlus
			}
			b := ring.MRed(x+q-y, g, q, mred)
			row[j], row[jp] = a, a
			row2[j], row2[jp] = b, b
		}
	}
	return true
}
