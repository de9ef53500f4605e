package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// bootStatePlan: input x at log N 12, levels spent, then the block loaded at pos ("prologue":
// right after the input; "late": after a product), one bootstrap (two with reload: the block
// dropped and loaded again between them), the block dropped, the output. y = x * h^(levels+1)
// (+ one more h with reload).
func bootStatePlan(pos string, reload bool) (string, int) {
	program, prev := levelChain(9)
	head := []string{program[0]}
	if pos == "prologue" {
		head = append(head, `{"op": "load_key", "block": "boot"}`)
		head = append(head, program[1:]...)
	} else {
		head = append(head, program[1:]...)
		head = append(head, `{"op": "load_key", "block": "boot"}`)
	}
	powers := 9
	head = append(head, fmt.Sprintf(`{"op": "bootstrap", "dst": "b1", "src": "%s"}`, prev))
	last := "b1"
	if reload {
		head = append(head, `{"op": "drop_key", "block": "boot"}`,
			`{"op": "pmul", "dst": "m10", "src": "b1", "pt": "p0"}`, `{"op": "rescale", "dst": "r10", "src": "m10"}`,
			`{"op": "load_key", "block": "boot"}`, `{"op": "bootstrap", "dst": "b2", "src": "r10"}`)
		last = "b2"
		powers++
	}
	head = append(head, `{"op": "drop_key", "block": "boot"}`,
		fmt.Sprintf(`{"op": "output", "src": "%s", "tensor": "y", "table": "out/y"}`, last))
	return `{"schema": "slotplan.plan/1", "params": ` + bootParamsAt(12) + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}}, "keys": {}, "program": [` + strings.Join(head, ",\n") + `]}`, powers
}

// runBootState runs plan with the keep_boot_state option and checks its output.
func runBootState(t *testing.T, planJSON string, powers int, keep bool, seed int64) *stats {
	t.Helper()
	slots := 1 << 11
	rng := rand.New(rand.NewSource(seed))
	x, h := make([]float64, slots), make([]float64, slots)
	for i := range x {
		x[i] = (rng.Float64()*2 - 1) / 16
		h[i] = 0.5 + 0.5*rng.Float64()
	}
	res, err := Run(planJSON, packVecs(x), packVecs(h), fmt.Sprintf(`{"keep_boot_state": %v}`, keep))
	if err != nil {
		t.Fatal(err)
	}
	var r runResult
	if err := json.Unmarshal([]byte(res), &r); err != nil {
		t.Fatal(err)
	}
	got := decodeOut(t, r.Outputs[0].Data)
	maxErr := 0.0
	for s := range got {
		want := x[s] * math.Pow(h[s], float64(powers))
		maxErr = math.Max(maxErr, math.Abs(got[s]-want))
	}
	if maxErr > 1e-6 {
		t.Fatalf("max abs error %g", maxErr)
	}
	return r.Stats
}

// TestBootStateKeptAcrossRuns: a Run asked to keep the bootstrapping state leaves its DFT
// matrices for the next Run of the same parameters, which encodes none (and lets go of them
// without the option: the next Run encodes again, TestBootStateReloadAndLateLoad).
func TestBootStateKeptAcrossRuns(t *testing.T) {
	putKeptBoot(nil)
	defer putKeptBoot(nil)
	plan, powers := bootStatePlan("prologue", false)
	st1 := runBootState(t, plan, powers, true, 1)
	st2 := runBootState(t, plan, powers, false, 2)
	t.Logf("eval %.2f / %.2f s, matrices %.2f / %.2f s, peak tracked %d / %d", st1.EvalSeconds, st2.EvalSeconds,
		st1.BootMatrixSeconds, st2.BootMatrixSeconds, st1.PeakTrackedBytes, st2.PeakTrackedBytes)
	if st1.BootMatrixBuilds != 1 || st1.BootStateReused || !st1.BootStateKept || st1.BootMatrixSeconds <= 0 {
		t.Fatalf("first run: builds %d, reused %v, kept %v, %.3f s", st1.BootMatrixBuilds, st1.BootStateReused, st1.BootStateKept, st1.BootMatrixSeconds)
	}
	if st2.BootMatrixBuilds != 0 || !st2.BootStateReused || st2.BootMatrixSeconds != 0 || st2.EvalSecondsNoMatrices != st2.EvalSeconds {
		t.Fatalf("second run: builds %d, reused %v, %.3f s", st2.BootMatrixBuilds, st2.BootStateReused, st2.BootMatrixSeconds)
	}
	// the kept matrices are counted from the second run's start to its block load: its
	// tracked peak is the first run's (the model's peak is at the block load)
	if st2.PeakTrackedBytes != st1.PeakTrackedBytes || st2.BootMatrixBytes != st1.BootMatrixBytes {
		t.Fatalf("peak tracked %d vs %d, matrices %d vs %d", st2.PeakTrackedBytes, st1.PeakTrackedBytes, st2.BootMatrixBytes, st1.BootMatrixBytes)
	}
	if math.Abs(st1.EvalSecondsNoMatrices-(st1.EvalSeconds-st1.BootMatrixSeconds)) > 1e-9 {
		t.Fatalf("eval_seconds_without_matrices %.6f", st1.EvalSecondsNoMatrices)
	}
}

// TestBootStateReloadAndLateLoad: a block dropped and loaded again inside one evaluation is
// encoded again at its reload; a plan whose block loads after other work keeps nothing. Two
// more evaluations with their key generation (13 s): skipped in -short (`make test`), whose
// TestBootStateKeptAcrossRuns keeps the state across runs; `make gocheck` runs it.
func TestBootStateReloadAndLateLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("two more log N 12 evaluations: skipped in -short mode")
	}
	putKeptBoot(nil)
	defer putKeptBoot(nil)
	reload, powers := bootStatePlan("prologue", true)
	st := runBootState(t, reload, powers, true, 4)
	if st.BootMatrixBuilds != 2 || st.BootBlockLoads != 2 || !st.BootStateKept {
		t.Fatalf("reload: builds %d over %d block loads, kept %v", st.BootMatrixBuilds, st.BootBlockLoads, st.BootStateKept)
	}
	putKeptBoot(nil)

	late, powers := bootStatePlan("late", false)
	if ok, why := mustPlan(t, late).bootKeepable(); ok || !strings.Contains(why, "after a pmul") {
		t.Fatalf("late block load keepable %v (%q)", ok, why)
	}
	st = runBootState(t, late, powers, true, 6)
	if st.BootStateKept || st.BootMatrixBuilds != 1 {
		t.Fatalf("late block load: kept %v, builds %d", st.BootStateKept, st.BootMatrixBuilds)
	}
	if takeKeptBoot() != nil {
		t.Fatalf("a late block load left its state for the next run")
	}
}

// mustPlan parses a plan as Run does.
func mustPlan(t *testing.T, planJSON string) *plan {
	t.Helper()
	p, _, _, err := loadPlan(planJSON)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBootStateAcrossEvaluateSamples: the evaluation side (Evaluate, log N 12) on two samples
// in one call: the first sample encodes the matrices, the second uses them; both right.
func TestBootStateAcrossEvaluateSamples(t *testing.T) {
	const slots, samples = 2048, 2
	plan, powers := bootStatePlan("prologue", false)
	dir := t.TempDir()
	mustKeygen(t, plan, dir, "boot1")
	rng := rand.New(rand.NewSource(9))
	xs := make([][]float64, samples)
	h := make([]float64, slots)
	for i := range h {
		h[i] = 0.5 + 0.5*rng.Float64()
	}
	for s := range xs {
		xs[s] = make([]float64, slots)
		for i := range xs[s] {
			xs[s][i] = (rng.Float64()*2 - 1) / 16
		}
	}
	ctIn, ctOut := dir+"/in.ct", dir+"/out.ct"
	if _, err := Encrypt(plan, dir+"/"+secretKeyName, packVecs(xs...), samples, ctIn, ""); err != nil {
		t.Fatal(err)
	}
	out, err := Evaluate(plan, dir+"/"+evalDirName, ctIn, samples, packVecs(h), ctOut, "")
	if err != nil {
		t.Fatal(err)
	}
	var vr evaluateResult
	if err := json.Unmarshal([]byte(out), &vr); err != nil {
		t.Fatal(err)
	}
	s0, s1 := vr.Samples[0], vr.Samples[1]
	t.Logf("sample 1: eval %.2f s (matrices %.2f s); sample 2: eval %.2f s (matrices %.2f s)", s0.EvalSeconds,
		s0.BootMatrixSeconds, s1.EvalSeconds, s1.BootMatrixSeconds)
	if s0.BootMatrixBuilds != 1 || s0.BootStateReused || s0.BootMatrixSeconds <= 0 {
		t.Fatalf("sample 1: %+v", s0)
	}
	if s1.BootMatrixBuilds != 0 || !s1.BootStateReused || s1.BootMatrixSeconds != 0 || s1.EvalSecondsNoMatrices != s1.EvalSeconds {
		t.Fatalf("sample 2: %+v", s1)
	}
	out, err = Decrypt(plan, dir+"/"+secretKeyName, ctOut, 0, samples, "")
	if err != nil {
		t.Fatal(err)
	}
	var dr decryptResult
	if err := json.Unmarshal([]byte(out), &dr); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < samples; s++ {
		got := decodeOut(t, dr.Samples[s][0].Data)
		for i := 0; i < slots; i++ {
			if d := math.Abs(got[i] - xs[s][i]*math.Pow(h[i], float64(powers))); d > 1e-6 {
				t.Fatalf("sample %d slot %d: error %g", s, i, d)
			}
		}
	}
}
