package slotlattigo

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"math/rand"
	"testing"
)

// Quick Go-side checks of the lintrans baseline and the calibration; the full tests are
// tests/test_calibrate.py.

func TestLintransMatvecSmall(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, tc := range []struct {
		n, k, dim, ratio int
		emb              string
	}{{5, 12, 0, 1, ""}, {12, 5, 0, 1, ""}, {16, 16, 2048, 1, ""}, {7, 9, 0, -1, ""}, {30, 20, 0, 0, ""},
		{5, 12, 0, 1, "hybrid"}, {12, 5, 0, 2, "hybrid"}, {3, 40, 0, 1, "hybrid"}, {40, 3, 0, -1, "hybrid"},
		{16, 64, 256, 1, "hybrid"}, {64, 16, 0, 0, "hybrid"}, {9, 9, 0, 1, "hybrid"},
		{16, 16, 0, 1, "interleaved"}, {9, 9, 0, 2, "interleaved"}, {5, 12, 0, 0, "interleaved"},
		{40, 3, 0, 1, "interleaved"}, {3, 40, 0, -1, "interleaved"}, {64, 64, 0, 3, "interleaved"}} {
		W := make([]float64, tc.n*tc.k)
		for i := range W {
			W[i] = 2*rng.Float64() - 1
		}
		x := make([]float64, tc.k)
		for i := range x {
			x[i] = 2*rng.Float64() - 1
		}
		opts, _ := json.Marshal(map[string]any{"dimension": tc.dim, "log_bsgs_ratio": tc.ratio, "embedding": tc.emb})
		res, err := LintransMatvec(testParams, packVecs(W), tc.n, tc.k, packVecs(x), string(opts))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Output string         `json:"output"`
			Stats  map[string]any `json:"stats"`
		}
		if err := json.Unmarshal([]byte(res), &out); err != nil {
			t.Fatal(err)
		}
		raw, _ := base64.StdEncoding.DecodeString(out.Output)
		y := decodeOut(t, base64.StdEncoding.EncodeToString(raw))
		if len(y) != tc.n {
			t.Fatalf("got %d outputs, want %d", len(y), tc.n)
		}
		maxErr := 0.0
		for r := 0; r < tc.n; r++ {
			want := 0.0
			for c := 0; c < tc.k; c++ {
				want += W[r*tc.k+c] * x[c]
			}
			maxErr = math.Max(maxErr, math.Abs(y[r]-want))
		}
		if maxErr > 1e-5 {
			t.Fatalf("%+v: max error %g", tc, maxErr)
		}
		t.Logf("%+v: err %.2e stats %v", tc, maxErr, out.Stats["rotations"])
	}
}

// TestCalibrateSmall: Calibrate at log N 12 returns without error. Skipped in -short (9 s of
// `make test`): tests/backends/test_calibrate.py runs the same Calibrate at log N 12 through
// the extension and checks the table it gives (every op timed, positive, written and loaded).
func TestCalibrateSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("log N 12 calibration: tests/backends/test_calibrate.py runs it in make test")
	}
	res, err := Calibrate(testParams, `{"repeat": 1}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res[:400])
}
