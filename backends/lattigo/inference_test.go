package slotlattigo

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// splitPlan: rotation, plaintext product, ct-ct product (relinearisation key), polynomial.
const splitPlan = `{"schema": "slotplan.plan/1", "params": ` + testParams + `,
	  "plaintexts": {"p0": {"source": "w", "table": "pt/p0"}},
	  "program": [
	    {"op": "input", "dst": "c0", "tensor": "x", "table": "in/x"},
	    {"op": "rot", "dst": "c1", "src": "c0", "k": 5},
	    {"op": "pmul", "dst": "c2", "src": "c1", "pt": "p0"},
	    {"op": "rescale", "dst": "c3", "src": "c2"},
	    {"op": "cmul", "dst": "c4", "a": "c3", "b": "c0"},
	    {"op": "poly", "dst": "c5", "src": "c4", "coeffs": [0.5, -1.0, 0.25]},
	    {"op": "add", "dst": "c6", "a": "c5", "b": "c0"},
	    {"op": "output", "src": "c6", "tensor": "y", "table": "out/y"}
	  ]}`

func splitWant(x, w []float64, s, slots int) float64 {
	v := x[(s+5)%slots] * w[s] * x[s]
	return 0.5 - v + 0.25*v*v + x[s]
}

func mustKeygen(t *testing.T, planJSON, dir, id string) keygenResult {
	t.Helper()
	out, err := Keygen(planJSON, dir, `{"key_set_id": "`+id+`", "plan_digest": "pd", "params_digest": "qd"}`)
	if err != nil {
		t.Fatal(err)
	}
	var r keygenResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestInferenceSplit: keys once, three samples encrypted in one file, evaluated in one call
// from the evaluation directory alone, decrypted; then a second encrypt/evaluate/decrypt
// round with the same keys; the secret key file's mode and that eval/ holds no secret.
func TestInferenceSplit(t *testing.T) {
	const slots, samples = 2048, 3
	dir := t.TempDir()
	kr := mustKeygen(t, splitPlan, dir, "set1")
	fi, err := os.Stat(filepath.Join(dir, secretKeyName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret.key: %v %v", fi, err)
	}
	if kr.RotationKeys != 1 || !kr.RelinKey || kr.EvalBytes <= 0 || kr.BytesWritten != kr.EvalBytes+kr.SecretKeyBytes {
		t.Fatalf("keygen result %+v", kr)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, evalDirName))
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(dir, evalDirName, e.Name()))
		if strings.Contains(e.Name(), "secret") || strings.HasPrefix(string(data), secretKeyMagic) {
			t.Fatalf("eval/ holds %s", e.Name())
		}
	}
	var m keyManifest
	data, _ := os.ReadFile(filepath.Join(dir, evalDirName, manifestName))
	if err := json.Unmarshal(data, &m); err != nil || m.Format != evalKeysFormat || m.KeySetID != "set1" ||
		m.Rotations[0].Kind != "rotation" || m.RelinLevel == nil {
		t.Fatalf("manifest %+v %v", m, err)
	}
	// keygen never overwrites
	if _, err := Keygen(splitPlan, dir, `{"key_set_id": "again"}`); err == nil || !strings.Contains(err.Error(), "never overwrites") {
		t.Fatalf("second keygen: %v", err)
	}
	w := randVecs(7, 1, slots)[0]
	for round := 0; round < 2; round++ {
		xs := randVecs(int64(10+round), samples, slots)
		ctIn := filepath.Join(dir, "in.ct")
		out, err := Encrypt(splitPlan, filepath.Join(dir, secretKeyName), packVecs(xs...), samples, ctIn, "")
		if err != nil {
			t.Fatal(err)
		}
		var er encryptResult
		_ = json.Unmarshal([]byte(out), &er)
		if len(er.Ciphertexts) != samples || er.Ciphertexts[0].Level != 4 || er.KeySetID != "set1" {
			t.Fatalf("encrypt %+v", er)
		}
		ctOut := filepath.Join(dir, "out.ct")
		opts := `{"key_set_id": "set1", "plan_digest": "pd", "params_digest": "qd", "cache_key": "pd/wd"}`
		out, err = Evaluate(splitPlan, filepath.Join(dir, evalDirName), ctIn, samples, packVecs(w), ctOut, opts)
		if err != nil {
			t.Fatal(err)
		}
		var vr evaluateResult
		_ = json.Unmarshal([]byte(out), &vr)
		if len(vr.Outputs) != samples || len(vr.Samples) != samples || vr.CacheHit != (round == 1) {
			t.Fatalf("evaluate %+v", vr)
		}
		out, err = Decrypt(splitPlan, filepath.Join(dir, secretKeyName), ctOut, 0, samples, "")
		if err != nil {
			t.Fatal(err)
		}
		var dr decryptResult
		_ = json.Unmarshal([]byte(out), &dr)
		for s := 0; s < samples; s++ {
			got := decodeOut(t, dr.Samples[s][0].Data)
			maxErr := 0.0
			for i := 0; i < slots; i++ {
				maxErr = math.Max(maxErr, math.Abs(got[i]-splitWant(xs[s], w, i, slots)))
			}
			if maxErr > 1e-5 {
				t.Fatalf("round %d sample %d: max abs error %g", round, s, maxErr)
			}
		}
		t.Logf("round %d: evaluate %+v", round, vr.Samples[0])
	}
}

