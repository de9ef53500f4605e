package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// variantPlan is a bootstrapping plan at log N 14 with one instruction ins after the input.
func variantPlan(params string, ins string) string {
	return fmt.Sprintf(`{"schema": "slotplan.plan/1", "params": %s, "plaintexts": {}, "program": [
	  {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
	  {"op": "input", "dst": "c1", "tensor": "y", "table": "in/y"},
	  %s,
	  {"op": "output", "src": "d0", "tensor": "z", "table": "out/z"}]}`, params, ins)
}

func withVariants(ks ...int) string {
	var vs []string
	for _, k := range ks {
		vs = append(vs, fmt.Sprintf(`{"log_slots": %d, "key_offsets": null, "matrix_bytes": 1}`, k))
	}
	return strings.Replace(testBootParams, `"levels_after": 9`, `"levels_after": 9, "variants": [`+strings.Join(vs, ", ")+`]`, 1)
}

// Bad variant fields are refused before any key is generated, naming instruction and field.
func TestBootVariantValidation(t *testing.T) {
	params := withVariants(9, 10)
	cases := map[string]string{
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 8}`:                                    `instruction 2 (bootstrap): field "log_slots": the params' boot object offers no sparse bootstrap at 2^8 slots (boot.variants: [9 10])`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 13}`:                                   `field "log_slots": an integer k >= 1 with 2^k < the 8192 slots`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 0, "halves": true}`:                    `and 2^(k+1) <= the slots (halves), got 0`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "halves": true}`:                                    `field "halves" belongs to a sparse bootstrap (give log_slots)`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "scale": 2.5}`:                                      `field "scale": a full-slot bootstrap's scale is an integer with 1 <= scale <= 2^20, got 2.5`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "in_scale": 8192}`:                                  `field "in_scale": a number with 1 <= in_scale <= 2^12, got 8192`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9, "in_scale": 0.5}`:                   `field "in_scale": a number with 1 <= in_scale <= 2^12, got 0.5`,
		`{"op": "bootstrap2", "dsts": ["d0", "d1"], "srcs": ["c0", "c1"], "log_slots": 9, "in_scale": 2}`:  `field "in_scale" belongs to bootstrap`,
		`{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9, "scale": 0}`:                        `field "scale": a finite nonzero number`,
		`{"op": "bootstrap2", "dsts": ["d0", "d1"], "srcs": ["c0", "c0"], "log_slots": 9}`:                 `field "srcs": bootstrap2 reads two different registers`,
		`{"op": "bootstrap2", "dsts": ["d0"], "srcs": ["c0", "c1"], "log_slots": 9}`:                       `field "dsts": bootstrap2 names two registers`,
		`{"op": "bootstrap2", "dsts": ["d0", "d1"], "srcs": ["c0", "c1"]}`:                                 `field "log_slots" is required`,
		`{"op": "bootstrap2", "dsts": ["d0", "d1"], "srcs": ["c0", "c1"], "log_slots": 11}`:                `offers no sparse bootstrap at 2^11 slots`,
		`{"op": "bootstrap2", "dsts": ["d0", "d1"], "srcs": ["c0", "c1"], "log_slots": 9, "halves": true}`: `field "halves" belongs to bootstrap`,
	}
	for ins, want := range cases {
		_, _, _, err := loadPlan(variantPlan(params, ins))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", ins, err, want)
		}
	}
	// a params object whose listed offsets are not Lattigo's
	bad := strings.Replace(params, `"log_slots": 9, "key_offsets": null`, `"log_slots": 9, "key_offsets": [1, 2]`, 1)
	_, _, _, err := loadPlan(variantPlan(bad, `{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9}`))
	if err == nil || !strings.Contains(err.Error(), "params.boot.variants[0].key_offsets [1 2] differ") {
		t.Errorf("wrong key_offsets: got %v", err)
	}
	// a ratio out of range
	bad = strings.Replace(params, `"log_slots": 9, "key_offsets": null`, `"log_slots": 9, "log_bsgs_ratio": 7, "key_offsets": null`, 1)
	_, _, _, err = loadPlan(variantPlan(bad, `{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9}`))
	if err == nil || !strings.Contains(err.Error(), "params.boot.variants: log_bsgs_ratio 7 of the variant at 2^9 slots is not in 0..6") {
		t.Errorf("ratio 7: got %v", err)
	}
	// another ratio gives the variant other keys: the params' offsets are checked against them
	r3 := strings.Replace(params, `"log_slots": 9, "key_offsets": null`, `"log_slots": 9, "log_bsgs_ratio": 3, "key_offsets": null`, 1)
	_, s1, _, err := loadPlan(variantPlan(params, `{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9}`))
	if err != nil {
		t.Fatal(err)
	}
	_, s3, _, err := loadPlan(variantPlan(r3, `{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9}`))
	if err != nil {
		t.Fatal(err)
	}
	o1, o3 := bootKeyInfo(*s1.variants[9]).offsets, bootKeyInfo(*s3.variants[9]).offsets
	if fmt.Sprint(o1) == fmt.Sprint(o3) || s3.variants[9].CoeffsToSlotsParameters.LogBSGSRatio != 3 ||
		s3.variants[9].SlotsToCoeffsParameters.LogBSGSRatio != 3 || s1.variants[9].CoeffsToSlotsParameters.LogBSGSRatio != 1 {
		t.Errorf("ratio 3 did not reach the variant's DFTs: offsets %v (ratio 1: %v)", o3, o1)
	}
	listed := strings.Replace(r3, `"log_bsgs_ratio": 3, "key_offsets": null`,
		fmt.Sprintf(`"log_bsgs_ratio": 3, "key_offsets": %s`, strings.Join(strings.Fields(fmt.Sprint(o1)), ", ")), 1)
	if _, _, _, err = loadPlan(variantPlan(listed, `{"op": "bootstrap", "dst": "d0", "src": "c0", "log_slots": 9}`)); err == nil ||
		!strings.Contains(err.Error(), "key_offsets") {
		t.Errorf("ratio 3 with ratio 1's offsets listed: got %v", err)
	}
	// a good plan: the variant's parameters share the full-slot chain; the block is the union
	p, setup, _, err := loadPlan(variantPlan(params, `{"op": "bootstrap2", "dsts": ["d0", "d1"], "srcs": ["c0", "c1"], "log_slots": 10}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(setup.variants) != 1 || setup.variants[10] == nil || p.count("bootstrap2") != 1 {
		t.Fatalf("variants %v", setup.variants)
	}
	full, union := bootKeyInfo(*setup.btp), setup.blockKeys()
	sparse := bootKeyInfo(*setup.variants[10])
	seen := map[uint64]bool{}
	for _, g := range append(append([]uint64{}, full.galEls...), sparse.galEls...) {
		seen[g] = true
	}
	if len(union.galEls) != len(seen) || len(union.galEls) <= len(full.galEls) {
		t.Fatalf("union %d keys, full %d, sparse %d, distinct %d", len(union.galEls), len(full.galEls), len(sparse.galEls), len(seen))
	}
}

