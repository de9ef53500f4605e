package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// The bootstrapping chain at log N 14 (insecure, the test size): N16QP1546H192H32's residual
// chain [60, 40 x 9] / [61 x 5], 9 levels after a bootstrap.
const testBootParams = `{"log_n": 14, "slots": 8192, "log_q": [60, 40, 40, 40, 40, 40, 40, 40, 40, 40],
  "log_p": [61, 61, 61, 61, 61], "log_scale": 40,
  "boot": {"literal": "N16QP1546H192H32", "levels_after": 9}}`

// memAvailable is MemAvailable of /proc/meminfo in bytes (0 when unknown).
func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			var kb int64
			if _, err := fmt.Sscan(rest, &kb); err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

func skipWithoutBootMemory(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("bootstrapping test skipped in -short mode")
	}
	if avail := memAvailable(); avail > 0 && avail < 4<<30 {
		t.Skipf("bootstrapping at log N 14 needs ~3 GB; only %d MiB available", avail>>20)
	}
}

// bootParamsAt is testBootParams on a ring of degree 2^logN: the same chain and bootstrapping
// literal (log N 12 is insecure and small: ~1 s a bootstrap, well under 1 GB).
func bootParamsAt(logN int) string {
	return strings.Replace(testBootParams, `"log_n": 14, "slots": 8192`, fmt.Sprintf(`"log_n": %d, "slots": %d`, logN, 1<<(logN-1)), 1)
}

// bootRings are the rings a streamed-block test runs on: log N 12 always (the cheaper cover
// that `go test -short`, i.e. `make test`, keeps), and log N 14 unless -short or short of
// memory (`make test-all`, `make gocheck`).
func bootRings(t *testing.T) []int {
	t.Helper()
	if testing.Short() {
		return []int{12}
	}
	if avail := memAvailable(); avail > 0 && avail < 4<<30 {
		t.Logf("log N 14 skipped: bootstrapping there needs ~3 GB; only %d MiB available", avail>>20)
		return []int{12}
	}
	return []int{12, 14}
}

// levelChain is the program head input x -> n x (pmul by p0, rescale): n levels spent.
func levelChain(n int) ([]string, string) {
	program := []string{`{"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"}`}
	prev := "c0"
	for i := 1; i <= n; i++ {
		program = append(program, fmt.Sprintf(`{"op": "pmul", "dst": "m%d", "src": "%s", "pt": "p0"}`, i, prev),
			fmt.Sprintf(`{"op": "rescale", "dst": "r%d", "src": "m%d"}`, i, i))
		prev = fmt.Sprintf("r%d", i)
	}
	return program, prev
}

