package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
)

// Without a plaintext cache (keymeasure --no-plaintext-cache, standing for Run) each timed
// run starts with nothing pooled: carried over, the previous run's baby rotations and
// ciphertexts stayed live into the next one (LoLa at n14: 329 MiB, peak RSS 1.25x the
// model from the second run on). With the cache, the pools carry over by design. Both give
// the reference.
func TestBenchRunsStartAfreshWithoutCache(t *testing.T) {
	const slots = 2048
	v := randVecs(5, 4, slots)
	x, p0, p1, p2 := v[0], v[1], v[2], v[3]
	planJSON := planHeadXP3 + `
	    {"op": "rot_hoisted", "dsts": ["b1", "b2", "b3"], "src": "x", "ks": [1, 2, 3]},
	    {"op": "pmul", "dst": "y1", "src": "b1", "pt": "p0"},
	    {"op": "pmul", "dst": "y2", "src": "b2", "pt": "p1"},
	    {"op": "pmul", "dst": "y3", "src": "b3", "pt": "p2"},
	    {"op": "add", "dst": "y4", "a": "y1", "b": "y2"},
	    {"op": "add", "dst": "y", "a": "y4", "b": "y3"},
	    {"op": "output", "src": "y", "tensor": "y", "table": "out/y"}]}`
	want := make([]float64, slots)
	for s := range want {
		want[s] = x[(s+1)%slots]*p0[s] + x[(s+2)%slots]*p1[s] + x[(s+3)%slots]*p2[s]
	}
	for _, streamed := range []bool{true, false} {
		opt := fmt.Sprintf(`{"repeat": 3, "no_plaintext_cache": %v, "no_prepare": %v}`, streamed, streamed)
		out, err := BenchPlan(planJSON, packVecs(x), packVecs(p0, p1, p2), opt)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Outputs []outputRecord `json:"outputs"`
			Stats   struct {
				Pooled []int64 `json:"pooled_start_bytes_runs"`
				Fused  int     `json:"fused_blocks"`
			} `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if r.Stats.Fused == 0 || len(r.Stats.Pooled) != 3 {
			t.Fatalf("streamed %v: %d fused blocks, pooled bytes per run %v", streamed, r.Stats.Fused, r.Stats.Pooled)
		}
		for i, n := range r.Stats.Pooled {
			if streamed && n != 0 {
				t.Errorf("streamed: run %d started with %d pooled bytes", i, n)
			}
			if !streamed && i > 0 && n == 0 {
				t.Errorf("cached: run %d inherited no pool (the check could not fail)", i)
			}
		}
		got := decodeOut(t, r.Outputs[0].Data)
		for s := range want {
			if math.Abs(got[s]-want[s]) > 1e-5 {
				t.Fatalf("streamed %v: slot %d: %g, want %g", streamed, s, got[s], want[s])
			}
		}
	}
}
