package slotlattigo

import (
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/dft"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// TestMeasureDFTRatio times a sparse variant's CoeffsToSlots and SlotsToCoeffs with the
// baby-step giant-step ratio of its DFT matrices at each of several values
// (SLOTLATTIGO_DFT_RATIO="<logN>:<k>:<r>,<r>,..."; Lattigo's default is 1): keys resident,
// one goroutine, thread CPU time; each ratio's outputs are decrypted and compared with the
// first ratio's. Heavy at log N 16: run under the heavy lock.
func TestMeasureDFTRatio(t *testing.T) {
	spec := os.Getenv("SLOTLATTIGO_DFT_RATIO")
	if spec == "" {
		t.Skip("set SLOTLATTIGO_DFT_RATIO=<logN>:<k>:<r>,<r>,... to measure")
	}
	f := strings.Split(spec, ":")
	if len(f) != 3 {
		t.Fatalf("SLOTLATTIGO_DFT_RATIO=%q: want <logN>:<k>:<r>,<r>,...", spec)
	}
	var ratios []int
	for _, x := range append(f[:2:2], strings.Split(f[2], ",")...) {
		v, err := strconv.Atoi(x)
		if err != nil {
			t.Fatalf("SLOTLATTIGO_DFT_RATIO=%q: %v", spec, err)
		}
		ratios = append(ratios, v)
	}
	logN, k, ratios := ratios[0], ratios[1], ratios[2:]
	btp, err := variantBootParameters(bootSetupAtLogN(t, logN), k)
	if err != nil {
		t.Fatal(err)
	}
	bp := btp.BootstrappingParameters
	kgen := rlwe.NewKeyGenerator(bp)
	sk := kgen.GenSecretKeyNew()
	ecd := ckks.NewEncoder(bp)
	enc := rlwe.NewEncryptor(bp, sk)
	dec := rlwe.NewDecryptor(bp, sk)
	rng := rand.New(rand.NewSource(1))
	vals := make([]complex128, 1<<k)
	for i := range vals {
		vals[i] = complex(rng.Float64()*2-1, rng.Float64()*2-1)
	}
	encrypt := func(level int) *rlwe.Ciphertext {
		pt := ckks.NewPlaintext(bp, level)
		pt.LogDimensions.Cols = k
		if err := ecd.Encode(vals, pt); err != nil {
			t.Fatal(err)
		}
		ct, err := enc.EncryptNew(pt)
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
	decode := func(ct *rlwe.Ciphertext) []complex128 {
		out := make([]complex128, 1<<ct.LogDimensions.Cols)
		if err := ecd.Decode(dec.DecryptNew(ct), out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	var ref [2][]complex128
	for _, r := range ratios {
		c2s, s2c := btp.CoeffsToSlotsParameters, btp.SlotsToCoeffsParameters
		c2s.LogBSGSRatio, s2c.LogBSGSRatio = r, r
		galEls := append(append(c2s.GaloisElements(bp), s2c.GaloisElements(bp)...), bp.GaloisElementForComplexConjugation())
		uniq := map[uint64]bool{}
		for _, g := range galEls {
			uniq[g] = true
		}
		galEls = galEls[:0]
		for g := range uniq {
			galEls = append(galEls, g)
		}
		t0 := time.Now()
		gks := kgen.GenGaloisKeysNew(galEls, sk)
		keygen := time.Since(t0).Seconds()
		eval := ckks.NewEvaluator(bp, rlwe.NewMemEvaluationKeySet(nil, gks...))
		t0 = time.Now()
		mc, err := dft.NewMatrixFromLiteral(bp, c2s, ecd)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := dft.NewMatrixFromLiteral(bp, s2c, ecd)
		if err != nil {
			t.Fatal(err)
		}
		matSec := time.Since(t0).Seconds()
		de := dft.NewEvaluator(bp, eval)
		ctC := encrypt(c2s.LevelQ)
		var re *rlwe.Ciphertext
		tc, err := measure(2, func() error {
			var err error
			re, _, err = de.CoeffsToSlotsNew(ctC, mc)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ctS := encrypt(s2c.LevelQ)
		var out *rlwe.Ciphertext
		ts, err := measure(2, func() error {
			var err error
			out, err = de.SlotsToCoeffsNew(ctS, nil, ms)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		got := [2][]complex128{decode(re), decode(out)}
		diff := 0.0
		if ref[0] == nil {
			ref = got
		} else {
			for j := range got {
				for i := range got[j] {
					diff = math.Max(diff, cmplxAbs(got[j][i]-ref[j][i]))
				}
			}
		}
		t.Logf("log N %d k %d ratio %d: %d keys (keygen %.1f s), matrices %.1f s; C2S %.3f s (level %d), S2C %.3f s (level %d); max diff to the first ratio %.3g",
			logN, k, r, len(galEls), keygen, matSec, tc.Median, c2s.LevelQ, ts.Median, s2c.LevelQ, diff)
		gks, eval, de, mc, ms = nil, nil, nil, dft.Matrix{}, dft.Matrix{}
		releaseMemory()
	}
}

func cmplxAbs(z complex128) float64 { return math.Hypot(real(z), imag(z)) }
