package slotlattigo

import (
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// embedder is ckks.Encoder.Embed (and Encode) for float64-precision encoders (prec <= 53)
// on a standard ring, bit for bit, without its per-coefficient allocations.
//
// Lattigo v6.1.1's SingleFloat64ToFixedPointCRT, called once per coefficient, allocates
// two slices per call (Ring.ModuliChain and Ring.BRedConstants): 2N small allocations per
// encoded polynomial. Profiled on LeNet-5 at n14boot with plaintexts encoded as they are
// read (as Run does), those allocations and the garbage collector's sweeping of them were
// 5.4 s of the encoding's 6.4 s in a 10.2 s evaluation. Here the moduli and Barrett
// constants are read once per polynomial; the arithmetic is Lattigo's (values whose
// scaled magnitude reaches 2^64 go through Lattigo's own big-integer path). Anything else
// (more precision, a conjugate-invariant ring, other value types) is left to Lattigo.
// Not safe for concurrent use (one buffer), like ckks.Encoder itself.
type embedder struct {
	params ckks.Parameters
	ecd    *ckks.Encoder
	buf    []complex128
	mags   []uint64 // rounded |coefficient| per coefficient, sign in the top bit (toFixedPointCRT)
	comb   []int64  // embedPair's rounded coefficients of two real vectors (encode_pair.go)
}

func newEmbedder(params ckks.Parameters, ecd *ckks.Encoder) *embedder {
	return &embedder{params: params, ecd: ecd, buf: make([]complex128, params.MaxSlots()), mags: make([]uint64, params.N())}
}

// encode is ecd.Encode(values, pt).
func (em *embedder) encode(values interface{}, pt *rlwe.Plaintext) error {
	if !pt.IsBatched {
		return em.ecd.Encode(values, pt)
	}
	return em.embed(values, pt.MetaData, pt.Value)
}

// embed is ecd.Embed(values, md, polyOut).
func (em *embedder) embed(values interface{}, md *rlwe.MetaData, polyOut interface{}) error {
	logSlots := md.LogDimensions.Cols
	if em.ecd.Prec() > 53 || em.params.RingType() != ring.Standard || logSlots < 0 ||
		logSlots > em.params.LogMaxDimensions().Cols {
		return em.ecd.Embed(values, md, polyOut)
	}
	slots := 1 << logSlots
	buf := em.buf[:slots]
	n := 0
	switch v := values.(type) {
	case []float64:
		if len(v) > slots {
			return em.ecd.Embed(values, md, polyOut) // Lattigo's error
		}
		for i, x := range v {
			buf[i] = complex(x, 0)
		}
		n = len(v)
	case []complex128:
		if len(v) > slots {
			return em.ecd.Embed(values, md, polyOut)
		}
		n = copy(buf, v)
	default:
		return em.ecd.Embed(values, md, polyOut)
	}
	clear(buf[n:])
	if err := em.ecd.IFFT(buf, logSlots); err != nil {
		return err
	}
	scale := md.Scale.Float64()
	switch p := polyOut.(type) {
	case ringqp.Poly:
		rq := em.params.RingQ().AtLevel(p.Q.Level())
		exact := em.magnitudes(buf, scale)
		em.toFixedPointCRT(rq, buf, scale, p.Q.Coeffs, exact)
		rlwe.NTTSparseAndMontgomery(rq, md, p.Q)
		if p.P.Level() > -1 {
			rp := em.params.RingP().AtLevel(p.P.Level())
			em.toFixedPointCRT(rp, buf, scale, p.P.Coeffs, exact)
			rlwe.NTTSparseAndMontgomery(rp, md, p.P)
		}
	case ring.Poly:
		rq := em.params.RingQ().AtLevel(p.Level())
		em.toFixedPointCRT(rq, buf, scale, p.Coeffs, em.magnitudes(buf, scale))
		rlwe.NTTSparseAndMontgomery(rq, md, p)
	default:
		return em.ecd.Embed(values, md, polyOut)
	}
	return nil
}

// signBit marks a negative coefficient in embedder.mags.
const signBit = uint64(1) << 63

// magnitudes rounds every scaled coefficient once (real parts at 0..slots-1, imaginary
// parts at slots..2 slots-1) into em.mags, the sign in the top bit, as fixedPointCRT
// rounds it; false when one reaches 2^63 (then fixedPointCRT does all of them).
func (em *embedder) magnitudes(values []complex128, scale float64) bool {
	slots := len(values)
	mags := em.mags[:2*slots]
	round := func(x float64) (uint64, bool) {
		if x == 0 {
			return 0, true
		}
		v := x * scale
		neg := v < 0
		if neg {
			v = -v
		}
		if v >= 9.223372036854775807e+18 { // 2^63
			return 0, false
		}
		c := uint64(v + 0.5)
		if neg {
			c |= signBit
		}
		return c, true
	}
	for i, v := range values {
		var ok1, ok2 bool
		if mags[i], ok1 = round(real(v)); !ok1 {
			return false
		}
		if mags[i+slots], ok2 = round(imag(v)); !ok2 {
			return false
		}
	}
	return true
}

// toFixedPointCRT is ckks.Complex128ToFixedPointCRT on a standard ring: real parts at
// 0..slots-1, imaginary parts at slots..2 slots-1, zeros after. With exact (em.mags holds
// the rounded coefficients) it writes one modulus at a time from them (the same residues
// as fixedPointCRT: one rounding per coefficient for all moduli, and writes that run along
// each modulus' row instead of across the rows; 10% of a streamed block at n14boot was
// fixedPointCRT).
func (em *embedder) toFixedPointCRT(r *ring.Ring, values []complex128, scale float64, coeffs [][]uint64, exact bool) {
	if !exact {
		toFixedPointCRT(r, values, scale, coeffs)
		return
	}
	slots := len(values)
	mags := em.mags[:2*slots]
	brc := r.BRedConstants()
	for j, qi := range r.ModuliChain()[:r.Level()+1] {
		row, b := coeffs[j][:2*slots], brc[j]
		for i, m := range mags {
			c := m &^ signBit
			switch {
			case m&signBit != 0 && c > qi:
				row[i] = qi - ring.BRedAdd(c, qi, b)
			case m&signBit != 0:
				row[i] = qi - c
			case c > 0x1fffffffffffffff:
				row[i] = ring.BRedAdd(c, qi, b)
			default:
				row[i] = c
			}
		}
		clear(coeffs[j][2*slots:])
	}
}

// toFixedPointCRT is ckks.Complex128ToFixedPointCRT on a standard ring: real parts at
// 0..slots-1, imaginary parts at slots..2 slots-1, zeros after.
func toFixedPointCRT(r *ring.Ring, values []complex128, scale float64, coeffs [][]uint64) {
	moduli := r.ModuliChain()[:r.Level()+1]
	brc := r.BRedConstants()
	slots := len(values)
	for i, v := range values {
		fixedPointCRT(r, moduli, brc, i, real(v), scale, coeffs)
	}
	for i, v := range values {
		fixedPointCRT(r, moduli, brc, i+slots, imag(v), scale, coeffs)
	}
	for j := range coeffs {
		clear(coeffs[j][2*slots:])
	}
}

// fixedPointCRT is ckks.SingleFloat64ToFixedPointCRT with the moduli and Barrett
// constants given.
func fixedPointCRT(r *ring.Ring, moduli []uint64, brc [][2]uint64, i int, value, scale float64, coeffs [][]uint64) {
	if value == 0 {
		for j := range coeffs {
			coeffs[j][i] = 0
		}
		return
	}
	neg := value < 0
	v := value * scale
	if neg {
		v = -v
	}
	if v >= 1.8446744073709552e+19 { // 2^64: Lattigo's big-integer path
		ckks.SingleFloat64ToFixedPointCRT(r, i, value, scale, coeffs)
		return
	}
	c := uint64(v + 0.5)
	if neg {
		for j, qi := range moduli {
			if c > qi {
				coeffs[j][i] = qi - ring.BRedAdd(c, qi, brc[j])
			} else {
				coeffs[j][i] = qi - c
			}
		}
		return
	}
	for j, qi := range moduli {
		if c > 0x1fffffffffffffff {
			coeffs[j][i] = ring.BRedAdd(c, qi, brc[j])
		} else {
			coeffs[j][i] = c
		}
	}
}
