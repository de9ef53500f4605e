package slotlattigo

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
)

// The executor decides no fused block: it runs the blocks of the plan's "fused" annotation
// (planner/ir/fused_plan.py decides them; tests/test_fused_plan.py checks that the planner's
// rules give the annotations used here for the same programs).

// withFused adds a "fused" annotation to a plan's JSON text.
func withFused(planJSON, fused string) string {
	return strings.Replace(planJSON, `"schema": "slotplan.plan/1",`, `"schema": "slotplan.plan/1", "fused": `+fused+`,`, 1)
}

// Under a key schedule the annotation's baby rotations are computed where they stand (their
// keys may be dropped right after); a block split by the planner (its giant key dropped
// before the root) runs its giant step's products fused and the giant rotation as written.
func TestFusionUnderKeySchedule(t *testing.T) {
	plan := func(afterGiant string) string {
		return `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}, "p1": {"source": "w", "table": "pt/p1"},
	                 "p2": {"source": "w", "table": "pt/p2"}},
	  "program": [
	    {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},
	    {"op": "load_key", "k": 1},
	    {"op": "load_key", "k": 4},
	    {"op": "rot_hoisted", "dsts": ["b1"], "src": "x", "ks": [1]},
	    {"op": "pmul", "dst": "m1", "src": "b1", "pt": "p1"},
	    {"op": "pmul", "dst": "m0", "src": "x", "pt": "p0"},
	    {"op": "add", "dst": "s0", "a": "m0", "b": "m1"},
	    {"op": "rot", "dst": "g", "src": "s0", "k": 4},
	    ` + afterGiant + `
	    {"op": "pmul", "dst": "m2", "src": "x", "pt": "p2"},
	    {"op": "add", "dst": "y", "a": "g", "b": "m2"},
	    {"op": "output", "src": "y", "tensor": "y", "table": "out/y"}
	  ]}`
	}
	cases := []struct {
		name, afterGiant, fused string
		root                    int
		groups                  int
	}{
		{"keys resident throughout", "", `{"blocks": [{"instrs": [4, 5, 6, 7, 8, 9], "mode": "qp"}], "babies": [3]}`, 9, 2},
		{"the giant key dropped before the root", `{"op": "drop_key", "k": 4},`,
			`{"blocks": [{"instrs": [4, 5, 6], "mode": "qp"}], "babies": [3]}`, 6, 1},
	}
	for _, c := range cases {
		p, _, _, err := loadPlan(withFused(plan(c.afterGiant), c.fused))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		fp := p.fusion
		f := fp.roots[c.root]
		if len(fp.roots) != 1 || f == nil {
			t.Fatalf("%s: blocks %v, want one at instruction %d", c.name, fp.roots, c.root)
		}
		if len(f.groups) != c.groups || f.terms() != c.groups+1 || f.base != "x" {
			t.Errorf("%s: groups %v (origin %s)", c.name, f.groups, f.base)
		}
		if c.groups == 1 && fp.skip[7] {
			t.Errorf("%s: the giant rotation must run as written", c.name)
		}
		for i := range fp.skip {
			if fp.pre[i] != (i == 3) {
				t.Errorf("%s: instruction %d computed ahead: %v", c.name, i, fp.pre[i])
			}
		}
	}
}

