package slotlattigo

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// A quick Go-side check of Run; the full suite is tests/test_lattigo_backend.py.

const testParams = `{"log_n": 12, "slots": 2048, "log_q": [55, 40, 40, 40, 40], "log_p": [55], "log_scale": 40}`

// planHeadXP3 opens a test plan over input x and plaintexts p0, p1, p2 (its program goes on).
const planHeadXP3 = `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}, "p1": {"source": "w", "table": "pt/p1"},
	                 "p2": {"source": "w", "table": "pt/p2"}},
	  "program": [
	    {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},`

// randVecs returns n vectors of slots values uniform in [-1, 1) from the seed.
func randVecs(seed int64, n, slots int) [][]float64 {
	rng := rand.New(rand.NewSource(seed))
	out := make([][]float64, n)
	for j := range out {
		out[j] = make([]float64, slots)
		for i := range out[j] {
			out[j][i] = rng.Float64()*2 - 1
		}
	}
	return out
}

func packVecs(vs ...[]float64) []byte {
	var out []byte
	for _, v := range vs {
		for _, x := range v {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(x))
		}
	}
	return out
}

// mustRun runs a plan through Run (the test fails on an error) and decodes its result.
func mustRun(t *testing.T, planJSON string, inputs, plaintexts []byte) runResult {
	t.Helper()
	res, err := Run(planJSON, inputs, plaintexts, "")
	if err != nil {
		t.Fatal(err)
	}
	var r runResult
	if err := json.Unmarshal([]byte(res), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func decodeOut(t *testing.T, s string) []float64 {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float64, len(raw)/8)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
	}
	return v
}

