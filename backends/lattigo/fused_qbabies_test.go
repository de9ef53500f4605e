package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
)

// bsgsPlan is one fused BSGS block over x: babies 1..3 (rot_hoisted), giants 0, 4 and 8,
// each giant group summing pmul(rot_b(x), p<g><b>) over b in 0..3, rescaled, rotated by
// its giant and summed. It returns the plan, its plaintext names (sorted) and its
// instruction count.
func bsgsPlan() (string, []string) {
	return bsgsPlanOf(testParams, []int{0, 4, 8}, 3, 1)
}

// bsgsPlanOf is bsgsPlan with the given params, giant offsets, babies 1..babies and copies
// products per (giant, baby) pair.
func bsgsPlanOf(params string, giants []int, babies, copies int) (string, []string) {
	var prog []string
	var pts []string
	add := func(s string, a ...any) { prog = append(prog, fmt.Sprintf(s, a...)) }
	add(`{"op": "input", "dst": "x", "tensor": "x", "table": "in/x"}`)
	var dsts, ks []string
	for b := 1; b <= babies; b++ {
		dsts, ks = append(dsts, fmt.Sprintf(`"b%d"`, b)), append(ks, fmt.Sprint(b))
	}
	add(`{"op": "rot_hoisted", "dsts": [%s], "src": "x", "ks": [%s]}`, strings.Join(dsts, ", "), strings.Join(ks, ", "))
	var block []int
	var tops []string
	for gi, g := range giants {
		sum := ""
		for bc := 0; bc < (babies+1)*copies; bc++ {
			b := bc / copies
			src := "x"
			if b > 0 {
				src = fmt.Sprintf("b%d", b)
			}
			pt := fmt.Sprintf("p%03d_%03d", gi, bc)
			pts = append(pts, pt)
			m := fmt.Sprintf("m%03d_%03d", gi, bc)
			block = append(block, len(prog))
			add(`{"op": "pmul", "dst": "%s", "src": "%s", "pt": "%s"}`, m, src, pt)
			if sum == "" {
				sum = m
				continue
			}
			block = append(block, len(prog))
			add(`{"op": "add", "dst": "%s_s", "a": "%s", "b": "%s"}`, m, sum, m)
			sum = m + "_s"
		}
		r := fmt.Sprintf("r%d", gi)
		block = append(block, len(prog))
		add(`{"op": "rescale", "dst": "%s", "src": "%s"}`, r, sum)
		if g != 0 {
			block = append(block, len(prog))
			add(`{"op": "rot", "dst": "%s_g", "src": "%s", "k": %d}`, r, r, g)
			r += "_g"
		}
		tops = append(tops, r)
	}
	acc := tops[0]
	for _, r := range tops[1:] {
		block = append(block, len(prog))
		add(`{"op": "add", "dst": "%s_y", "a": "%s", "b": "%s"}`, r, acc, r)
		acc = r + "_y"
	}
	add(`{"op": "output", "src": "%s", "tensor": "y", "table": "out/y"}`, acc)
	instrs, _ := json.Marshal(block)
	spec := map[string]any{}
	for _, p := range pts {
		spec[p] = map[string]string{"source": "w", "table": "pt/" + p}
	}
	specJSON, _ := json.Marshal(spec)
	sort.Strings(pts)
	plan := `{"schema": "slotplan.plan/1", "params": ` + params + `,
	  "fused": {"blocks": [{"instrs": ` + string(instrs) + `, "mode": "qp"}], "babies": [1]},
	  "plaintexts": ` + string(specJSON) + `,
	  "program": [` + strings.Join(prog, ",\n") + `]}`
	return plan, pts
}

