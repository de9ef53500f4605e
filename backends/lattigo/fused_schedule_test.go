package slotlattigo

import (
	"strconv"
	"testing"
)

// Fusion under a key schedule: baby rotations are computed where they stand (their keys
// may be dropped right after), a giant rotation's key must stay resident until the
// block's root, where the fused block rotates; otherwise the block runs instruction by
// instruction.
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
	const babyAt = 3
	cases := []struct {
		name, afterBaby, afterGiant string
		fused                       bool
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
		if got := len(fp.roots) == 1; got != c.fused {
			t.Fatalf("%s: fused %v, want %v (roots %v)", c.name, got, c.fused, fp.roots)
		}
		for i, s := range fp.skip {
			if s && !c.fused {
				t.Errorf("%s: instruction %d skipped though its block is not fused", c.name, i)
			}
			if fp.pre[i] != (c.fused && i == babyAt) {
				t.Errorf("%s: instruction %d computed ahead: %v", c.name, i, fp.pre[i])
			}
		}
		if c.fused && len(fp.roots[len(p.Program)-2].groups) != 2 {
			t.Errorf("%s: the block should have two giant groups (0 and 4): %v", c.name, fp.roots)
		}
	}
}

// A giant rotation the plan makes after the form's rescale, with a key generated one level
// lower, cannot run at the base's level in a fused block: the block is not fused then.
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
		if got := len(fp.roots) == 1; got != c.fused {
			t.Errorf("giant key at level %d: fused %v, want %v", c.level, got, c.fused)
		}
	}
}
