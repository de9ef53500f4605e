package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
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
	// (the planner's blocks for this program: planner/ir/fused_plan.py)
	planJSON := withFused(planHeadXP3, `{"blocks": [{"instrs": [2, 3, 4, 5, 6], "mode": "qp"}], "babies": [1]}`) + `
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

// Without a plaintext cache each timed run starts without a streamed boot block's request
// order, as Run does (planner.ir.analysis counts no Galois key before the first bootstrap):
// its first bootstrap takes the predicted order (bootorder.go); with the cache the order of
// the preparing run carries over. Either way the bootstrap reads ahead along the order:
// the same reads, and D + 1 keys at the peak (peak_key_bytes; sampled after each instruction,
// the carried order's D keys read ahead at the load outnumber the one key the bootstrap
// holds at its end, when the plan has no bootstrap after it).
func TestBenchStreamedBlockOrderEachRun(t *testing.T) {
	for _, logN := range bootRings(t) {
		t.Run(fmt.Sprintf("logN%d", logN), func(t *testing.T) { testBenchStreamedBlockLearns(t, logN) })
	}
}

func testBenchStreamedBlockLearns(t *testing.T, logN int) {
	slots := 1 << (logN - 1)
	x := randVecs(6, 1, slots)[0]
	params := bootParamsAt(logN)
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + params + `, "plaintexts": {}, "program": [
	    {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
	    {"op": "load_key", "block": "boot", "stream": 2},
	    {"op": "bootstrap", "dst": "b", "src": "c0"},
	    {"op": "drop_key", "block": "boot"},
	    {"op": "output", "src": "b", "tensor": "y", "table": "out/y"}]}`
	peak := map[bool]int64{}
	reads := map[bool]int{}
	for _, streamed := range []bool{true, false} {
		opt := fmt.Sprintf(`{"repeat": 1, "no_plaintext_cache": %v, "no_prepare": %v}`, streamed, streamed)
		out, err := BenchPlan(planJSON, packVecs(x), nil, opt)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Outputs []outputRecord `json:"outputs"`
			Stats   struct {
				Peak      int64 `json:"peak_key_bytes"`
				Reads     int   `json:"boot_stream_reads"`
				Predicted int   `json:"boot_stream_predicted"`
				Learned   int   `json:"boot_stream_learned"`
				Misses    int   `json:"boot_stream_misses"`
			} `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		// predicted: 2 ahead as the bootstrap begins; carried over: 2 at the load; then one
		// 2 places on per request, not past the end (the plan's only bootstrap): R either
		// way (55 at log N 14)
		reads[streamed] = r.Stats.Reads
		if st := r.Stats; st.Learned != 0 || st.Misses != 0 || (streamed && st.Predicted != 1) || (!streamed && st.Predicted != 0) {
			t.Errorf("streamed %v: %d predicted, %d learned, %d misses; want %d, 0, 0", streamed, st.Predicted, st.Learned, st.Misses, map[bool]int{true: 1}[streamed])
		}
		if logN == 14 && r.Stats.Reads != 55 {
			t.Errorf("streamed %v: %d streamed reads, want 55", streamed, r.Stats.Reads)
		}
		got := decodeOut(t, r.Outputs[0].Data)
		for s := range x {
			if math.Abs(got[s]-x[s]) > 1e-5 {
				t.Fatalf("streamed %v: slot %d: %g, want %g", streamed, s, got[s], x[s])
			}
		}
		peak[streamed] = r.Stats.Peak
	}
	if reads[true] != reads[false] || reads[true] < 5 {
		t.Errorf("streamed key reads %d predicted, %d with the order carried over: want R both", reads[true], reads[false])
	}
	if peak[false] != peak[true] {
		t.Errorf("peak key bytes %d with the order carried over, %d predicted: want equal (D + 1 keys)", peak[false], peak[true])
	}
}

// A model's cache keeps the evaluation's working state (evalScratch) for its next
// evaluation with the same key set, and makes a new one for another key set; the cached
// runs of TestBenchRunsStartAfreshWithoutCache compute on the kept state and match the
// reference.
func TestEvalScratchKeptPerKeySet(t *testing.T) {
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{
		LogN: 12, LogQ: []int{55, 40, 40}, LogP: []int{50}, LogDefaultScale: 40})
	if err != nil {
		t.Fatal(err)
	}
	c := newPtCache(0)
	k1, k2 := &keyStore{}, &keyStore{}
	s1 := c.scratchFor(params, k1)
	if s1.eval == nil || s1.ecd == nil || s1.emb == nil || s1.polyEval == nil {
		t.Fatalf("incomplete scratch %+v", s1)
	}
	if c.scratchFor(params, k1) != s1 {
		t.Error("the same key set got a new scratch")
	}
	if s2 := c.scratchFor(params, k2); s2 == s1 || s2.keys != k2 {
		t.Error("another key set reused the scratch of the first")
	}
	// an executor on the cache takes the cached state, and its workers stay for the next
	on := func(workers int) *executor {
		sc := c.scratchFor(params, k2)
		return &executor{params: params, nWorkers: workers, sc: sc, eval: sc.eval, ecd: sc.ecd}
	}
	ws := on(2).workerPool()
	if w2 := on(2).workerPool(); len(w2) != 2 || w2[0] != ws[0] {
		t.Error("the next executor made its workers anew")
	}
	if w3 := on(1).workerPool(); len(w3) != 1 {
		t.Errorf("%d workers for one", len(w3))
	}
}