// A streamed QP block with its babies in Q gives the block's values (a plain reference on
// the slots) as the QP path does, to CKKS precision, with one worker and with two (giant
// steps split over the workers, their Q sums added at the end).
func TestFusedQBabiesMatchesQP(t *testing.T) {
	const slots = 2048
	plan, pts := bsgsPlan()
	v := randVecs(5, 1+len(pts), slots)
	x, pv := v[0], v[1:]
	want := make([]float64, slots)
	for gi, g := range []int{0, 4, 8} {
		for b := 0; b < 4; b++ {
			p := pv[4*gi+b]
			for s := range want {
				want[s] += p[(s+g)%slots] * x[(s+g+b)%slots]
			}
		}
	}
	defer func(m int) { qBabiesMode = m }(qBabiesMode)
	run := func(mode, workers int) ([]float64, map[string]any) {
		qBabiesMode = mode
		out, err := BenchPlan(plan, packVecs(x), packVecs(pv...),
			fmt.Sprintf(`{"no_plaintext_cache": true, "no_prepare": true, "workers": %d}`, workers))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Outputs []outputRecord `json:"outputs"`
			Stats   map[string]any `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return decodeOut(t, r.Outputs[0].Data), r.Stats
	}
	qp, st := run(qBabiesOff, 1)
	if st["fused_blocks"].(float64) != 1 || st["fused_qbaby_blocks"].(float64) != 0 {
		t.Fatalf("QP path: stats %v", st)
	}
	// the default mode follows the annotation: QP without babies_in_q, Q babies with it
	if _, st := run(qBabiesAuto, 1); st["fused_qbaby_blocks"].(float64) != 0 {
		t.Fatalf("no babies_in_q: stats %v", st)
	}
	marked := strings.Replace(plan, `"mode": "qp"}]`, `"mode": "qp", "babies_in_q": true}]`, 1)
	if marked == plan {
		t.Fatal("the test plan's annotation changed shape")
	}
	plan, marked = marked, plan
	if _, st := run(qBabiesAuto, 1); st["fused_qbaby_blocks"].(float64) != 1 {
		t.Fatalf("babies_in_q: stats %v", st)
	}
	plan = marked
	for _, workers := range []int{1, 2} {
		q, st := run(qBabiesAlways, workers)
		if st["fused_blocks"].(float64) != 1 || st["fused_qbaby_blocks"].(float64) != 1 {
			t.Fatalf("Q babies, %d workers: fused_blocks %v, fused_qbaby_blocks %v", workers, st["fused_blocks"], st["fused_qbaby_blocks"])
		}
		maxErr, maxDiff := 0.0, 0.0
		for s := range want {
			maxErr = math.Max(maxErr, math.Abs(q[s]-want[s]))
			maxDiff = math.Max(maxDiff, math.Abs(q[s]-qp[s]))
			if math.Abs(qp[s]-want[s]) > 1e-5 {
				t.Fatalf("QP path: slot %d: %g, want %g", s, qp[s], want[s])
			}
		}
		if maxErr > 1e-5 || maxDiff > 1e-5 {
			t.Errorf("Q babies, %d workers: max error %.3g against the reference, %.3g against the QP path", workers, maxErr, maxDiff)
		}
	}
}

// TestFusedQBabiesAB (SLOTPLAN_QBABIES_AB=1; not a check): a block shaped as ResNet-20's
// s2b2_ca at n16boot (16 giant groups of 2 products per baby, 16 babies: 544 products, 6 Q
// and 5 P primes) at log N 14, streamed, one worker, timed QP path / Q babies alternately.
func TestFusedQBabiesAB(t *testing.T) {
	if os.Getenv("SLOTPLAN_QBABIES_AB") != "1" {
		t.Skip("SLOTPLAN_QBABIES_AB=1 runs it")
	}
	const logN, slots = 14, 8192
	params := `{"log_n": 14, "slots": 8192, "log_q": [60, 40, 40, 40, 40, 40], "log_p": [61, 61, 61, 61, 61], "log_scale": 40}`
	var giants []int
	for g := 0; g < 16; g++ {
		giants = append(giants, 17*g)
	}
	plan, pts := bsgsPlanOf(params, giants, 16, 2)
	v := randVecs(7, 1+len(pts), slots)
	defer func(m int) { qBabiesMode = m }(qBabiesMode)
	sums := map[int][]float64{}
	for rep := 0; rep < 3; rep++ {
		for _, mode := range []int{qBabiesOff, qBabiesAuto} {
			qBabiesMode = mode
			t0, c0 := nowSeconds(), cpuSeconds()
			out, err := BenchPlan(plan, packVecs(v[0]), packVecs(v[1:]...), `{"no_plaintext_cache": true, "no_prepare": true, "workers": 1}`)
			if err != nil {
				t.Fatal(err)
			}
			var r struct {
				Stats map[string]any `json:"stats"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			// (the streamed encoding is timed apart from the evaluation: the call's wall time
			// less key generation is the block's, with its encoding, and the encryption)
			wall := nowSeconds() - t0 - r.Stats["keygen_seconds"].(float64)
			cpu := cpuSeconds() - c0 - r.Stats["keygen_seconds"].(float64)
			ev := r.Stats["eval_seconds_runs"].([]any)[0].(float64)
			sums[mode] = append(sums[mode], cpu)
			t.Logf("mode %d: %.3f s without keygen (cpu %.3f s, eval %.3f s), fused_qbaby_blocks %v, phases %v", mode, wall, cpu, ev, r.Stats["fused_qbaby_blocks"], r.Stats["fused_phase_seconds"])
		}
	}
	t.Logf("QP path %v s, Q babies %v s (log N %d)", sums[qBabiesOff], sums[qBabiesAuto], logN)
}