// A block's products as the executor reads them from the annotation: a key schedule's
// two-hop rotations make babies of babies (b3 = rot(b2, 1), b2 = rot(x, 2)); b2 runs as an
// instruction (another rotation reads it) and its product multiplies it as it is; b3,
// listed among the babies, is rotated lazily from b2; b1 (not listed) is multiplied as it is.
func TestFusionTwoHopBabies(t *testing.T) {
	p, _, _, err := loadPlan(`{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "fused": {"blocks": [{"instrs": [3, 4, 5, 6, 7, 8, 9], "mode": "qp"}], "babies": [2]},
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}, "p1": {"source": "w", "table": "pt/p1"},
	                 "p2": {"source": "w", "table": "pt/p2"}, "p3": {"source": "w", "table": "pt/p3"}},
	  "program": [
	    {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},
	    {"op": "rot_hoisted", "dsts": ["b1", "b2"], "src": "x", "ks": [1, 2]},
	    {"op": "rot", "dst": "b3", "src": "b2", "k": 1},
	    {"op": "pmul", "dst": "m0", "src": "x", "pt": "p0"},
	    {"op": "pmul", "dst": "m1", "src": "b1", "pt": "p1"},
	    {"op": "pmul", "dst": "m2", "src": "b2", "pt": "p2"},
	    {"op": "pmul", "dst": "m3", "src": "b3", "pt": "p3"},
	    {"op": "add", "dst": "s0", "a": "m0", "b": "m1"},
	    {"op": "add", "dst": "s1", "a": "m2", "b": "m3"},
	    {"op": "add", "dst": "y", "a": "s0", "b": "s1"},
	    {"op": "output", "src": "y", "tensor": "y", "table": "out/y"}
	  ]}`)
	if err != nil {
		t.Fatal(err)
	}
	fp := p.fusion
	f := fp.roots[9]
	if len(fp.roots) != 1 || f == nil {
		t.Fatalf("want one block at instruction 9: %v", fp.roots)
	}
	if f.base != "x" || f.terms() != 4 || f.rescaled || f.qmode {
		t.Errorf("origin %s, %d products, rescaled %v, q %v; want x, 4, false, false", f.base, f.terms(), f.rescaled, f.qmode)
	}
	got := map[string]int{}
	for _, tm := range f.groups[0] {
		got[tm.base+"/"+strconv.Itoa(tm.beta)]++
	}
	want := map[string]int{"x/0": 1, "b1/0": 1, "b2/0": 1, "b2/1": 1}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("terms %v, want %v", got, want)
			break
		}
	}
	if fp.skip[1] || !fp.skip[2] || fp.pre[2] {
		t.Errorf("the first hop runs, the second is lazy (no schedule: made at the block): skip %v pre %v", fp.skip, fp.pre)
	}
	if fp.baseRoots["x"] != 1 || fp.baseRoots["b2"] != 1 || fp.baseRoots["b1"] != 1 || len(fp.baseBetas["b2"]) != 1 {
		t.Errorf("base roots %v, betas %v", fp.baseRoots, fp.baseBetas)
	}
}

