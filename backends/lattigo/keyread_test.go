package slotlattigo

import (
	"bufio"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

func keyReadParams(t *testing.T) ckks.Parameters {
	t.Helper()
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{
		LogN: 12, LogQ: []int{55, 40, 40, 40, 40}, LogP: []int{50, 50}, LogDefaultScale: 40})
	if err != nil {
		t.Fatal(err)
	}
	return params
}

// readWithLattigo reads a key file with Lattigo's own ReadFrom (the reference decoding).
func readWithLattigo[T any, P interface {
	*T
	ReadFrom(r io.Reader) (int64, error)
}](t *testing.T, path string) *T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	obj := new(T)
	if _, err := P(obj).ReadFrom(bufio.NewReaderSize(f, 1<<20)); err != nil {
		t.Fatal(err)
	}
	return obj
}

// A key file read by readKeyFile (into a new key; into a key read before, of the same
// shape: its limbs, or of another; the big-endian path) equals Lattigo's own decoding of
// it, for Galois, relinearisation and evaluation keys.
func TestReadKeyFileMatchesLattigo(t *testing.T) {
	params := keyReadParams(t)
	sh := shapeOf(params.N(), params.QCount(), params.PCount())
	kgen := rlwe.NewKeyGenerator(params)
	sk := kgen.GenSecretKeyNew()
	dir := t.TempDir()
	lp := params.MaxLevelP()
	write := func(name string, obj io.WriterTo) string {
		path := filepath.Join(dir, name)
		if err := writeKeyFile(path, obj); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var galPaths []string
	for _, lq := range []int{4, 4, 1} {
		gk := kgen.GenGaloisKeyNew(params.GaloisElement(len(galPaths)+1), sk, rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &lp})
		galPaths = append(galPaths, write(filepath.Base(t.Name())+string(rune('a'+len(galPaths))), gk))
	}
	lq2 := 2
	rlk := kgen.GenRelinearizationKeyNew(sk, rlwe.EvaluationKeyParameters{LevelQ: &lq2, LevelP: &lp})
	rlkPath := write("relin.key", rlk)
	evk := kgen.GenEvaluationKeyNew(sk, kgen.GenSecretKeyNew())
	evkPath := write("evk.key", evk)

	for _, swap := range []bool{false, true} {
		forceSwapKeyWords = swap
		for i, path := range galPaths {
			want := readWithLattigo[rlwe.GaloisKey](t, path)
			got := new(rlwe.GaloisKey)
			n, err := readKeyFile(path, got, sh)
			if err != nil || n != int64(want.BinarySize()) || !got.Equal(&want.GadgetCiphertext) {
				t.Fatalf("swap %v key %d (new): err %v, %d bytes, equal %v", swap, i, err, n, got.Equal(&want.GadgetCiphertext))
			}
			if got.GaloisElement != want.GaloisElement || got.NthRoot != want.NthRoot {
				t.Fatalf("header %d/%d, want %d/%d", got.GaloisElement, got.NthRoot, want.GaloisElement, want.NthRoot)
			}
			// into the limbs of another key read before: the same shape (keys 0 and 1: no new
			// limb, the same memory) or another one (key 2 into key 0)
			into := readWithLattigo[rlwe.GaloisKey](t, galPaths[(i+1)%2])
			first := &into.Value[0][0][0].Q.Coeffs[0][0]
			if _, err := readKeyFile(path, into, sh); err != nil || !into.Equal(&want.GadgetCiphertext) {
				t.Fatalf("swap %v key %d (into a key read before): err %v", swap, i, err)
			}
			if i < 2 && &into.Value[0][0][0].Q.Coeffs[0][0] != first {
				t.Fatalf("key %d read into a key of its shape did not reuse its limbs", i)
			}
			if into.BinarySize() != want.BinarySize() {
				t.Fatalf("key %d read into another: %d bytes, want %d", i, into.BinarySize(), want.BinarySize())
			}
		}
		if !swap {
			// mapped (pagecache.go): the same key, its limbs inside the mapping, and after
			// the unmapping the store counts it
			for i, path := range galPaths {
				want := readWithLattigo[rlwe.GaloisKey](t, path)
				got, mapping, err := mapKeyFile(path, sh)
				if err != nil || !got.Equal(&want.GadgetCiphertext) || got.GaloisElement != want.GaloisElement ||
					got.NthRoot != want.NthRoot || len(mapping) != want.BinarySize() {
					t.Fatalf("mapped key %d: err %v", i, err)
				}
				limb := uintptr(unsafe.Pointer(&got.Value[0][0][0].Q.Coeffs[0][0]))
				if base := uintptr(unsafe.Pointer(&mapping[0])); limb < base || limb >= base+uintptr(len(mapping)) {
					t.Fatalf("mapped key %d: its first limb is not in the mapping", i)
				}
				st := &keyStore{}
				st.unmapKey(mapping)
				if st.cache.unmapped.Load() != 1 {
					t.Fatalf("unmapped %d", st.cache.unmapped.Load())
				}
			}
		}
		gotR := new(rlwe.RelinearizationKey)
		if _, err := readKeyFile(rlkPath, gotR, sh); err != nil || !gotR.Equal(&rlk.GadgetCiphertext) {
			t.Fatalf("relinearisation key: %v", err)
		}
		gotE := new(rlwe.EvaluationKey)
		if _, err := readKeyFile(evkPath, gotE, sh); err != nil || !gotE.Equal(&evk.GadgetCiphertext) {
			t.Fatalf("evaluation key: %v", err)
		}
	}
	forceSwapKeyWords = false
}