// TestMeasureBootVariants prints, for SLOTLATTIGO_MEASURE_VARIANTS="<logN>:<k>,<k>,...", each
// sparse variant's Galois key offsets (conjugation apart), its key count and bytes, and
// the bytes of its encoded DFT matrices, as JSON lines (the data of params.py's
// boot.variants). Heavy at log N 16 (the matrices are encoded): run under the heavy lock.
func TestMeasureBootVariants(t *testing.T) {
	spec := os.Getenv("SLOTLATTIGO_MEASURE_VARIANTS")
	if spec == "" {
		t.Skip("set SLOTLATTIGO_MEASURE_VARIANTS=<logN>:<k>[@<ratio>],... to measure")
	}
	head, tail, _ := strings.Cut(spec, ":")
	logN, err := strconv.Atoi(head)
	if err != nil {
		t.Fatal(err)
	}
	setup := bootSetupAtLogN(t, logN)
	bp := setup.params
	lq, lp := bp.MaxLevel(), bp.MaxLevelP()
	keyBytes := rlwe.NewGaloisKey(bp, rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &lp}).BinarySize()
	for _, f := range strings.Split(tail, ",") {
		// k, or k@r: the variant's DFT matrices at log_bsgs_ratio r
		ks, rs, withRatio := strings.Cut(f, "@")
		k, err := strconv.Atoi(ks)
		if err != nil {
			t.Fatal(err)
		}
		ratio := defaultDFTBSGSRatio
		setup.boot.Variants = nil
		if withRatio {
			if ratio, err = strconv.Atoi(rs); err != nil {
				t.Fatal(err)
			}
			setup.boot.Variants = []bootVariantParams{{LogSlots: k, LogBSGSRatio: &ratio}}
		}
		var btp = setup.btp
		if k != logN-1 {
			if btp, err = variantBootParameters(setup, k); err != nil {
				t.Fatal(err)
			}
		}
		info := bootKeyInfo(*btp)
		union := blockKeyInfo(*setup.btp, map[int]*bootstrapping.Parameters{k: btp})
		tm := time.Now()
		var mb, transient int64 = -1, -1
		var alloc uint64
		if os.Getenv("SLOTLATTIGO_MEASURE_NO_MATRICES") == "" {
			ev, err := newBootEvaluator(*btp, info.galEls)
			if err != nil {
				t.Fatal(err)
			}
			mb = matrixBytes(ev)
			if os.Getenv("SLOTLATTIGO_MEASURE_TRANSIENT") != "" {
				transient, alloc = measureBootTransient(t, btp, ev, k)
			}
			ev = nil
			runtime.GC()
		}
		sec := time.Since(tm).Seconds()
		out, _ := json.Marshal(map[string]any{
			"log_n": logN, "log_slots": k, "log_bsgs_ratio": ratio, "key_offsets": info.offsets, "conjugation": info.conjugation,
			"galois_keys": len(info.galEls), "galois_key_bytes": keyBytes * len(info.galEls),
			"extra_keys_over_full": len(union.galEls) - len(bootKeyInfo(*setup.btp).galEls),
			"matrix_bytes":         mb, "matrix_seconds": sec, "transient_bytes": transient, "alloc_bytes": alloc, "depth": btp.BootstrappingParameters.MaxLevel() - btp.ResidualParameters.MaxLevel(),
		})
		fmt.Println("VARIANT " + string(out))
	}
}