// The executor runs exactly the annotation's blocks: two Q-mode blocks over one baby
// computed where the plan rotates it (its key dropped right after), or none (the planner
// leaves a lone one-product block of a key schedule as written; a plan without the
// annotation runs unfused). Every variant gives the reference, and the executor's block
// count is the annotation's.
func TestFusionRunsTheAnnotatedBlocks(t *testing.T) {
	const slots = 2048
	v := randVecs(3, 4, slots)
	x, p0, p1, p2 := v[0], v[1], v[2], v[3]
	planJSON := planHeadXP3 + `
	    {"op": "load_key", "k": 1},
	    {"op": "rot_hoisted", "dsts": ["b1"], "src": "x", "ks": [1]},
	    {"op": "drop_key", "k": 1},
	    {"op": "pmul", "dst": "y1", "src": "b1", "pt": "p0"},
	    {"op": "pmul", "dst": "y2", "src": "b1", "pt": "p1"},
	    {"op": "pmul", "dst": "y3", "src": "x", "pt": "p2"},
	    {"op": "output", "src": "y1", "tensor": "y1", "table": "out/y1"},
	    {"op": "output", "src": "y2", "tensor": "y2", "table": "out/y2"},
	    {"op": "output", "src": "y3", "tensor": "y3", "table": "out/y3"}]}`
	ref := func(pt []float64, k int) []float64 {
		out := make([]float64, slots)
		for s := range out {
			out[s] = x[(s+k)%slots] * pt[s]
		}
		return out
	}
	want := [][]float64{ref(p0, 1), ref(p1, 1), ref(p2, 0)}
	for _, c := range []struct {
		fused  string
		blocks int
	}{
		{`{"blocks": [{"instrs": [4], "mode": "q"}, {"instrs": [5], "mode": "q"}], "babies": [2]}`, 2},
		{`{"blocks": [], "babies": []}`, 0},
		{"", 0},
	} {
		pj := planJSON
		if c.fused != "" {
			pj = withFused(planJSON, c.fused)
		}
		out, err := BenchPlan(pj, packVecs(x), packVecs(p0, p1, p2), `{"prefetch": true}`)
		if err != nil {
			t.Fatalf("%s: %v", c.fused, err)
		}
		var r struct {
			Outputs []outputRecord `json:"outputs"`
			Stats   map[string]any `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if got := int(r.Stats["fused_blocks"].(float64)); got != c.blocks {
			t.Errorf("%s: executor ran %d fused blocks, the annotation has %d", c.fused, got, c.blocks)
		}
		if got := int(r.Stats["fused_q_blocks"].(float64)); got != c.blocks {
			t.Errorf("%s: executor ran %d Q-mode blocks, want %d", c.fused, got, c.blocks)
		}
		for o, w := range want {
			got := decodeOut(t, r.Outputs[o].Data)
			for s := range w {
				if math.Abs(got[s]-w[s]) > 1e-5 {
					t.Fatalf("%s: output %d slot %d: %g, want %g", c.fused, o, s, got[s], w[s])
				}
			}
		}
	}
}

// A malformed annotation is refused before anything runs, with one line naming the field.
func TestFusionRefusesMalformedAnnotation(t *testing.T) {
	planJSON := planHeadXP3 + `
	    {"op": "rot_hoisted", "dsts": ["b1", "b2"], "src": "x", "ks": [1, 2]},
	    {"op": "pmul", "dst": "m1", "src": "b1", "pt": "p0"},
	    {"op": "pmul", "dst": "m2", "src": "b2", "pt": "p1"},
	    {"op": "add", "dst": "s", "a": "m1", "b": "m2"},
	    {"op": "rescale", "dst": "r", "src": "s"},
	    {"op": "rot", "dst": "g", "src": "r", "k": 4},
	    {"op": "pmul", "dst": "m3", "src": "x", "pt": "p2"},
	    {"op": "output", "src": "g", "tensor": "y", "table": "out/y"},
	    {"op": "output", "src": "m3", "tensor": "z", "table": "out/z"}]}`
	good := `{"blocks": [{"instrs": [2, 3, 4, 5, 6], "mode": "qp"}], "babies": [1]}`
	if _, _, _, err := loadPlan(withFused(planJSON, good)); err != nil {
		t.Fatalf("a well-formed annotation refused: %v", err)
	}
	for _, c := range []struct{ fused, field string }{
		{`[1, 2]`, `"fused"`},
		{`{"blocks": []}`, `"fused"`},
		{`{"blocks": [], "babies": [], "extra": 1}`, `"fused"`},
		{`{"blocks": [{"instrs": [2, 3, 40], "mode": "qp"}], "babies": [1]}`, `fused.blocks[0].instrs[2]`},
		{`{"blocks": [{"instrs": [2, 3, 4, 5, 6], "mode": "fast"}], "babies": [1]}`, `fused.blocks[0].mode`},
		{`{"blocks": [{"instrs": [2, 3, 4, 5, 6], "mode": "q"}], "babies": [1]}`, `fused.blocks[0].mode`},
		{`{"blocks": [{"instrs": [3, 2, 4, 5, 6], "mode": "qp"}], "babies": [1]}`, `fused.blocks[0].instrs[1]`},
		{`{"blocks": [{"instrs": [], "mode": "qp"}], "babies": [1]}`, `fused.blocks[0].instrs`},
		{`{"blocks": [{"instrs": [0, 2, 3, 4], "mode": "qp"}], "babies": []}`, `fused.blocks[0].instrs[0]`},
		{`{"blocks": [{"instrs": [2, 3, 4], "mode": "qp"}, {"instrs": [4, 5], "mode": "qp"}], "babies": [1]}`, `fused.blocks[1].instrs[0]`},
		{`{"blocks": [{"instrs": [2, 4], "mode": "qp"}], "babies": []}`, `fused.blocks[0].instrs`},
		{`{"blocks": [{"instrs": [3, 4, 5, 6], "mode": "qp"}], "babies": []}`, `fused.blocks[0].instrs[1]`},
		{`{"blocks": [{"instrs": [2, 3, 4, 5, 6], "mode": "qp"}], "babies": [7]}`, `fused.babies[0]`},
		{`{"blocks": [{"instrs": [2, 3, 4, 5, 6], "mode": "qp"}], "babies": [1, 1]}`, `fused.babies[1]`},
		{`{"blocks": [], "babies": [1]}`, `fused.babies[0]`},
		{`{"blocks": [{"instrs": [2.5], "mode": "qp"}], "babies": []}`, `"fused"`},
	} {
		_, _, _, err := loadPlan(withFused(planJSON, c.fused))
		if err == nil {
			t.Errorf("%s: accepted", c.fused)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.field) || strings.Contains(msg, "\n") {
			t.Errorf("%s: %q does not name %s on one line", c.fused, msg, c.field)
		}
	}
}