// A truncated, extended or reshaped key file is an error naming what is wrong (never a
// panic), through either path of the reader and through the key store.
func TestReadKeyFileRejectsCorruptFiles(t *testing.T) {
	params := keyReadParams(t)
	sh := shapeOf(params.N(), params.QCount(), params.PCount())
	kgen := rlwe.NewKeyGenerator(params)
	sk := kgen.GenSecretKeyNew()
	dir := t.TempDir()
	gk := kgen.GenGaloisKeyNew(params.GaloisElement(1), sk)
	path := filepath.Join(dir, "k.key")
	if err := writeKeyFile(path, gk); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := func(b []byte, off int, v uint64) []byte {
		c := append([]byte(nil), b...)
		for i := 0; i < 8; i++ {
			c[off+i] = byte(v >> (8 * i))
		}
		return c
	}
	cases := map[string][]byte{
		"truncated by a word":    good[:len(good)-8],
		"truncated by a byte":    good[:len(good)-1],
		"a word too many":        append(append([]byte(nil), good...), make([]byte, 8)...),
		"empty":                  {},
		"huge RNS decomposition": le(good, 24, 1<<40),
		"limb of another N":      le(good, 56, uint64(params.N()/2)),
	}
	for name, data := range cases {
		bad := filepath.Join(dir, "bad.key")
		if err := os.WriteFile(bad, data, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, into := range []*rlwe.GaloisKey{new(rlwe.GaloisKey), readWithLattigo[rlwe.GaloisKey](t, path)} {
			if _, err := readKeyFile(bad, into, sh); err == nil {
				t.Errorf("%s (into a key with limbs %v): no error", name, len(into.Value) > 0)
			}
		}
		if _, mapping, err := mapKeyFile(bad, sh); err == nil || mapping != nil {
			t.Errorf("%s (mapped): no error", name)
		}
	}
	s := &keyStore{dir: dir, params: params, shape: sh}
	if err := os.WriteFile(filepath.Join(dir, "bad.key"), good[:100], 0o600); err != nil {
		t.Fatal(err)
	}
	err = s.readInto("bad.key", new(rlwe.GaloisKey), readPlan)
	if err == nil || !strings.Contains(err.Error(), "corrupt or truncated") {
		t.Errorf("store: %v", err)
	}
	if err = s.readInto("missing.key", new(rlwe.GaloisKey), readPlan); err == nil || !strings.Contains(err.Error(), "cannot read key file") {
		t.Errorf("store, missing file: %v", err)
	}
	if _, _, err = s.mapStreamKey("bad.key"); err == nil || !strings.Contains(err.Error(), "corrupt or truncated") {
		t.Errorf("store, mapped: %v", err)
	}
	if _, _, err = s.mapStreamKey("missing.key"); err == nil || !strings.Contains(err.Error(), "cannot read key file") {
		t.Errorf("store, mapped, missing file: %v", err)
	}
}

// The store reads a load into the key dropped last when it has the key's shape (its
// memory, no new key); it keeps at most that one dropped key, and a load of another shape
// lets go of it. The bytes it counts resident do not change. In line and prefetched alike.
func TestKeyStoreReusesDroppedKeys(t *testing.T) {
	params := keyReadParams(t)
	c := newClient(params)
	dir := t.TempDir()
	if _, _, _, err := c.writeKeys(dir, []int{1, 2, 3}, false, params.MaxLevel(), map[int]int{3: 2}); err != nil {
		t.Fatal(err)
	}
	for _, prefetch := range []bool{false, true} {
		s, err := openKeyStore(dir, params)
		if err != nil {
			t.Fatal(err)
		}
		if prefetch {
			s.enablePrefetch()
		}
		get := func(k int) *rlwe.GaloisKey {
			t.Helper()
			gk, err := s.GetGaloisKey(galoisOf(params, k))
			if err != nil {
				t.Fatal(err)
			}
			want := readWithLattigo[rlwe.GaloisKey](t, filepath.Join(dir, "rot_"+string(rune('0'+k))+".key"))
			if !gk.Equal(&want.GadgetCiphertext) || gk.GaloisElement != galoisOf(params, k) {
				t.Fatalf("prefetch %v: key %d differs from the file", prefetch, k)
			}
			return gk
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(s.load(1))
		gk1 := get(1)
		bytes1 := s.residentBytes
		s.drop(1)
		must(s.load(2)) // same shape: into key 1's memory
		if gk2 := get(2); gk2 != gk1 || s.keysReused != 1 || s.residentBytes != bytes1 {
			t.Fatalf("prefetch %v: load 2 after drop 1: same key %v, reused %d, resident %d (want %d)",
				prefetch, gk2 == gk1, s.keysReused, s.residentBytes, bytes1)
		}
		s.drop(2)
		must(s.load(3)) // level 2: another shape; the free key is let go
		if get(3) == gk1 || s.keysReused != 1 || s.free != nil {
			t.Fatalf("prefetch %v: a load of another shape reused a key or kept the free key", prefetch)
		}
		must(s.load(1))
		gk1 = get(1)
		s.drop(1)
		s.drop(3) // replaces key 1 as the free key
		must(s.load(2))
		if get(2) == gk1 || s.keysReused != 1 {
			t.Fatalf("prefetch %v: more than one dropped key kept", prefetch)
		}
		s.drop(2)
		if s.residentBytes != 0 || s.peakBytes != bytes1+int64(s.manifest.Rotations[2].Bytes) {
			t.Fatalf("prefetch %v: resident %d, peak %d (want 0, %d)", prefetch, s.residentBytes, s.peakBytes, bytes1)
		}
		s.stopPrefetch()
	}
}

// A scheduled plan gives the same outputs, loads and peaks (keys, tracked bytes) with the
// free key as with Lattigo's reader (SLOTPLAN_KEY_READ=lattigo), in line and prefetched;
// each load after a drop reads into the dropped key: four of the timed run's five loads
// (its first into the key BenchPlan's untimed first run dropped last).
func TestKeyReuseKeepsAccounting(t *testing.T) {
	const slots = 2048
	x := make([]float64, slots)
	for i := range x {
		x[i] = float64(i%97)/50 - 1
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
	    {"op": "rot", "dst": "c3", "src": "c2", "k": 7},
	    {"op": "load_key", "k": 9},
	    {"op": "drop_key", "k": 7},
	    {"op": "load_key", "k": 11},
	    {"op": "rot", "dst": "c4", "src": "c3", "k": 9},
	    {"op": "rot", "dst": "c5", "src": "c4", "k": 11},
	    {"op": "drop_key", "k": 9},
	    {"op": "drop_key", "k": 11},
	    {"op": "output", "src": "c5", "tensor": "y", "table": "out/y"}
	  ]}`
	type res struct {
		Outputs []outputRecord `json:"outputs"`
		Stats   map[string]any `json:"stats"`
	}
	run := func(prefetch bool, reader string) res {
		t.Setenv("SLOTPLAN_KEY_READ", reader)
		opt, _ := json.Marshal(map[string]any{"prefetch": prefetch, "gc_percent": 10})
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
	for _, prefetch := range []bool{false, true} {
		a, b := run(prefetch, "lattigo"), run(prefetch, "")
		if a.Stats["key_loads_reused"] != float64(0) || b.Stats["key_loads_reused"] != float64(4) {
			t.Errorf("prefetch %v: loads reused %v with Lattigo's reader (want 0), %v with the free key (want 4)",
				prefetch, a.Stats["key_loads_reused"], b.Stats["key_loads_reused"])
		}
		if c := b.Stats["key_load_cpu_seconds"].(float64); c <= 0 || c > 10 {
			t.Errorf("prefetch %v: key_load_cpu_seconds %v", prefetch, c)
		}
		for _, f := range []string{"key_loads", "key_load_bytes", "peak_key_bytes", "peak_resident_keys", "peak_tracked_bytes"} {
			if a.Stats[f] != b.Stats[f] || a.Stats[f] == nil {
				t.Errorf("prefetch %v: %s %v with Lattigo's reader, %v with the free list", prefetch, f, a.Stats[f], b.Stats[f])
			}
		}
		ga, gb := decodeOut(t, a.Outputs[0].Data), decodeOut(t, b.Outputs[0].Data)
		for s := 0; s < slots; s++ {
			want := x[(s+35)%slots]
			if math.Abs(ga[s]-want) > 1e-5 || math.Abs(gb[s]-want) > 1e-5 {
				t.Fatalf("prefetch %v, slot %d: %g / %g, want %g", prefetch, s, ga[s], gb[s], want)
			}
		}
	}
}