func TestBootParamsChecks(t *testing.T) {
	s := testBootSetup(t)
	if s.top != 9 || s.params.MaxLevel() != 24 || s.params.LogDefaultScale() != 40 {
		t.Fatalf("top %d, bootstrapping max level %d, log scale %d", s.top, s.params.MaxLevel(), s.params.LogDefaultScale())
	}
	info := bootKeyInfo(*s.btp)
	if len(info.galEls) != 35 || !info.conjugation || len(info.offsets) != 34 {
		t.Fatalf("%d Galois elements (35 measured at log N 14), %d offsets, conjugation %v", len(info.galEls), len(info.offsets), info.conjugation)
	}
	// Residual primes are the bootstrapping chain's first primes.
	for i, q := range s.btp.ResidualParameters.Q() {
		if s.params.Q()[i] != q {
			t.Fatalf("prime %d differs", i)
		}
	}
	bad := map[string]string{
		`"literal": "N16QP1546H192H32"`: `"literal": "N15QP768H192H32"`,
		`"levels_after": 9`:             `"levels_after": 8`,
		`"log_scale": 40`:               `"log_scale": 45`,
	}
	want := []string{"is not supported", "leaves 9 levels", "differ from the residual chain"}
	keys := make([]string, 0, len(bad))
	for k := range bad {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, from := range keys {
		var q planParams
		if err := json.Unmarshal([]byte(strings.Replace(testBootParams, from, bad[from], 1)), &q); err != nil {
			t.Fatal(err)
		}
		_, err := q.setup()
		ok := false
		for _, w := range want {
			if err != nil && strings.Contains(err.Error(), w) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("%s -> %s: want one of %q, got %v", from, bad[from], want, err)
		}
	}
	var q planParams
	_ = json.Unmarshal([]byte(strings.Replace(testBootParams, `"levels_after": 9`, `"levels_after": 9, "key_offsets": [1, 2]`, 1)), &q)
	if _, err := q.setup(); err == nil || !strings.Contains(err.Error(), "key_offsets") {
		t.Errorf("wrong key_offsets accepted: %v", err)
	}
	_ = json.Unmarshal([]byte(strings.Replace(testBootParams, `"levels_after": 9`,
		fmt.Sprintf(`"levels_after": 9, "key_offsets": %s, "conjugation": true`, mustJSON(info.offsets)), 1)), &q)
	if _, err := q.setup(); err != nil {
		t.Errorf("right key_offsets refused: %v", err)
	}
	// A plan that bootstraps on plain parameters is refused before any cryptography.
	_, err := Run(`{"schema": "slotplan.plan/1", "params": `+testParams+`, "program": [
	   {"op": "input", "dst": "c0", "tensor": "x", "table": "t"},
	   {"op": "bootstrap", "dst": "c1", "src": "c0"}]}`, packVecs(make([]float64, 2048)), nil, "")
	if err == nil || !strings.Contains(err.Error(), `instruction 1 (bootstrap): the plan's params carry no "boot" object`) {
		t.Errorf("bootstrap on plain params: %v", err)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// secretKeyFree walks everything reachable from v and reports a path to a non-nil
// *rlwe.SecretKey, or "".
func secretKeyFree(v reflect.Value, path string, seen map[uintptr]bool) string {
	skType := reflect.TypeOf(&rlwe.SecretKey{})
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return ""
		}
		if v.Type() == skType {
			return path
		}
		if seen[v.Pointer()] {
			return ""
		}
		seen[v.Pointer()] = true
		return secretKeyFree(v.Elem(), path, seen)
	case reflect.Interface:
		if v.IsNil() {
			return ""
		}
		return secretKeyFree(v.Elem(), path, seen)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if p := secretKeyFree(v.Field(i), path+"."+v.Type().Field(i).Name, seen); p != "" {
				return p
			}
		}
	case reflect.Slice, reflect.Array:
		switch v.Type().Elem().Kind() {
		case reflect.Uint64, reflect.Uint8, reflect.Int, reflect.Float64, reflect.Uint32, reflect.Int64:
			return "" // coefficient arrays
		}
		for i := 0; i < v.Len(); i++ {
			if p := secretKeyFree(v.Index(i), fmt.Sprintf("%s[%d]", path, i), seen); p != "" {
				return p
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			if p := secretKeyFree(it.Value(), fmt.Sprintf("%s[%v]", path, it.Key()), seen); p != "" {
				return p
			}
		}
	}
	return ""
}

// TestBootstrapN14 runs one plan that spends all 9 levels, bootstraps (the key block
// resident: keep-all), rotates by an offset the block holds and by one it does not,
// multiplies two ciphertexts (the block's relinearisation key) and checks the result, the
// key directory and that nothing the evaluation side holds is a secret key.
func TestBootstrapN14(t *testing.T) {
	skipWithoutBootMemory(t)
	const slots = 8192
	rng := rand.New(rand.NewSource(3))
	x := make([]float64, slots)
	for i := range x {
		x[i] = rng.Float64()*2 - 1
	}
	half := make([]float64, slots)
	for i := range half {
		half[i] = 0.5 + 0.5*rng.Float64() // factors in [0.5, 1): 9 of them keep |x| >= 2^-9
	}
	setup := testBootSetup(t)
	info := bootKeyInfo(*setup.btp)
	inBlock := info.offsets[0]
	notInBlock := 1
	for blockHas := true; blockHas; notInBlock++ {
		blockHas = false
		for _, k := range info.offsets {
			blockHas = blockHas || k == notInBlock
		}
	}
	notInBlock--
	t.Logf("block offsets %v; the plan also rotates by %d", info.offsets, notInBlock)
	program, prev := levelChain(9)
	program = append(program,
		fmt.Sprintf(`{"op": "bootstrap", "dst": "b", "src": "%s"}`, prev),
		fmt.Sprintf(`{"op": "rot", "dst": "u", "src": "b", "k": %d}`, inBlock),
		fmt.Sprintf(`{"op": "rot", "dst": "v", "src": "b", "k": %d}`, notInBlock),
		`{"op": "cmul", "dst": "w", "a": "u", "b": "v"}`,
		`{"op": "add", "dst": "y", "a": "w", "b": "b"}`,
		`{"op": "output", "src": "y", "tensor": "y", "table": "out/y"}`)
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + testBootParams + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}}, "program": [` + strings.Join(program, ",\n") + `]}`

	// Run's steps, with a look at the evaluation side before the output is decrypted.
	p, _, _, err := loadPlan(planJSON)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := newSetupClient(setup)
	offsets := planKeyOffsets(p, info)
	if len(offsets) != 1 || offsets[0] != notInBlock {
		t.Fatalf("plan keys %v, want only %d (the block holds %d)", offsets, notInBlock, inBlock)
	}
	m, _, _, err := c.writeKeySet(dir, offsets, false, setup.top, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	releaseMemory()
	// The key directory: the manifest, the plan's one rotation key and the block (35 Galois
	// keys, relinearisation, two encapsulation keys); no secret key.
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1+1+35+3 {
		t.Fatalf("key directory holds %d files", len(files))
	}
	for _, f := range files {
		if strings.Contains(filepath.Base(f), "sk") || strings.Contains(filepath.Base(f), "secret") {
			t.Fatalf("key directory holds %s", f)
		}
	}
	// The keys one by one add up to EvaluationKeys.BinarySize less its framing (flags, map headers).
	if d := int64(m.Boot.EvaluationKeysSize) - m.Boot.Bytes; d < 0 || d > 1024 {
		t.Errorf("boot block %d bytes, EvaluationKeys.BinarySize %d", m.Boot.Bytes, m.Boot.EvaluationKeysSize)
	}
	if m.Boot.EvaluationKeysSize != 1455522709 {
		t.Errorf("EvaluationKeys.BinarySize %d, measured 1455522709 before", m.Boot.EvaluationKeysSize)
	}
	keys, err := openKeyStore(dir, setup.params)
	if err != nil {
		t.Fatal(err)
	}
	st := &stats{OpCounts: map[string]int{}, OpSeconds: map[string]float64{}}
	inVecs, err := unpack("inputs", packVecs(x), 1, slots)
	if err != nil {
		t.Fatal(err)
	}
	in0, err := c.encrypt(inVecs[0])
	if err != nil {
		t.Fatal(err)
	}
	io := &ctIO{inputs: []*rlwe.Ciphertext{in0}}
	ex := newExecutor(setup, keys, p, map[string][]float64{"p0": half}, io, st)
	if err = ex.run(); err != nil {
		t.Fatal(err)
	}
	// Everything of the evaluation side (keep-all: the block is still resident after the run).
	seen := map[uintptr]bool{}
	for name, v := range map[string]any{"executor": ex} {
		if path := secretKeyFree(reflect.ValueOf(v), name, seen); path != "" {
			t.Errorf("the evaluation side reaches a secret key: %s", path)
		}
	}
	if ex.btpEval == nil || ex.btpEval.SkDebug != nil {
		t.Errorf("bootstrapping evaluator %v", ex.btpEval)
	}
	outs, err := c.decryptOutputs(p, io.outputs)
	if err != nil {
		t.Fatal(err)
	}
	if st.BootKeyBytes != m.Boot.Bytes || st.BootMatrixBytes != 461666240 {
		t.Errorf("block keys %d bytes (want %d), matrices %d bytes (measured 461666240)", st.BootKeyBytes, m.Boot.Bytes, st.BootMatrixBytes)
	}
	got := decodeOut(t, outs[0].Data)
	if outs[0].Level != 9-1 {
		t.Errorf("output level %d, want 8 (bootstrap to 9, one cmul)", outs[0].Level)
	}
	maxErr := 0.0
	for s := 0; s < slots; s++ {
		b := func(j int) float64 {
			v := x[j]
			for i := 0; i < 9; i++ {
				v *= half[j]
			}
			return v
		}
		want := b((s+inBlock)%slots)*b((s+notInBlock)%slots) + b(s)
		maxErr = math.Max(maxErr, math.Abs(got[s]-want))
	}
	t.Logf("max abs error %.3g (%.1f bits), bootstrap %.2f s, matrices %.2f s, stats %+v",
		maxErr, -math.Log2(maxErr), st.BootstrapSeconds[0], st.BootMatrixSeconds, *st)
	if maxErr > 1e-5 {
		t.Fatalf("max abs error %g", maxErr)
	}
}

// TestBootstrapRange measures what a bootstrap accepts: vectors uniform in [-A, A] for
// growing A, bootstrapped from the top level and from level 0 (after 9 multiplications by
// one), and reports the max abs error and the bits of precision relative to A. Slow (two
// bootstraps per A at log N 14): run with SLOTLATTIGO_BOOT_RANGE=1. With
// SLOTLATTIGO_BOOT_RANGE_CONST=1 every slot holds A: the worst case (EvalMod works on the
// coefficients, and a constant vector puts all of its energy, A, in one coefficient; random
// slots spread it, ~A/sqrt(N) per coefficient). boot.max_abs comes from the worst case.
func TestBootstrapRange(t *testing.T) {
	if os.Getenv("SLOTLATTIGO_BOOT_RANGE") == "" {
		t.Skip("set SLOTLATTIGO_BOOT_RANGE=1 to measure the bootstrap's input range")
	}
	skipWithoutBootMemory(t)
	const slots = 8192
	amps := []float64{0.5, 1, 2, 4, 8, 16, 32, 64, 128}
	if s := os.Getenv("SLOTLATTIGO_BOOT_RANGE_AMPS"); s != "" && s != "1" {
		if err := json.Unmarshal([]byte(s), &amps); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewSource(5))
	var program []string
	var inputs [][]float64
	ones := make([]float64, slots)
	for i := range ones {
		ones[i] = 1
	}
	for a, amp := range amps {
		v := make([]float64, slots)
		for i := range v {
			v[i] = amp * (rng.Float64()*2 - 1)
		}
		v[0], v[1] = amp, -amp
		if os.Getenv("SLOTLATTIGO_BOOT_RANGE_CONST") != "" {
			for i := range v {
				v[i] = amp
			}
		}
		inputs = append(inputs, v, v)
		program = append(program,
			fmt.Sprintf(`{"op": "input", "dst": "t%d", "tensor": "x", "table": "in/x"}`, a),
			fmt.Sprintf(`{"op": "bootstrap", "dst": "bt%d", "src": "t%d"}`, a, a),
			fmt.Sprintf(`{"op": "output", "src": "bt%d", "tensor": "y", "table": "out/y"}`, a),
			fmt.Sprintf(`{"op": "input", "dst": "z%d_0", "tensor": "x", "table": "in/x"}`, a))
		for l := 1; l <= 9; l++ {
			program = append(program, fmt.Sprintf(`{"op": "pmul", "dst": "z%d_%d", "src": "z%d_%d", "pt": "one"}`, a, l, a, l-1))
		}
		program = append(program,
			fmt.Sprintf(`{"op": "bootstrap", "dst": "bz%d", "src": "z%d_9"}`, a, a),
			fmt.Sprintf(`{"op": "output", "src": "bz%d", "tensor": "y", "table": "out/y"}`, a))
	}
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + testBootParams + `,
	  "plaintexts": {"one": {"source": "const", "table": "pt/one"}}, "program": [` + strings.Join(program, ",\n") + `]}`
	res, err := Run(planJSON, packVecs(inputs...), packVecs(ones), "")
	if err != nil {
		t.Fatal(err)
	}
	var r runResult
	if err := json.Unmarshal([]byte(res), &r); err != nil {
		t.Fatal(err)
	}
	for i, o := range r.Outputs {
		got := decodeOut(t, o.Data)
		want := inputs[i]
		maxErr := 0.0
		for s := range got {
			maxErr = math.Max(maxErr, math.Abs(got[s]-want[s]))
		}
		from := "top level"
		if i%2 == 1 {
			from = "level 0"
		}
		amp := amps[i/2]
		t.Logf("A = %-8g from %-9s: bootstrap input level %d, max abs error %.3g, log2(A/err) = %.1f bits, log2(1/err) = %.1f bits, %.2f s",
			amp, from, r.Stats.BootstrapInLevels[i], maxErr, math.Log2(amp/maxErr), -math.Log2(maxErr), r.Stats.BootstrapSeconds[i])
	}
	t.Logf("peak RSS %d MiB (start %d MiB), tracked peak %d MiB", r.Stats.PeakRSSBytes>>20, r.Stats.RSSStartBytes>>20, r.Stats.PeakTrackedBytes>>20)
}

// TestBootstrapStreamedBlock runs two bootstraps with the block streamed (load_key
// {"block": "boot", "stream": 2}): the result equals the whole block's, and at most 3 of the
// block's Galois keys are resident at once (plus its relinearisation and encapsulation keys).
func TestBootstrapStreamedBlock(t *testing.T) {
	for _, logN := range bootRings(t) {
		t.Run(fmt.Sprintf("logN%d", logN), func(t *testing.T) { testBootstrapStreamedBlock(t, logN) })
	}
}

func testBootstrapStreamedBlock(t *testing.T, logN int) {
	slots := 1 << (logN - 1)
	rng := rand.New(rand.NewSource(7))
	x := make([]float64, slots)
	half := make([]float64, slots)
	for i := range x {
		x[i] = (rng.Float64()*2 - 1) / 16
		half[i] = 0.5 + 0.5*rng.Float64()
	}
	params := bootParamsAt(logN)
	// a plan key (an offset the block does not hold) loaded while the block is streamed
	info := bootKeyInfo(*bootSetupOf(t, params).btp)
	planK := 1
	for slices.Contains(info.offsets, planK) {
		planK++
	}
	program, prev := levelChain(9)
	program = append(program,
		`{"op": "load_key", "block": "boot", "stream": 2}`,
		fmt.Sprintf(`{"op": "bootstrap", "dst": "b1", "src": "%s"}`, prev),
		`{"op": "pmul", "dst": "m10", "src": "b1", "pt": "p0"}`,
		`{"op": "rescale", "dst": "r10", "src": "m10"}`,
		`{"op": "bootstrap", "dst": "b2", "src": "r10"}`,
		`{"op": "bootstrap", "dst": "b3", "src": "b2"}`,
		fmt.Sprintf(`{"op": "load_key", "k": %d}`, planK),
		fmt.Sprintf(`{"op": "rot", "dst": "b4", "src": "b3", "k": %d}`, planK),
		fmt.Sprintf(`{"op": "drop_key", "k": %d}`, planK),
		`{"op": "drop_key", "block": "boot"}`,
		`{"op": "output", "src": "b4", "tensor": "y", "table": "out/y"}`)
	planJSON := `{"schema": "slotplan.plan/1", "params": ` + params + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}}, "keys": {}, "program": [` + strings.Join(program, ",\n") + `]}`
	// streamed keys mapped (the default: pagecache.go) and copied (SLOTPLAN_KEY_MAP=off):
	// the same checks, and the same outputs
	var outs [2][]float64
	for mode, mapped := range []bool{true, false} {
		if !mapped {
			t.Setenv("SLOTPLAN_KEY_MAP", "off")
		}
		outs[mode] = checkStreamedRun(t, logN, params, planJSON, planK, x, half, mapped)
	}
	for s := range outs[0] {
		if d := math.Abs(outs[0][s] - outs[1][s]); d > 1e-7 {
			t.Fatalf("slot %d: %g with mapped keys, %g with copied keys", s, outs[0][s], outs[1][s])
		}
	}
}

