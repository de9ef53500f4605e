package slotlattigo

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
)

// Fusion under a key schedule: baby rotations are computed where they stand (their keys
// may be dropped right after), a giant rotation's key must stay resident until the
// block's root, where the fused block rotates; otherwise the block is fused group by group
// (each giant step's products fused, the plan's giant rotations and additions as written).
func TestFusionUnderKeySchedule(t *testing.T) {
	plan := func(afterBaby, afterGiant string) string {
		return `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}, "p1": {"source": "w", "table": "pt/p1"},
	                 "p2": {"source": "w", "table": "pt/p2"}},
	  "program": [
	    {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},
	    {"op": "load_key", "k": 1},
	    {"op": "load_key", "k": 4},
	    {"op": "rot_hoisted", "dsts": ["b1"], "src": "x", "ks": [1]},
	    ` + afterBaby + `
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
	const babyAt, groupAt, giantAt = 3, 6, 7
	cases := []struct {
		name, afterBaby, afterGiant string
		whole                       bool // fused as one block (else group by group)
	}{
		{"keys resident throughout", "", "", true},
		{"another key dropped inside", `{"op": "load_key", "k": 5}, {"op": "drop_key", "k": 5},`, "", true},
		{"the baby key dropped after its rotation", `{"op": "drop_key", "k": 1},`, "", true},
		{"the giant key dropped before the root", "", `{"op": "drop_key", "k": 4},`, false},
		{"the boot block dropped before the root", "", `{"op": "drop_key", "block": "boot"},`, false},
	}
	for _, c := range cases {
		p, err := parsePlan(plan(c.afterBaby, c.afterGiant))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		fp := analyseFusion(p, 2048)
		if len(fp.roots) != 1 {
			t.Fatalf("%s: %d fused blocks, want 1 (%v)", c.name, len(fp.roots), fp.roots)
		}
		root := len(p.Program) - 2
		if !c.whole {
			root = groupAt
			if c.afterBaby != "" {
				root += strings.Count(c.afterBaby, "op")
			}
		}
		f := fp.roots[root]
		if f == nil {
			t.Fatalf("%s: no block at instruction %d (%v)", c.name, root, fp.roots)
		}
		if c.whole && len(f.groups) != 2 {
			t.Errorf("%s: the block should have two giant groups (0 and 4): %v", c.name, f.groups)
		}
		if !c.whole && (len(f.groups) != 1 || f.groups[0] == nil || fp.skip[giantAt]) {
			t.Errorf("%s: the giant step's products fused, its rotation as written: %v, skip %v", c.name, f.groups, fp.skip)
		}
		for i := range fp.skip {
			if fp.pre[i] != (i == babyAt) {
				t.Errorf("%s: instruction %d computed ahead: %v", c.name, i, fp.pre[i])
			}
		}
	}
}

// A giant rotation the plan makes after the form's rescale, with a key generated one level
// lower, cannot run at the base's level in a fused block: the block is fused up to its
// rescale then, and the plan's giant rotation runs as written.
func TestFusionKeepsKeyLevels(t *testing.T) {
	plan := func(giantLevel int) string {
		return `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "keys": {"1": {"level": 4}, "4": {"level": ` + strconv.Itoa(giantLevel) + `}},
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}, "p1": {"source": "w", "table": "pt/p1"}},
	  "program": [
	    {"op": "input", "dst": "x", "tensor": "x", "table": "in/x"},
	    {"op": "rot_hoisted", "dsts": ["b1"], "src": "x", "ks": [1]},
	    {"op": "pmul", "dst": "m1", "src": "b1", "pt": "p1"},
	    {"op": "pmul", "dst": "m0", "src": "x", "pt": "p0"},
	    {"op": "add", "dst": "s0", "a": "m0", "b": "m1"},
	    {"op": "rescale", "dst": "s1", "src": "s0"},
	    {"op": "rot", "dst": "g", "src": "s1", "k": 4},
	    {"op": "output", "src": "g", "tensor": "y", "table": "out/y"}
	  ]}`
	}
	for _, c := range []struct {
		level int
		fused bool
	}{{4, true}, {3, false}} {
		p, err := parsePlan(plan(c.level))
		if err != nil {
			t.Fatal(err)
		}
		fp := analyseFusion(p, 2048)
		root := 6 // the giant rotation (fused whole)
		if !c.fused {
			root = 5 // the rescale (the giant step's products)
		}
		if len(fp.roots) != 1 || fp.roots[root] == nil {
			t.Errorf("giant key at level %d: blocks %v, want one at instruction %d", c.level, fp.roots, root)
		}
	}
}

// A key schedule's two-hop rotations make babies of babies: b3 = rot(b2, 1) with
// b2 = rot(x, 2). The block reads several registers of one origin: b2 runs as an
// instruction (another rotation reads it) and its product multiplies it as it is; b3 is
// rotated lazily from b2; b1, computed by the same instruction as b2, is multiplied as it is.
func TestFusionTwoHopBabies(t *testing.T) {
	p, err := parsePlan(`{"schema": "slotplan.plan/1", "params": ` + testParams + `,
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
	fp := analyseFusion(p, 2048)
	f := fp.roots[9]
	if len(fp.roots) != 1 || f == nil {
		t.Fatalf("want one block at instruction 9: %v", fp.roots)
	}
	if f.base != "x" || f.terms() != 4 {
		t.Errorf("origin %s, %d products; want x, 4", f.base, f.terms())
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
	if fp.skip[1] || !fp.skip[2] {
		t.Errorf("the first hop runs (another rotation reads it), the second is lazy: skip %v", fp.skip)
	}
	if fp.baseRoots["x"] != 1 || fp.baseRoots["b2"] != 1 || fp.baseRoots["b1"] != 1 {
		t.Errorf("base roots %v", fp.baseRoots)
	}
}

// Under a key schedule a one-product block is fused only in Q mode: blocks of one product
// that share their base's babies (here two blocks over one baby; the unrotated product is
// no block) run in Q, with the baby
// computed where the plan rotates it (its key is dropped right after); a lone one-product
// block, which in QP would pay two ModDowns for the plan's one, runs as written. Both give
// the numpy-style reference.
func TestFusionLoneBlocksUnderKeySchedule(t *testing.T) {
	const slots = 2048
	v := randVecs(3, 4, slots)
	x, p0, p1, p2 := v[0], v[1], v[2], v[3]
	head := planHeadXP3 + `
	    {"op": "load_key", "k": 1},
	    {"op": "rot_hoisted", "dsts": ["b1"], "src": "x", "ks": [1]},
	    {"op": "drop_key", "k": 1},
	    {"op": "pmul", "dst": "y1", "src": "b1", "pt": "p0"},`
	cases := []struct {
		name, tail string
		blocks     int
		want       [][]float64 // per output, per slot
	}{
		{"three blocks over one baby: Q mode", `
	    {"op": "pmul", "dst": "y2", "src": "b1", "pt": "p1"},
	    {"op": "pmul", "dst": "y3", "src": "x", "pt": "p2"},
	    {"op": "output", "src": "y1", "tensor": "y1", "table": "out/y1"},
	    {"op": "output", "src": "y2", "tensor": "y2", "table": "out/y2"},
	    {"op": "output", "src": "y3", "tensor": "y3", "table": "out/y3"}]}`, 2, nil},
		{"a lone block: as written", `
	    {"op": "output", "src": "y1", "tensor": "y1", "table": "out/y1"}]}`, 0, nil},
	}
	ref := func(pt []float64, k int) []float64 {
		out := make([]float64, slots)
		for s := range out {
			out[s] = x[(s+k)%slots] * pt[s]
		}
		return out
	}
	cases[0].want = [][]float64{ref(p0, 1), ref(p1, 1), ref(p2, 0)}
	cases[1].want = [][]float64{ref(p0, 1)}
	for _, c := range cases {
		planJSON := head + c.tail
		p, err := parsePlan(planJSON)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		fp := analyseFusion(p, slots)
		if len(fp.roots) != c.blocks {
			t.Fatalf("%s: %d fused blocks, want %d", c.name, len(fp.roots), c.blocks)
		}
		for _, f := range fp.roots {
			if !f.qmode {
				t.Errorf("%s: a one-product block fused in QP: %+v", c.name, f)
			}
		}
		if c.blocks > 0 && !fp.pre[2] {
			t.Errorf("%s: the baby is not computed where the plan rotates it", c.name)
		}
		out, err := BenchPlan(planJSON, packVecs(x), packVecs(p0, p1, p2), `{"prefetch": true}`)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var r struct {
			Outputs []outputRecord `json:"outputs"`
			Stats   map[string]any `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if got := int(r.Stats["fused_q_blocks"].(float64)); got != c.blocks {
			t.Errorf("%s: executor fused %d Q-mode blocks, want %d", c.name, got, c.blocks)
		}
		for o, want := range c.want {
			got := decodeOut(t, r.Outputs[o].Data)
			for s := range want {
				if math.Abs(got[s]-want[s]) > 1e-5 {
					t.Fatalf("%s: output %d slot %d: %g, want %g", c.name, o, s, got[s], want[s])
				}
			}
		}
	}
}
