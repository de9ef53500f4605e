package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The plaintext store (ptstore.go) through Run: the first call encodes the streamed block's
// plaintexts and adds them, the next reads every one back and encodes none, a changed
// weight is a miss (content-addressed) and the block's values stay right throughout; a full
// store adds nothing and changes nothing; the file is never visible in the directory.
func TestPlaintextStore(t *testing.T) {
	const slots = 2048
	plan, pts := bsgsPlan()
	giants := []int{0, 4, 8}
	v := randVecs(11, 1+len(pts), slots)
	x, pv := v[0], v[1:]
	want := func(pv [][]float64) []float64 {
		w := make([]float64, slots)
		for gi, g := range giants {
			for b := 0; b < 4; b++ {
				p := pv[4*gi+b]
				for s := range w {
					w[s] += p[(s+g)%slots] * x[(s+g+b)%slots]
				}
			}
		}
		return w
	}
	dir := t.TempDir()
	run := func(pv [][]float64, opts string) (*ptStoreStats, []float64) {
		t.Helper()
		out, err := Run(plan, packVecs(x), packVecs(pv...), opts)
		if err != nil {
			t.Fatal(err)
		}
		var r runResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		got, w := decodeOut(t, r.Outputs[0].Data), want(pv)
		var worst float64
		for s := range w {
			worst = math.Max(worst, math.Abs(got[s]-w[s]))
		}
		if worst > 1e-3 {
			t.Fatalf("max error %g against the plain reference (options %s)", worst, opts)
		}
		return r.Stats.PlaintextStore, got
	}
	opts := fmt.Sprintf(`{"plaintext_store": %q}`, dir)

	st, _ := run(pv, opts)
	if st == nil || st.Added != int64(len(pts)) || st.Hits != 0 || st.Entries != len(pts) {
		t.Fatalf("first call: %+v, want %d plaintexts added and no hit", st, len(pts))
	}
	limbs := int64(st.FileBytes) / int64(len(pts))
	if st.FileBytes != st.WriteBytes || limbs%(8*slots*2) != 0 {
		t.Fatalf("first call: file of %d bytes for %d plaintexts (%d written)", st.FileBytes, len(pts), st.WriteBytes)
	}

	st, _ = run(pv, opts)
	if st.Hits != int64(len(pts)) || st.Added != 0 || st.Misses != 0 || st.ReadBytes != st.FileBytes {
		t.Fatalf("second call: %+v, want every plaintext read back", st)
	}

	changed := append([][]float64{}, pv...)
	changed[5] = append([]float64{}, pv[5]...)
	changed[5][7] += 0.25
	st, _ = run(changed, opts)
	if st.Hits != int64(len(pts)-1) || st.Added != 1 || st.Entries != len(pts)+1 {
		t.Fatalf("one weight changed: %+v, want %d hits and 1 added", st, len(pts)-1)
	}

	_, setup, _, err := loadPlan(plan)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openPtStore(dir, setup.params, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	// reads slower than encoding (an encoding rate no disk reaches, judged after each
	// read): the first read is judged, the rest of the call encodes, the rates are named;
	// the next call reads again
	defer func(b int64) { storeJudgeBytes = b }(storeJudgeBytes)
	storeJudgeBytes = 1
	s.noteEncode(1e-9, 1<<40)
	st, _ = run(pv, opts)
	// (a skipped lookup encodes, with the next term where it pairs; workers running side by
	// side, at most one per giant step (three), may each read one before the first
	// judgement lands)
	if st.Hits < 1 || st.Hits > 3 || st.Skipped < 1 || st.Added != 0 || !strings.Contains(st.Slow, "MB/s") {
		t.Fatalf("slow reads: %+v, want one to three reads, the rest encoded and the rates named", st)
	}
	storeJudgeBytes = 256 << 20
	st, _ = run(pv, opts)
	if st.Hits != int64(len(pts)) || st.Slow != "" {
		t.Fatalf("the call after: %+v, want every plaintext read", st)
	}

	// a store whose file fails (closed here; a disk error) stops, and the run encodes
	s.f.Close()
	st, _ = run(pv, opts)
	if st.Hits != 0 || !strings.Contains(st.Full, "failed: reading") {
		t.Fatalf("failed store: %+v, want no hit and the failure named", st)
	}

	// another directory: another store, bounded under one plaintext: nothing added
	small := t.TempDir()
	st, _ = run(pv, fmt.Sprintf(`{"plaintext_store": %q, "plaintext_store_max_bytes": 4096}`, small))
	if st.Added != 0 || st.Hits != 0 || !strings.Contains(st.Full, "plaintext_store_max_bytes") {
		t.Fatalf("bounded store: %+v, want nothing added and the bound named", st)
	}
	for _, d := range []string{dir, small} {
		if names, err := os.ReadDir(d); err != nil || len(names) != 0 {
			t.Fatalf("the store left %d files in %s (%v)", len(names), d, err)
		}
	}
	if _, err := Run(plan, packVecs(x), packVecs(pv...), `{"plaintext_store": "/nonexistent/dir"}`); err == nil ||
		!strings.Contains(err.Error(), "plaintext_store") {
		t.Fatalf("missing directory: %v, want an error naming plaintext_store", err)
	}
}

// The serving path (Evaluate) with a plaintext cache too small to keep anything: the first
// call spills the block's plaintexts (ptQP), the second reads them all back, and a call
// under another cache key (another model) gets a store of its own.
func TestPlaintextStoreServing(t *testing.T) {
	const slots = 2048
	plan, pts := bsgsPlan()
	dir, store := t.TempDir(), t.TempDir()
	mustKeygen(t, plan, dir, "set1")
	v := randVecs(13, 1+len(pts), slots)
	x, pv := v[0], v[1:]
	want := make([]float64, slots)
	for gi, g := range []int{0, 4, 8} {
		for b := 0; b < 4; b++ {
			for s := range want {
				want[s] += pv[4*gi+b][(s+g)%slots] * x[(s+g+b)%slots]
			}
		}
	}
	ctIn, ctOut := filepath.Join(dir, "in.ct"), filepath.Join(dir, "out.ct")
	if _, err := Encrypt(plan, filepath.Join(dir, secretKeyName), packVecs(x), 1, ctIn, ""); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		key         string
		added, hits int64
	}{{"pd/w1", int64(len(pts)), 0}, {"pd/w1", 0, int64(len(pts))}, {"pd/w2", int64(len(pts)), 0}} {
		opts := fmt.Sprintf(`{"key_set_id": "set1", "cache_key": %q, "cache_bytes": 1, "plaintext_store": %q}`, c.key, store)
		out, err := Evaluate(plan, filepath.Join(dir, evalDirName), ctIn, 1, packVecs(pv...), ctOut, opts)
		if err != nil {
			t.Fatal(err)
		}
		var vr evaluateResult
		if err := json.Unmarshal([]byte(out), &vr); err != nil {
			t.Fatal(err)
		}
		if st := vr.PlaintextStore; st == nil || st.Added != c.added || st.Hits != c.hits || vr.CachedBytes != 0 {
			t.Fatalf("call %d (%s): store %+v, cached %d bytes; want %d added, %d hits", i, c.key, st, vr.CachedBytes, c.added, c.hits)
		}
		out, err = Decrypt(plan, filepath.Join(dir, secretKeyName), ctOut, 0, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		var dr decryptResult
		_ = json.Unmarshal([]byte(out), &dr)
		got := decodeOut(t, dr.Samples[0][0].Data)
		for s := range want {
			if math.Abs(got[s]-want[s]) > 1e-3 {
				t.Fatalf("call %d: slot %d is %g, want %g", i, s, got[s], want[s])
			}
		}
	}
}
