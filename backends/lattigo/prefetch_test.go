package slotlattigo

import (
	"encoding/json"
	"math"
	"math/rand"
	"testing"
)

// A scheduled plan runs the same with keys read in line and prefetched in the background:
// same outputs, same loads, and the prefetched keys count as resident from their load_key
// (a key loaded early is resident together with the one in use).
func TestPrefetchMatchesInline(t *testing.T) {
	const slots = 2048
	rng := rand.New(rand.NewSource(2))
	x := make([]float64, slots)
	for i := range x {
		x[i] = rng.Float64()*2 - 1
	}
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "program": [
	    {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
	    {"op": "load_key", "k": 3},
	    {"op": "load_key", "k": 5},
	    {"op": "rot", "dst": "c1", "src": "c0", "k": 3},
	    {"op": "drop_key", "k": 3},
	    {"op": "load_key", "k": 7},
	    {"op": "rot", "dst": "c2", "src": "c1", "k": 5},
	    {"op": "drop_key", "k": 5},
	    {"op": "rot_hoisted", "dsts": ["c3"], "src": "c2", "ks": [7]},
	    {"op": "drop_key", "k": 7},
	    {"op": "output", "src": "c3", "tensor": "y", "table": "out/y"}
	  ]}`
	type res struct {
		Outputs []outputRecord `json:"outputs"`
		Stats   map[string]any `json:"stats"`
	}
	run := func(prefetch bool) res {
		opt, _ := json.Marshal(map[string]any{"prefetch": prefetch, "measure_rss": true, "gc_percent": 10})
		out, err := BenchPlan(planJSON, packVecs(x), nil, string(opt))
		if err != nil {
			t.Fatal(err)
		}
		var r res
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	gogc := currentGCPercent()
	a, b := run(false), run(true)
	// the call runs at the GOGC it was given (keymeasure passes Run's) and restores the process's
	if a.Stats["gc_percent"] != float64(10) || currentGCPercent() != gogc {
		t.Errorf("GOGC during the call %v (want 10), after it %d (want %d)", a.Stats["gc_percent"], currentGCPercent(), gogc)
	}
	if a.Stats["prefetch"] != false || b.Stats["prefetch"] != true {
		t.Fatalf("prefetch flags: %v %v", a.Stats["prefetch"], b.Stats["prefetch"])
	}
	// the store counts the bytes it reads, in line or in the background: three keys
	for _, r := range []res{a, b} {
		if got, want := r.Stats["key_load_bytes"], 3*r.Stats["galois_key_bytes"].(float64); got != want {
			t.Errorf("key_load_bytes %v, want 3 keys of %v", got, r.Stats["galois_key_bytes"])
		}
	}
	for _, f := range []string{"key_loads", "peak_key_bytes", "peak_resident_keys"} {
		if a.Stats[f] != b.Stats[f] {
			t.Errorf("%s: in line %v, prefetched %v", f, a.Stats[f], b.Stats[f])
		}
	}
	if a.Stats["key_loads"].(float64) != 3 || a.Stats["peak_resident_keys"].(float64) != 2 {
		t.Errorf("loads %v, peak resident keys %v (want 3, 2)", a.Stats["key_loads"], a.Stats["peak_resident_keys"])
	}
	ga, gb := decodeOut(t, a.Outputs[0].Data), decodeOut(t, b.Outputs[0].Data)
	for s := 0; s < slots; s++ {
		want := x[(s+15)%slots]
		if math.Abs(ga[s]-want) > 1e-5 || math.Abs(gb[s]-want) > 1e-5 {
			t.Fatalf("slot %d: in line %g, prefetched %g, want %g", s, ga[s], gb[s], want)
		}
	}
	if b.Stats["rss_measured"] == true && b.Stats["rss_peak_bytes"].(float64) < b.Stats["rss_start_bytes"].(float64) {
		t.Errorf("peak RSS below the start: %v", b.Stats)
	}
}