// checkStreamedRun runs testBootstrapStreamedBlock's plan and checks its outputs and stream.
func checkStreamedRun(t *testing.T, logN int, params, planJSON string, planK int, x, half []float64, mapped bool) []float64 {
	t.Helper()
	slots := len(x)
	r := mustRun(t, planJSON, packVecs(x), packVecs(half))
	got := decodeOut(t, r.Outputs[0].Data)
	maxErr := 0.0
	for s := range got {
		j := (s + planK) % slots // y = rot(b3, planK)
		want := x[j]
		for i := 0; i < 10; i++ {
			want *= half[j]
		}
		maxErr = math.Max(maxErr, math.Abs(got[s]-want))
	}
	st := r.Stats
	setup := bootSetupOf(t, params)
	// the size of one Galois key of the block
	gk := int64(rlwe.NewGaloisKey(setup.params, rlwe.EvaluationKeyParameters{}).BinarySize())
	t.Logf("mapped %v: max abs error %.3g; peak key bytes %d (block fixed %d + %d Galois keys), stream reads %d, bootstraps %v",
		mapped, maxErr, st.PeakKeyBytes, st.BootKeyBytes, (st.PeakKeyBytes-st.BootKeyBytes)/gk, st.BootStreamReads, st.BootstrapSeconds)
	if maxErr > 1e-6 {
		t.Fatalf("max abs error %g", maxErr)
	}
	// the block's fixed part (relinearisation and two encapsulation keys), at most
	// depth + 1 = 3 Galois keys, and the plan key (loaded after the last bootstrap, while
	// the block's last streamed key may still be held: at most one more key)
	if st.BootKeyBytes > 3*gk || st.PeakKeyBytes > st.BootKeyBytes+4*gk {
		t.Fatalf("block fixed part %d bytes, peak key bytes %d: more than 3 Galois keys resident", st.BootKeyBytes, st.PeakKeyBytes)
	}
	// a bootstrap asks for R keys (at log N 14, 55: C2S 4 x 6, conjugation, S2C 3 x 10) in
	// the order predicted (bootorder.go): 2 are read ahead as the first begins, and each
	// request reads the key 2 places on, wrapping around to the next bootstrap's first
	// keys but not past the last bootstrap's end: each key once per bootstrap, 3R
	reqs := st.BootStreamReads / 3
	if st.Bootstraps != 3 || st.BootStreamReads != 3*reqs || reqs < 3 || (logN == 14 && reqs != 55) {
		t.Fatalf("%d bootstraps, %d streamed key reads (want 3R, R = 55 at log N 14)", st.Bootstraps, st.BootStreamReads)
	}
	if st.BootStreamRequests != st.BootStreamReads {
		t.Fatalf("%d streamed key requests, %d reads: want one read per request", st.BootStreamRequests, st.BootStreamReads)
	}
	if st.BootStreamPredicted != 1 || st.BootStreamLearned != 0 || st.BootStreamMisses != 0 {
		t.Fatalf("streamed key order: %d predicted, %d learned, %d misses; want 1, 0, 0", st.BootStreamPredicted, st.BootStreamLearned, st.BootStreamMisses)
	}
	if mapped {
		// every streamed key is mapped (a mapped key's memory is not reused)
		if st.KeyStreamMapped != int64(st.BootStreamReads) || st.BootStreamReused != 0 {
			t.Fatalf("%d of %d streamed keys mapped, %d reused: want all mapped, none reused",
				st.KeyStreamMapped, st.BootStreamReads, st.BootStreamReused)
		}
	} else if st.KeyStreamMapped != 0 || st.BootStreamReused != st.BootStreamReads-3 {
		// every read but the first three (the two as the first bootstrap begins, and its
		// first request's, when no key is finished yet) reads into a finished key, and the
		// outputs above are right with them
		t.Fatalf("%d streamed keys mapped, %d reads into finished keys: want 0 and %d", st.KeyStreamMapped, st.BootStreamReused, st.BootStreamReads-3)
	}
	// the storage reads are counted by what was read (Linux: /proc/thread-self/io)
	if threadStorageReadBytes() >= 0 {
		sr := st.KeyStorageReadBytes
		if len(sr) != 3 || sr["plan_keys"] < 0 || sr["block_keys"] < 0 || sr["block_stream"] < 0 {
			t.Fatalf("key_storage_read_bytes %v: want plan_keys, block_keys and block_stream", sr)
		}
	}
	return got
}

// testBootSetup is the evaluation setup of testBootParams.
func testBootSetup(t *testing.T) *evalSetup {
	t.Helper()
	return bootSetupOf(t, testBootParams)
}

// bootSetupAtLogN is the evaluation setup of the test bootstrapping params at log N logN.
func bootSetupAtLogN(t *testing.T, logN int) *evalSetup {
	t.Helper()
	return bootSetupOf(t, strings.Replace(testBootParams, `"log_n": 14, "slots": 8192`,
		fmt.Sprintf(`"log_n": %d, "slots": %d`, logN, 1<<(logN-1)), 1))
}

// bootSetupOf is the evaluation setup of a plan's params object.
func bootSetupOf(t *testing.T, params string) *evalSetup {
	t.Helper()
	var pp planParams
	if err := json.Unmarshal([]byte(params), &pp); err != nil {
		t.Fatal(err)
	}
	s, err := pp.setup()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
