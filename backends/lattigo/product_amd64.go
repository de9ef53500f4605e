//go:build amd64

package slotlattigo

import "golang.org/x/sys/cpu"

// ifmaCPU: the CPU has AVX-512F and AVX-512 IFMA (52-bit multiply-accumulate).
var ifmaCPU = cpu.X86.HasAVX512F && cpu.X86.HasAVX512IFMA

//go:noescape
func mulAddLazy52(acc0, acc1, a0, a1, w *uint64, n int, q, qinv uint64)

//go:noescape
func mulLazy52(acc0, acc1, a0, a1, w *uint64, n int, q, qinv uint64)
