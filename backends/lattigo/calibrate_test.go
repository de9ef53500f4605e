package slotlattigo

import "testing"

// The block calibration's keys reach the working set (256 MiB) within [hoist batch, 64].
func TestBlockOffsets(t *testing.T) {
	for _, c := range []struct{ batch, keyBytes, want int }{
		{8, 2621984, 64},    // log N 13: 103 keys would reach 256 MiB; capped at 64
		{8, 23600000, 12},   // log N 14: 12 keys of 23.6 MB
		{8, 157286400, 8},   // 150 MiB keys: the hoist batch already leaves the caches
		{16, 100 << 20, 16}, // never fewer than the hoist batch
	} {
		got := blockOffsets(c.batch, c.keyBytes)
		if len(got) != c.want || got[0] != 1 || got[len(got)-1] != c.want {
			t.Errorf("blockOffsets(%d, %d) = %d offsets (%v..), want 1..%d", c.batch, c.keyBytes, len(got), got[0], c.want)
		}
	}
}