func TestRunSmall(t *testing.T) {
	const slots = 2048
	rng := rand.New(rand.NewSource(1))
	x := make([]float64, slots)
	w := make([]float64, slots)
	for i := range x {
		x[i], w[i] = rng.Float64()*2-1, rng.Float64()*2-1
	}
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}},
	  "program": [
	    {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
	    {"op": "rot", "dst": "c1", "src": "c0", "k": 5},
	    {"op": "pmul", "dst": "c2", "src": "c1", "pt": "p0"},
	    {"op": "rescale", "dst": "c3", "src": "c2"},
	    {"op": "cmul", "dst": "c4", "a": "c3", "b": "c0"},
	    {"op": "poly", "dst": "c5", "src": "c4", "coeffs": [0.5, -1.0, 0.25]},
	    {"op": "add", "dst": "c6", "a": "c5", "b": "c0"},
	    {"op": "output", "src": "c6", "tensor": "y", "table": "out/y"}
	  ]}`
	r := mustRun(t, planJSON, packVecs(x), packVecs(w))
	got := decodeOut(t, r.Outputs[0].Data)
	maxErr := 0.0
	for s := 0; s < slots; s++ {
		v := x[(s+5)%slots] * w[s] * x[s]
		want := 0.5 - v + 0.25*v*v + x[s]
		maxErr = math.Max(maxErr, math.Abs(got[s]-want))
	}
	if maxErr > 1e-5 {
		t.Fatalf("max abs error %g", maxErr)
	}
	t.Logf("max abs error %.3g, output level %d, stats %+v", maxErr, r.Outputs[0].Level, *r.Stats)
}

func TestRunErrors(t *testing.T) {
	cases := map[string]string{
		`{"schema": "slotplan.plan/1", "params": ` + testParams + `, "program": [
		   {"op": "input", "dst": "c0", "tensor": "x", "table": "t"},
		   {"op": "load_key", "k": 1},
		   {"op": "rot", "dst": "c1", "src": "c0", "k": 2}]}`: "instruction 2 (rot): no key for k=2 resident",
		`{"schema": "slotplan.plan/1", "params": ` + testParams + `, "program": [
		   {"op": "input", "dst": "c0", "tensor": "x", "table": "t"},
		   {"op": "rot", "dst": "c1", "src": "c0", "k": 2048}]}`: "instruction 1 (rot): rotation offset k=2048 outside 1..2047",
		`{"schema": "slotplan.plan/1", "params": ` + testParams + `, "program": [
		   {"op": "input", "dst": "c0", "tensor": "x", "table": "t"},
		   {"op": "add", "dst": "c0", "a": "c0", "b": "c0"}]}`: "instruction 1 (add): writes register \"c0\" a second time",
		`{"schema": "slotplan.plan/1", "params": ` + testParams: "plan is not valid JSON",
	}
	x := packVecs(make([]float64, 2048))
	for plan, want := range cases {
		_, err := Run(plan, x, nil, "")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want error containing %q, got %v", want, err)
		}
	}
	if _, err := Run("{}", nil, nil, `{"debug_panic": true}`); err == nil || !strings.Contains(err.Error(), "Go panic") {
		t.Errorf("panic not recovered: %v", err)
	}
}

// TestMaskedPoly: a poly with a mask (Lattigo's PolynomialVector) gives mask * p(x) on every
// slot, zero where the mask is 0, at the output level of the same poly without a mask (the
// mask costs no level); Chebyshev and power basis; a mask with too many values is refused.
func TestMaskedPoly(t *testing.T) {
	const slots = 2048
	vs := randVecs(7, 2, slots)
	x := vs[0]
	mask := make([]float64, slots)
	for s := range mask {
		mask[s] = []float64{0, 0.25, 3}[int((vs[1][s]+1)*1.5)%3]
	}
	cheb := []float64{0.1, 0.5, -0.3, 0.2, 0.05, -0.1, 0.02, 0.03}
	mono := []float64{0.2, -0.7, 0.1, 0.4}
	for _, tc := range []struct {
		name, basis string
		coeffs      []float64
		want        func(float64) float64
	}{
		{"chebyshev", `, "basis": "chebyshev", "domain": [-1, 1]`, cheb, func(v float64) float64 {
			tp, tc, sum := 1.0, v, cheb[0]+cheb[1]*v
			for k := 2; k < len(cheb); k++ {
				tp, tc = tc, 2*v*tc-tp
				sum += cheb[k] * tc
			}
			return sum
		}},
		{"monomial", ``, mono, func(v float64) float64 { return 0.2 - 0.7*v + 0.1*v*v + 0.4*v*v*v }},
	} {
		cs, _ := json.Marshal(tc.coeffs)
		run := func(maskField string) runResult {
			plan := planHeadXP3 + `
	    {"op": "poly", "dst": "y0", "src": "x", "coeffs": ` + string(cs) + tc.basis + maskField + `},
	    {"op": "output", "src": "y0", "tensor": "y", "table": "out/y"}]}`
			return mustRun(t, plan, packVecs(x), packVecs(mask, mask, mask))
		}
		masked, plain := run(`, "mask": "p1"`), run(``)
		got := decodeOut(t, masked.Outputs[0].Data)
		maxErr := 0.0
		for s := 0; s < slots; s++ {
			maxErr = math.Max(maxErr, math.Abs(got[s]-mask[s]*tc.want(x[s])))
		}
		if maxErr > 1e-6 {
			t.Errorf("%s: max abs error %g", tc.name, maxErr)
		}
		if masked.Outputs[0].Level != plain.Outputs[0].Level {
			t.Errorf("%s: the masked poly ends at level %d, the poly at %d", tc.name, masked.Outputs[0].Level, plain.Outputs[0].Level)
		}
		t.Logf("%s: max abs error %.3g, level %d", tc.name, maxErr, masked.Outputs[0].Level)
	}
	many := make([]float64, slots)
	for s := range many {
		many[s] = float64(s%20 + 1)
	}
	plan := planHeadXP3 + `
	    {"op": "poly", "dst": "y0", "src": "x", "coeffs": [0.5, 1.0, 0.25], "mask": "p1"},
	    {"op": "output", "src": "y0", "tensor": "y", "table": "out/y"}]}`
	if _, err := Run(plan, packVecs(x), packVecs(many, many, many), ""); err == nil || !strings.Contains(err.Error(), "distinct nonzero values") {
		t.Errorf("a mask of 20 values: want a refusal, got %v", err)
	}
	plan = planHeadXP3 + `
	    {"op": "poly", "dst": "y0", "src": "x", "coeffs": [0.5], "mask": "p1"},
	    {"op": "output", "src": "y0", "tensor": "y", "table": "out/y"}]}`
	if _, err := Run(plan, packVecs(x), packVecs(mask, mask, mask), ""); err == nil || !strings.Contains(err.Error(), "degree >= 1") {
		t.Errorf("a masked constant: want a refusal, got %v", err)
	}
	plan = planHeadXP3 + `
	    {"op": "poly", "dst": "y0", "src": "x", "coeffs": [0.5, 1.0], "mask": "p9"},
	    {"op": "output", "src": "y0", "tensor": "y", "table": "out/y"}]}`
	if _, err := Run(plan, packVecs(x), packVecs(mask, mask, mask), ""); err == nil || !strings.Contains(err.Error(), "not declared") {
		t.Errorf("an undeclared mask: want a refusal, got %v", err)
	}
}