// TestInferenceRefusals: other keys, other parameters, truncated and corrupt ciphertexts.
func TestInferenceRefusals(t *testing.T) {
	const slots = 2048
	dir := t.TempDir()
	mustKeygen(t, splitPlan, dir, "set1")
	ctIn := filepath.Join(dir, "in.ct")
	if _, err := Encrypt(splitPlan, filepath.Join(dir, secretKeyName), packVecs(randVecs(1, 1, slots)...), 1, ctIn, ""); err != nil {
		t.Fatal(err)
	}
	w := packVecs(randVecs(2, 1, slots)...)
	eval := filepath.Join(dir, evalDirName)
	ctOut := filepath.Join(dir, "out.ct")
	if _, err := Evaluate(splitPlan, eval, ctIn, 1, w, ctOut, `{"key_set_id": "other"}`); err == nil || !strings.Contains(err.Error(), "key_set_id") {
		t.Errorf("other key set: %v", err)
	}
	data, _ := os.ReadFile(ctIn)
	trunc := filepath.Join(dir, "trunc.ct")
	_ = os.WriteFile(trunc, data[:len(data)-100], 0o644)
	if _, err := Evaluate(splitPlan, eval, trunc, 1, w, ctOut, ""); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
	if _, err := Evaluate(splitPlan, eval, ctIn, 2, w, ctOut, ""); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("fewer samples than claimed: %v", err)
	}
	bad := append([]byte{}, data...)
	bad[20] ^= 0xff // inside the ciphertext's metadata
	corrupt := filepath.Join(dir, "corrupt.ct")
	_ = os.WriteFile(corrupt, bad, 0o644)
	if _, err := Evaluate(splitPlan, eval, corrupt, 1, w, ctOut, ""); err == nil {
		t.Errorf("corrupt ciphertext accepted")
	}
	// other parameters: a plan at another log_q reads neither the keys nor the secret key
	other := strings.Replace(splitPlan, `"log_q": [55, 40, 40, 40, 40]`, `"log_q": [55, 40, 40, 40]`, 1)
	if _, err := Evaluate(other, eval, ctIn, 1, w, ctOut, ""); err == nil || !strings.Contains(err.Error(), "parameters") {
		t.Errorf("other params (keys): %v", err)
	}
	if _, err := Decrypt(other, filepath.Join(dir, secretKeyName), ctIn, 0, 1, ""); err == nil {
		t.Errorf("other params (secret key) accepted")
	}
	sk := filepath.Join(dir, secretKeyName)
	skData, _ := os.ReadFile(sk)
	truncSk := filepath.Join(dir, "trunc.key")
	_ = os.WriteFile(truncSk, skData[:len(skData)-10], 0o600)
	if _, err := Decrypt(splitPlan, truncSk, ctIn, 0, 1, ""); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated secret key: %v", err)
	}
}

// secretTypePaths lists the paths through which a value of type t can reach an
// rlwe.SecretKey or the client, following struct fields, pointers, slices, arrays, maps
// and channels (statically: an interface field is listed in ifaces instead, its dynamic
// value is checked by the value walk).
func secretTypePaths(t reflect.Type, path string, seen map[reflect.Type]bool, found, ifaces *[]string) {
	skType, clientType := reflect.TypeOf(rlwe.SecretKey{}), reflect.TypeOf(client{})
	if t == skType || t == clientType {
		*found = append(*found, path)
		return
	}
	if seen[t] {
		return
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
		secretTypePaths(t.Elem(), path+"*", seen, found, ifaces)
	case reflect.Map:
		secretTypePaths(t.Key(), path+"[key]", seen, found, ifaces)
		secretTypePaths(t.Elem(), path+"[]", seen, found, ifaces)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			secretTypePaths(f.Type, path+"."+t.Name()+"."+f.Name, seen, found, ifaces)
		}
	case reflect.Interface:
		*ifaces = append(*ifaces, path+" ("+t.String()+")")
	}
}

// TestEvaluatorReachesNoSecret: the evaluator's types cannot hold a secret key or the
// client. The only rlwe.SecretKey field in the type graph is Lattigo's own debugging hook
// bootstrapping.Evaluator.SkDebug (set by nothing here; the value walk checks it is nil);
// interface-typed fields are followed on a live evaluator after an evaluation.
func TestEvaluatorReachesNoSecret(t *testing.T) {
	var found, ifaces []string
	secretTypePaths(reflect.TypeOf(evaluator{}), "evaluator", map[reflect.Type]bool{}, &found, &ifaces)
	for _, p := range found {
		if !strings.HasSuffix(p, ".Evaluator.SkDebug*") {
			t.Errorf("the evaluator's types reach a secret: %s", p)
		}
	}
	t.Logf("secret-typed fields (Lattigo's debug hook only): %v; interface fields (checked by value): %d", found, len(ifaces))

	const slots = 2048
	dir := t.TempDir()
	mustKeygen(t, splitPlan, dir, "set1")
	ctIn := filepath.Join(dir, "in.ct")
	if _, err := Encrypt(splitPlan, filepath.Join(dir, secretKeyName), packVecs(randVecs(1, 1, slots)...), 1, ctIn, ""); err != nil {
		t.Fatal(err)
	}
	p, setup, _, err := loadPlan(splitPlan)
	if err != nil {
		t.Fatal(err)
	}
	ev, _, err := newEvaluator(filepath.Join(dir, evalDirName), setup, p, map[string][]float64{"p0": randVecs(2, 1, slots)[0]}, nil, "", 0, identity{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cts, err := readFrames(ctIn, 0, 1, setup.params)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ev.evaluate(cts); err != nil {
		t.Fatal(err)
	}
	if path := secretKeyFree(reflect.ValueOf(ev), "evaluator", map[uintptr]bool{}); path != "" {
		t.Errorf("the evaluator reaches a secret key: %s", path)
	}
}
