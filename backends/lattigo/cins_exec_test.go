package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math/cmplx"
	"math/rand"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// A CinS convolution as the planner lowers it (planner/kernels/cins.py: hoisted baby
// rotations by b*l, products by cins plaintexts, sums, a rescale, a giant rotation, a sum)
// ending in a fused bootstrap_cins: the matrices the executor reads off the plan must give
// what the plan's instructions compute followed by S_(N/2<-l), on random slot vectors, in
// the clear (the encrypted run is tests/test_cins_run.py).
func TestCinsFusedFormsMatchThePlan(t *testing.T) {
	const logN, l, B = 10, 8, 2
	slots := 1 << (logN - 1)
	rng := rand.New(rand.NewSource(7))
	// two input registers (two ciphertexts: two bases), diagonals d = G*B + b
	type term struct{ in, d int }
	terms := []term{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 3}, {1, 5}}
	prog := []map[string]any{
		{"op": "input", "dst": "x0", "tensor": "x", "table": "t0"},
		{"op": "input", "dst": "x1", "tensor": "x", "table": "t1"},
		{"op": "rot_hoisted", "src": "x0", "ks": []int{l}, "dsts": []string{"x0b1"}},
		{"op": "rot_hoisted", "src": "x1", "ks": []int{l}, "dsts": []string{"x1b1"}},
	}
	pts := map[string]any{}
	ptValues := map[string][]float64{}
	byGiant := map[int][]string{}
	for n, tm := range terms {
		G := tm.d - tm.d%B
		src := fmt.Sprintf("x%d", tm.in)
		if tm.d%B == 1 {
			src += "b1"
		}
		pt := fmt.Sprintf("pt%d", n)
		pts[pt] = map[string]any{"source": "w", "table": pt, "l": l}
		v := make([]float64, 2*slots)
		for i := range v {
			v[i] = rng.Float64()*2 - 1
		}
		ptValues[pt] = v
		dst := fmt.Sprintf("p%d", n)
		prog = append(prog, map[string]any{"op": "pmul", "dst": dst, "src": src, "pt": pt})
		byGiant[G] = append(byGiant[G], dst)
	}
	var total string
	for _, G := range []int{0, 2, 4} {
		acc := byGiant[G][0]
		for j, r := range byGiant[G][1:] {
			nx := fmt.Sprintf("a%d_%d", G, j)
			prog = append(prog, map[string]any{"op": "add", "dst": nx, "a": acc, "b": r})
			acc = nx
		}
		rs := fmt.Sprintf("r%d", G)
		prog = append(prog, map[string]any{"op": "rescale", "dst": rs, "src": acc})
		if G != 0 {
			g := fmt.Sprintf("g%d", G)
			prog = append(prog, map[string]any{"op": "rot", "dst": g, "src": rs, "k": G * l})
			rs = g
		}
		if total == "" {
			total = rs
		} else {
			nx := "s" + rs
			prog = append(prog, map[string]any{"op": "add", "dst": nx, "a": total, "b": rs})
			total = nx
		}
	}
	prog = append(prog, map[string]any{"op": "bootstrap_cins", "dsts": []string{"re", "im"}, "src": total, "l": l, "fused": true})
	raw, err := json.Marshal(map[string]any{
		"schema": planSchema, "params": map[string]any{"log_n": logN, "log_q": []int{50, 40}, "log_p": []int{50}, "log_scale": 40},
		"plaintexts": pts, "program": prog,
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePlan(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	params, err := p.Params.ckksParameters()
	if err != nil {
		t.Fatal(err)
	}
	if err = p.validate(slots); err != nil {
		t.Fatal(err)
	}
	cp := analyseCins(p, slots)
	at := len(prog) - 1
	f := cp.fused[at]
	if cp.err != nil || f == nil {
		t.Fatalf("no fused convolution at %d: %v", at, cp.err)
	}
	if got := fmt.Sprint(f.bases); got != "[x0 x1]" {
		t.Fatalf("bases %s", got)
	}
	for j := 2; j < at; j++ { // every instruction between the inputs and the bootstrap is absorbed
		if !cp.skip[j] {
			t.Fatalf("instruction %d (%v) not absorbed", j, prog[j]["op"])
		}
	}
	e := &executor{params: params, plan: p, ptValues: ptValues}
	forms, err := e.fusedForms(f)
	if err != nil {
		t.Fatal(err)
	}
	// the plan's instructions in the clear on random complex slots
	x := map[string][]complex128{}
	for _, b := range []string{"x0", "x1"} {
		v := make([]complex128, slots)
		for i := range v {
			v[i] = complex(rng.NormFloat64(), rng.NormFloat64())
		}
		x[b] = v
	}
	rot := func(v []complex128, k int) []complex128 {
		out := make([]complex128, len(v))
		for i := range out {
			out[i] = v[(i+k)&(slots-1)]
		}
		return out
	}
	for _, in := range p.Program[2:at] {
		switch in.Op {
		case "rot_hoisted":
			x[in.Dsts[0]] = rot(x[in.Src], in.Ks[0])
		case "rot":
			x[in.Dst] = rot(x[in.Src], *in.K)
		case "rescale":
			x[in.Dst] = x[in.Src]
		case "pmul":
			pv := cinsSlots(ptValues[in.Pt], l)
			out := make([]complex128, slots)
			for i := range out {
				out[i] = x[in.Src][i] * pv[i]
			}
			x[in.Dst] = out
		case "add":
			out := make([]complex128, slots)
			for i := range out {
				out[i] = x[in.A][i] + x[in.B][i]
			}
			x[in.Dst] = out
		}
	}
	s2 := s2Full(logN, slots, l)
	want := s2.apply(x[total])
	got := make([]complex128, slots)
	for _, b := range f.bases {
		m := compose(s2, forms[b], slots)
		for k := range m { // the structural offsets cover the product's diagonals
			found := false
			for _, o := range f.offs[b] {
				found = found || o == k
			}
			if !found {
				t.Fatalf("base %s: diagonal %d not among the structural offsets", b, k)
			}
		}
		for i, v := range m.apply(x[b]) {
			got[i] += v
		}
	}
	worst := 0.0
	for i := range got {
		worst = max(worst, cmplx.Abs(got[i]-want[i]))
	}
	if worst > 1e-9 {
		t.Fatalf("fused S_(N/2<-l) K differs from the plan's convolution then S_(N/2<-l): %.3g", worst)
	}
	// its keys are in the plan's key set, and so are to_cins's
	keys := map[int]bool{}
	for _, k := range p.rotationOffsets() {
		keys[k] = true
	}
	for _, b := range f.bases {
		for _, k := range bsgsOffsets(f.offs[b], slots) {
			if !keys[k] {
				t.Fatalf("fused rotation %d has no key", k)
			}
		}
	}
}

// The S_(l<-1) factors of to_cins map the Re/Im pair of a cins(l) value to its CinS slots
// (docs/cins.md), for every split the planner may ask for.
func TestToCinsFactorsGiveCinsSlots(t *testing.T) {
	const logN = 10
	slots := 1 << (logN - 1)
	rng := rand.New(rand.NewSource(3))
	for _, l := range []int{2, 8, 64} {
		for levels := 1; levels <= 3; levels++ {
			m := make([]float64, 2*slots)
			for i := range m {
				m[i] = rng.Float64()*2 - 1
			}
			re, im := pairPositions(l, slots)
			z := make([]complex128, slots)
			for s := range z {
				z[s] = complex(m[re[s]], m[im[s]])
			}
			for _, f := range toCinsFactors(logN, slots, l, levels) {
				z = f.apply(z)
			}
			want := cinsSlots(m, l)
			for s := range z {
				if cmplx.Abs(z[s]-want[s]) > 1e-9 {
					t.Fatalf("l=%d levels=%d slot %d: %v want %v", l, levels, s, z[s], want[s])
				}
			}
		}
	}
}

// Encrypted at log N 12 (no bootstrapping preset needed): to_cins of a random Re/Im pair,
// a planner-style convolution run instruction by instruction, and the same convolution
// fused with S_(N/2<-l) (what bootstrap_cins bootstraps), against the clear values.
func TestCinsExecutorEncrypted(t *testing.T) {
	const logN, l, B = 12, 8, 2
	slots := 1 << (logN - 1)
	rng := rand.New(rand.NewSource(11))
	prog := []map[string]any{
		{"op": "input", "dst": "re", "tensor": "x", "table": "t0"},
		{"op": "input", "dst": "im", "tensor": "x", "table": "t1"},
		{"op": "to_cins", "dst": "c", "re": "re", "im": "im", "l": l, "levels": 2},
		{"op": "rot_hoisted", "src": "c", "ks": []int{l}, "dsts": []string{"cb1"}},
	}
	pts := map[string]any{}
	ptValues := map[string][]float64{}
	byGiant := map[int][]string{}
	for n, d := range []int{0, 1, 2, 3, 5} {
		src := "c"
		if d%B == 1 {
			src = "cb1"
		}
		pt := fmt.Sprintf("pt%d", n)
		pts[pt] = map[string]any{"source": "w", "table": pt, "l": l}
		v := make([]float64, 2*slots)
		for i := range v {
			v[i] = (rng.Float64()*2 - 1) / 8
		}
		ptValues[pt] = v
		dst := fmt.Sprintf("p%d", n)
		prog = append(prog, map[string]any{"op": "pmul", "dst": dst, "src": src, "pt": pt})
		byGiant[d-d%B] = append(byGiant[d-d%B], dst)
	}
	total := ""
	for _, G := range []int{0, 2, 4} {
		acc := byGiant[G][0]
		for j, r := range byGiant[G][1:] {
			nx := fmt.Sprintf("a%d_%d", G, j)
			prog = append(prog, map[string]any{"op": "add", "dst": nx, "a": acc, "b": r})
			acc = nx
		}
		rs := fmt.Sprintf("r%d", G)
		prog = append(prog, map[string]any{"op": "rescale", "dst": rs, "src": acc})
		if G != 0 {
			prog = append(prog, map[string]any{"op": "rot", "dst": "g" + rs, "src": rs, "k": G * l})
			rs = "g" + rs
		}
		if total == "" {
			total = rs
		} else {
			prog = append(prog, map[string]any{"op": "add", "dst": "s" + rs, "a": total, "b": rs})
			total = "s" + rs
		}
	}
	at := len(prog)
	prog = append(prog, map[string]any{"op": "bootstrap_cins", "dsts": []string{"yr", "yi"}, "src": total, "l": l, "fused": true})
	raw, err := json.Marshal(map[string]any{
		"schema": planSchema, "params": json.RawMessage(testParams), "plaintexts": pts, "program": prog,
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePlan(string(raw)) // (loadPlan refuses a bootstrap without a "boot" object)
	if err != nil {
		t.Fatal(err)
	}
	setup, err := p.Params.setup()
	if err != nil {
		t.Fatal(err)
	}
	if err = p.validate(slots); err != nil {
		t.Fatal(err)
	}
	c := newSetupClient(setup)
	dir := t.TempDir()
	if _, _, _, err = c.writeKeySet(dir, p.rotationOffsets(), false, setup.top, nil, false); err != nil {
		t.Fatal(err)
	}
	keys, err := openKeyStore(dir, setup.params)
	if err != nil {
		t.Fatal(err)
	}
	m := make([]float64, 2*slots) // the cins value, and its Re/Im pair
	for i := range m {
		m[i] = rng.Float64()*2 - 1
	}
	rePos, imPos := pairPositions(l, slots)
	re, im := make([]float64, slots), make([]float64, slots)
	for s := range re {
		re[s], im[s] = m[rePos[s]], m[imPos[s]]
	}
	cre, err := c.encrypt(re)
	if err != nil {
		t.Fatal(err)
	}
	cim, err := c.encrypt(im)
	if err != nil {
		t.Fatal(err)
	}
	decode := func(ct *rlwe.Ciphertext) []complex128 {
		v := make([]complex128, slots)
		if err := c.ecd.Decode(c.dec.DecryptNew(ct), v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	worst := func(got, want []complex128) float64 {
		w := 0.0
		for i := range got {
			w = max(w, cmplx.Abs(got[i]-want[i]))
		}
		return w
	}
	st := &stats{OpCounts: map[string]int{}, OpSeconds: map[string]float64{}}
	ex := newExecutor(setup, keys, p, ptValues, &ctIO{inputs: []*rlwe.Ciphertext{cre, cim}}, st)
	if err = keys.loadAll(); err != nil {
		t.Fatal(err)
	}
	// the fused path: the conv's instructions are skipped, fusedConv evaluates S_(N/2<-l) K
	for i := 0; i < at; i++ {
		if _, err = ex.exec(i, p.Program[i]); err != nil {
			t.Fatalf("instruction %d: %v", i, err)
		}
	}
	cinsX := cinsSlots(m, l)
	if e := worst(decode(ex.regs["c"]), cinsX); e > 1e-6 {
		t.Fatalf("to_cins: max error %.3g", e)
	}
	if ex.regs[total] != nil {
		t.Fatalf("the fused convolution's instructions ran")
	}
	y, err := ex.fusedConv(ex.cins.fused[at])
	if err != nil {
		t.Fatal(err)
	}
	// the clear reference: the plan's conv on the CinS slots, then S_(N/2<-l)
	e := &executor{params: setup.params, plan: p, ptValues: ptValues}
	forms, err := e.fusedForms(ex.cins.fused[at])
	if err != nil {
		t.Fatal(err)
	}
	want := s2Full(logN, slots, l).apply(forms["c"].apply(cinsX))
	if e := worst(decode(y), want); e > 1e-5 {
		t.Fatalf("fused S_(N/2<-l) K: max error %.3g", e)
	}
	if y.Level() != ex.regs["c"].Level()-1 {
		t.Fatalf("fused convolution used %d levels", ex.regs["c"].Level()-y.Level())
	}
	if want := 2; setup.top-ex.regs["c"].Level() != want {
		t.Fatalf("to_cins used %d levels, want %d", setup.top-ex.regs["c"].Level(), want)
	}
}

// The planner's key and rotation model of the CinS matrices (planner.ir.instructions:
// to_cins_keys, to_cins_rotations, stoc_keys; values printed by those functions) is what
// the executor's matrices rotate by here.
func TestCinsKeysMatchThePlanner(t *testing.T) {
	for _, c := range []struct {
		logN, l, levels, rots int
		keys                  string
	}{
		{10, 8, 2, 7, "[1 2 4 12 496 508 510]"},
		{14, 32, 2, 10, "[1 2 3 4 8 16 8160 8176 8184 8188]"},
		{14, 64, 3, 12, "[1 2 4 8 16 32 8128 8160 8176 8184 8188 8190]"},
		{14, 1024, 2, 28, "[1 2 3 4 5 6 7 8 16 24 32 64 96 128 160 192 224 256 512 768 7168 7424 7680 7936 8160 8168 8176 8184]"},
	} {
		slots := 1 << (c.logN - 1)
		set, rots := map[int]bool{}, 0
		for _, m := range toCinsFactors(c.logN, slots, c.l, c.levels) {
			rots += bsgsCount(m.offsets(), slots)
			for _, k := range bsgsOffsets(m.offsets(), slots) {
				set[k] = true
			}
		}
		if got := fmt.Sprint(sortedKeys(set)); got != c.keys || rots != c.rots {
			t.Errorf("to_cins l=%d levels=%d: keys %s rotations %d, planner %s %d", c.l, c.levels, got, rots, c.keys, c.rots)
		}
	}
	for _, c := range []struct {
		logN, l int
		keys    string
	}{
		{10, 8, "[8 16 24 32 40 48 56 64 128 192 256 320 384 448]"},
		{14, 32, "[32 64 96 128 160 192 224 256 288 320 352 384 416 448 480 512 1024 1536 2048 2560 3072 3584 4096 4608 5120 5632 6144 6656 7168 7680]"},
		{14, 256, "[256 512 768 1024 2048 3072 4096 5120 6144 7168]"},
	} {
		slots := 1 << (c.logN - 1)
		if got := fmt.Sprint(bsgsOffsets(s2Full(c.logN, slots, c.l).offsets(), slots)); got != c.keys {
			t.Errorf("S_(N/2<-l) l=%d: keys %s, planner %s", c.l, got, c.keys)
		}
	}
}
