package slotlattigo

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCinsPlanFiles runs a packed plan (SLOTPLAN_RUN_DIR: plan.json, inputs.bin, pts.bin, as
// backends.lattigo_backend.pack_vectors writes them) through Run and writes result.json
// into SLOTPLAN_RUN_OUT (compared with numpy on the Python side). Skipped without them.
func TestCinsPlanFiles(t *testing.T) {
	dir, out := os.Getenv("SLOTPLAN_RUN_DIR"), os.Getenv("SLOTPLAN_RUN_OUT")
	if dir == "" || out == "" {
		t.Skip("SLOTPLAN_RUN_DIR / SLOTPLAN_RUN_OUT not set")
	}
	plan, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	ins, err := os.ReadFile(filepath.Join(dir, "inputs.bin"))
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.ReadFile(filepath.Join(dir, "pts.bin"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(string(plan), ins, pts, "{}")
	if err != nil {
		t.Fatal(err)
	}
	if err = os.WriteFile(out, []byte(res), 0o644); err != nil {
		t.Fatal(err)
	}
}