// measureBootTransient generates the keys of btp (a variant's or the full-slot bootstrap's
// parameters), wires them to ev (its matrices encoded: setBootKeys), and
// measures, after one warm-up, the Go heap one bootstrap of a 2^k-slot ciphertext at level 0
// holds above what was live before it (heapPeakDuring: the temporaries, among them the DFTs'
// pre-rotated baby steps, which grow with the BSGS ratio) and what it allocates
// (SLOTLATTIGO_MEASURE_TRANSIENT; docs/lattigo.md, "The DFTs' baby-step giant-step ratio").
func measureBootTransient(t *testing.T, btp *bootstrapping.Parameters, ev *bootstrapping.Evaluator, k int) (int64, uint64) {
	t.Helper()
	res := btp.ResidualParameters
	sk := rlwe.NewKeyGenerator(res).GenSecretKeyNew()
	evk, _, err := btp.GenEvaluationKeys(sk)
	if err != nil {
		t.Fatal(err)
	}
	setBootKeys(ev, evk, nil)
	rng := rand.New(rand.NewSource(int64(k)))
	vals := make([]float64, 1<<k)
	for i := range vals {
		vals[i] = (rng.Float64()*2 - 1) / 16
	}
	pt := ckks.NewPlaintext(res, 0)
	pt.LogDimensions.Cols = k
	if err := ckks.NewEncoder(res).Encode(vals, pt); err != nil {
		t.Fatal(err)
	}
	ct, err := rlwe.NewEncryptor(res, sk).EncryptNew(pt)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bootstrapCt(ev, ct, 1); err != nil { // warm-up
		t.Fatal(err)
	}
	transient, alloc, err := heapPeakDuring(func() error {
		_, _, err := bootstrapCt(ev, ct, 1)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return transient, alloc
}

// TestBootVariantsLogN12 runs every kind of variant through Run on the bootstrapping chain at
// log N 12 (insecure and small: ~1 s a bootstrap, well under 1 GB), beside a full-slot
// bootstrap, and checks each output against scale * input over all slots and its level.
func TestBootVariantsLogN12(t *testing.T) {
	const logN, slots = 12, 2048
	params := strings.Replace(withVariants(6, 9), `"log_n": 14, "slots": 8192`, `"log_n": 12, "slots": 2048`, 1)
	// the 2^9-slot variant's DFT matrices at log_bsgs_ratio 3 (keys of other offsets, made by
	// the client and asked for by the evaluator from the same params entry)
	params = strings.Replace(params, `{"log_slots": 9, "key_offsets": null, "matrix_bytes": 1}`,
		`{"log_slots": 9, "key_offsets": null, "matrix_bytes": 1, "log_bsgs_ratio": 3}`, 1)
	if !strings.Contains(params, `"log_bsgs_ratio": 3`) {
		t.Fatal("the params did not take the ratio")
	}
	rng := rand.New(rand.NewSource(5))
	const A = 0.0625
	vec := func(n int, bound float64) []float64 {
		v := make([]float64, slots)
		for i := 0; i < n; i++ {
			v[i] = (rng.Float64()*2 - 1) * bound
		}
		return v
	}
	type out struct {
		want  []float64
		kind  string
		level int
	}
	var program []string
	var inputs [][]float64
	var outs []out
	reg := 0
	down := func(v []float64, level int) string {
		reg++
		r := fmt.Sprintf("c%d", reg)
		program = append(program, fmt.Sprintf(`{"op": "input", "dst": "%s", "tensor": "x", "table": "t"}`, r))
		inputs = append(inputs, v)
		for l := 9; l > level; l-- {
			reg++
			m, d := fmt.Sprintf("c%d", reg), fmt.Sprintf("c%d_", reg)
			program = append(program, fmt.Sprintf(`{"op": "pmul", "dst": "%s", "src": "%s", "pt": "one"}`, m, r),
				fmt.Sprintf(`{"op": "rescale", "dst": "%s", "src": "%s"}`, d, m))
			r = d
		}
		return r
	}
	scaled := func(v []float64, s float64) []float64 {
		o := make([]float64, len(v))
		for i := range v {
			o[i] = s * v[i]
		}
		return o
	}
	// the block streamed (one key read ahead): each kind's key order is learned apart, the
	// unpacking's conjugation key among them (the n14boot tests keep the whole block)
	program = append(program, `{"op": "load_key", "block": "boot", "stream": 1}`)
	x := vec(slots, A)
	program = append(program, fmt.Sprintf(`{"op": "bootstrap", "dst": "f", "src": "%s"}`, down(x, 0)),
		`{"op": "output", "src": "f", "tensor": "y", "table": "t"}`)
	outs = append(outs, out{x, "full", 9})
	for _, k := range []int{6, 9} {
		n := 1 << k
		s := vec(n, A)
		program = append(program, fmt.Sprintf(`{"op": "bootstrap", "dst": "s%d", "src": "%s", "log_slots": %d, "scale": 1.5}`, k, down(s, 0), k),
			fmt.Sprintf(`{"op": "output", "src": "s%d", "tensor": "y", "table": "t"}`, k))
		outs = append(outs, out{scaled(s, 1.5), fmt.Sprintf("s%d", k), 8})
		h := vec(2*n, A/2)
		program = append(program, fmt.Sprintf(`{"op": "bootstrap", "dst": "h%d", "src": "%s", "log_slots": %d, "halves": true}`, k, down(h, 1), k),
			fmt.Sprintf(`{"op": "output", "src": "h%d", "tensor": "y", "table": "t"}`, k))
		outs = append(outs, out{h, fmt.Sprintf("h%d", k), 8})
		a, b := vec(n, A/2), vec(n, A/2)
		ra, rb := down(a, 0), down(b, 3)
		program = append(program, fmt.Sprintf(`{"op": "bootstrap2", "dsts": ["pa%d", "pb%d"], "srcs": ["%s", "%s"], "log_slots": %d, "scale": -0.5}`, k, k, ra, rb, k),
			fmt.Sprintf(`{"op": "output", "src": "pa%d", "tensor": "y", "table": "t"}`, k),
			fmt.Sprintf(`{"op": "output", "src": "pb%d", "tensor": "y", "table": "t"}`, k))
		outs = append(outs, out{scaled(a, -0.5), fmt.Sprintf("p%d", k), 8}, out{scaled(b, -0.5), fmt.Sprintf("p%d", k), 8})
	}
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + params + `, "plaintexts": {"one": {"source": "const", "table": "one"}},
	  "program": [` + strings.Join(program, ",\n") + `]}`
	one := make([]float64, slots)
	for i := range one {
		one[i] = 1
	}
	r := mustRun(t, planJSON, packVecs(inputs...), packVecs(one))
	if len(r.Outputs) != len(outs) {
		t.Fatalf("%d outputs, want %d", len(r.Outputs), len(outs))
	}
	for j, o := range outs {
		got := decodeOut(t, r.Outputs[j].Data)
		e := 0.0
		for i := range got {
			e = math.Max(e, math.Abs(got[i]-o.want[i]))
		}
		bits := math.Log2(A / e)
		if os.Getenv("SLOTLATTIGO_DEBUG_VARIANTS") != "" {
			t.Logf("got %.4f\nwant %.4f\ngot[64:] %.4f", got[:6], o.want[:6], got[64:70])
		}
		t.Logf("%-5s level %d: max abs error %.3g (%.1f bits below max_abs)", o.kind, r.Outputs[j].Level, e, bits)
		if bits < 14 || r.Outputs[j].Level != o.level {
			t.Errorf("%s: max abs error %.3g (%.1f bits), level %d (want %d)", o.kind, e, bits, r.Outputs[j].Level, o.level)
		}
	}
	t.Logf("bootstrap kinds %v seconds %v; streamed key reads %d", r.Stats.BootstrapKinds, r.Stats.BootstrapSeconds, r.Stats.BootStreamReads)
	if r.Stats.BootStreamReads == 0 {
		t.Errorf("the block was not streamed")
	}
	// every kind's key order predicted from its evaluator (bootorder.go) and followed to the
	// end by its bootstrap: no request off the order, no bootstrap reading its keys in line
	if st := r.Stats; st.BootStreamPredicted != 7 || st.BootStreamLearned != 0 || st.BootStreamMisses != 0 {
		t.Errorf("streamed key orders: %d predicted, %d learned, %d misses; want 7, 0, 0",
			st.BootStreamPredicted, st.BootStreamLearned, st.BootStreamMisses)
	}
	// every bootstrap here is of another kind than the one before: each reads ahead its
	// successor's first key as it ends (bootorder.go, nextBootstrap) and none past its own
	// last, so every key read is a key asked for (wrapping around into the same kind's
	// order read one unused key per change of kind)
	if st := r.Stats; st.BootStreamReads != st.BootStreamRequests || st.BootStreamReads == 0 {
		t.Errorf("%d streamed key reads for %d requests: want one read per request", st.BootStreamReads, st.BootStreamRequests)
	}
	if len(r.Stats.BootstrapKinds) != 7 || r.Stats.BootstrapKinds[0] != "full" || r.Stats.BootstrapKinds[3] != "p6" {
		t.Errorf("bootstrap kinds %v", r.Stats.BootstrapKinds)
	}
	// the six sparse bootstraps are timed by phase (bootphase.go), inside their instructions
	ph := r.Stats.BootstrapPhases
	if ph == nil || ph.Count != 6 {
		t.Fatalf("bootstrap phases %+v, want 6 sparse bootstraps", ph)
	}
	var phases, sparse float64
	for _, name := range bootPhaseNames {
		if ph.Seconds[name] <= 0 || ph.CPUSeconds[name] <= 0 {
			t.Errorf("phase %s: %g s, %g s CPU", name, ph.Seconds[name], ph.CPUSeconds[name])
		}
		phases += ph.Seconds[name]
	}
	for i, kd := range r.Stats.BootstrapKinds {
		if kd != "full" {
			sparse += r.Stats.BootstrapSeconds[i]
		}
	}
	if phases > sparse {
		t.Errorf("the phases sum to %g s, more than the sparse bootstrap instructions' %g s", phases, sparse)
	}
	t.Logf("phases %v (cpu %v, key waits %v); eval cpu %+v", ph.Seconds, ph.CPUSeconds, ph.KeyWait, *r.Stats.EvalCPU)
	if c := r.Stats.EvalCPU; c == nil || c.UserSeconds <= 0 || c.GCCycles == 0 {
		t.Errorf("eval_cpu %+v: no CPU time or GC cycle counted", c)
	}
}

// A wrong prediction only costs read-ahead: with every predicted order reversed, each
// kind's first bootstrap leaves it at its first request, reads its keys in line and learns
// the order; the second follows what it learned; every output is right.
func TestBootKeyOrderMispredicted(t *testing.T) {
	defer func(f func([]uint64) []uint64) { reorderPrediction = f }(reorderPrediction)
	reorderPrediction = func(seq []uint64) []uint64 {
		r := make([]uint64, len(seq))
		for i, g := range seq {
			r[len(seq)-1-i] = g
		}
		return r
	}
	const slots = 2048
	params := strings.Replace(withVariants(6, 9), `"log_n": 14, "slots": 8192`, `"log_n": 12, "slots": 2048`, 1)
	rng := rand.New(rand.NewSource(7))
	var program []string
	var inputs, wants [][]float64
	for j, k := range []int{0, 0, 9, 9} {
		v := make([]float64, slots)
		n := slots
		if k > 0 {
			n = 1 << k
		}
		for i := 0; i < n; i++ {
			v[i] = (rng.Float64()*2 - 1) * 0.0625
		}
		inputs, wants = append(inputs, v), append(wants, v)
		r := fmt.Sprintf("c%d", j)
		program = append(program, fmt.Sprintf(`{"op": "input", "dst": "%s", "tensor": "x", "table": "t"}`, r))
		for l := 9; l > 0; l-- {
			m, d := fmt.Sprintf("c%d_m%d", j, l), fmt.Sprintf("c%d_%d", j, l)
			program = append(program, fmt.Sprintf(`{"op": "pmul", "dst": "%s", "src": "%s", "pt": "one"}`, m, r),
				fmt.Sprintf(`{"op": "rescale", "dst": "%s", "src": "%s"}`, d, m))
			r = d
		}
		ls := ""
		if k > 0 {
			ls = fmt.Sprintf(`, "log_slots": %d`, k)
		}
		program = append(program, fmt.Sprintf(`{"op": "bootstrap", "dst": "b%d", "src": "%s"%s}`, j, r, ls),
			fmt.Sprintf(`{"op": "output", "src": "b%d", "tensor": "y", "table": "t"}`, j))
	}
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + params + `, "plaintexts": {"one": {"source": "const", "table": "one"}},
	  "program": [{"op": "load_key", "block": "boot", "stream": 2}, ` + strings.Join(program, ",\n") + `]}`
	one := make([]float64, slots)
	for i := range one {
		one[i] = 1
	}
	r := mustRun(t, planJSON, packVecs(inputs...), packVecs(one))
	for j, want := range wants {
		got := decodeOut(t, r.Outputs[j].Data)
		e := 0.0
		for i := range got {
			e = math.Max(e, math.Abs(got[i]-want[i]))
		}
		if bits := math.Log2(0.0625 / e); bits < 14 {
			t.Errorf("bootstrap %d: max abs error %.3g (%.1f bits)", j, e, bits)
		}
	}
	if st := r.Stats; st.BootStreamPredicted != 2 || st.BootStreamLearned != 0 || st.BootStreamMisses != 2 {
		t.Errorf("streamed key orders: %d predicted, %d learned, %d misses; want 2, 0, 2 (one miss per kind)",
			st.BootStreamPredicted, st.BootStreamLearned, st.BootStreamMisses)
	}
}
