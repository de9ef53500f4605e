package slotlattigo

import (
	"math"
	"math/rand"
	"strings"
	"testing"
)

// Complex packing (docs/formats.md): mul_i, conj and a complex plaintext, keep-all and
// under a key schedule (the conjugation key is resident throughout).
func TestRunComplexPacking(t *testing.T) {
	const slots = 2048
	rng := rand.New(rand.NewSource(2))
	x := make([]float64, slots)
	re := make([]float64, slots)
	im := make([]float64, slots)
	for i := range x {
		x[i], re[i], im[i] = rng.Float64()*2-1, rng.Float64()*2-1, rng.Float64()*2-1
	}
	body := `"plaintexts": {"p0": {"source": "w", "table": "re", "imag_table": "im"}},
	  "program": [
	    {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
	    %LOAD%
	    {"op": "rot", "dst": "c1", "src": "c0", "k": 3},
	    {"op": "mul_i", "dst": "c2", "src": "c1"},
	    {"op": "add", "dst": "c3", "a": "c0", "b": "c2"},
	    {"op": "pmul", "dst": "c4", "src": "c3", "pt": "p0"},
	    {"op": "rescale", "dst": "c5", "src": "c4"},
	    {"op": "conj", "dst": "c6", "src": "c5"},
	    {"op": "add", "dst": "c7", "a": "c5", "b": "c6"},
	    {"op": "output", "src": "c7", "tensor": "y", "table": "out/y"}
	  ]}`
	for _, load := range []string{"", `{"op": "load_key", "k": 3},`} {
		plan := `{"schema": "slotplan.plan/1", "params": ` + testParams + `, ` + strings.ReplaceAll(body, "%LOAD%", load)
		r := mustRun(t, plan, packVecs(x), packVecs(re, im))
		got := decodeOut(t, r.Outputs[0].Data)
		maxErr := 0.0
		for s := 0; s < slots; s++ {
			z := complex(x[s], x[(s+3)%slots])
			w := complex(re[s], im[s]) * z
			want := 2 * real(w)
			maxErr = math.Max(maxErr, math.Abs(got[s]-want))
		}
		if maxErr > 1e-5 {
			t.Fatalf("schedule %q: max abs error %g", load, maxErr)
		}
		if r.Stats.RotationKeys != 2 || r.Stats.Rotations != 2 {
			t.Fatalf("want 2 keys (k=3 and the conjugation) and 2 key switches, got %d keys, %d rotations",
				r.Stats.RotationKeys, r.Stats.Rotations)
		}
	}
	// a complex plaintext's vector is 2*slots values
	plan := `{"schema": "slotplan.plan/1", "params": ` + testParams + `, ` + strings.ReplaceAll(body, "%LOAD%", "")
	if _, err := Run(plan, packVecs(x), packVecs(re), ""); err == nil {
		t.Fatal("a complex plaintext packed with slots values was accepted")
	}
}
