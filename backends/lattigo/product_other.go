//go:build !amd64

package slotlattigo

// ifmaCPU: AVX-512 IFMA exists on amd64 only; elsewhere every limb takes Lattigo's path.
var ifmaCPU = false

func mulAddLazy52(acc0, acc1, a0, a1, w *uint64, n int, q, qinv uint64) {
	panic("slotlattigo: AVX-512 IFMA kernel called on a CPU without it")
}

func mulLazy52(acc0, acc1, a0, a1, w *uint64, n int, q, qinv uint64) {
	panic("slotlattigo: AVX-512 IFMA kernel called on a CPU without it")
}
