#include "textflag.h"

// 52-bit Montgomery products with AVX-512 IFMA, 8 coefficients per step. For x < 2q, y < q,
// q < 2^51 (MaxIFMAModulus): lo = x*y mod 2^52; m = lo*qinv mod 2^52 (qinv = q^-1 mod 2^52);
// r = floor(x*y/2^52) - floor(m*q/2^52) + q, in (0, 2q) and = x*y*2^-52 mod q. Both
// ciphertext polynomials share the plaintext's load. Go's operand order: src2, src1, dst.

#define PROD(W, A, ACC, T1, T2) \
	VPXORQ T1, T1, T1; \
	VPMADD52LUQ W, A, T1; \
	VPMADD52HUQ W, A, ACC; \
	VPXORQ T2, T2, T2; \
	VPMADD52LUQ Z31, T1, T2; \
	VPXORQ T1, T1, T1; \
	VPMADD52HUQ Z30, T2, T1; \
	VPADDQ Z30, ACC, ACC; \
	VPSUBQ T1, ACC, ACC

#define LOAD_ARGS \
	MOVQ acc0+0(FP), DI; \
	MOVQ acc1+8(FP), SI; \
	MOVQ a0+16(FP), R8; \
	MOVQ a1+24(FP), R9; \
	MOVQ w+32(FP), R10; \
	MOVQ n+40(FP), CX; \
	MOVQ q+48(FP), AX; \
	VPBROADCASTQ AX, Z30; \
	MOVQ qinv+56(FP), AX; \
	VPBROADCASTQ AX, Z31; \
	XORQ BX, BX

// one step: 8 coefficients of both products, added to Z4, Z5 and stored; flags for JLT
#define STEP \
	VMOVDQU64 (R10)(BX*8), Z1; \
	VMOVDQU64 (R8)(BX*8), Z2; \
	VMOVDQU64 (R9)(BX*8), Z3; \
	PROD(Z1, Z2, Z4, Z6, Z7); \
	PROD(Z1, Z3, Z5, Z8, Z9); \
	VMOVDQU64 Z4, (DI)(BX*8); \
	VMOVDQU64 Z5, (SI)(BX*8); \
	ADDQ $8, BX; \
	CMPQ BX, CX

// func mulAddLazy52(acc0, acc1, a0, a1, w *uint64, n int, q, qinv uint64)
// acc{0,1}[i] += r(a{0,1}[i], w[i]) for i < n (n a positive multiple of 8)
TEXT ·mulAddLazy52(SB), NOSPLIT, $0-64
	LOAD_ARGS
addloop:
	VMOVDQU64 (DI)(BX*8), Z4
	VMOVDQU64 (SI)(BX*8), Z5
	STEP
	JLT addloop
	VZEROUPPER
	RET

// func mulLazy52(acc0, acc1, a0, a1, w *uint64, n int, q, qinv uint64)
// acc{0,1}[i] = r(a{0,1}[i], w[i]) for i < n (n a positive multiple of 8)
TEXT ·mulLazy52(SB), NOSPLIT, $0-64
	LOAD_ARGS
setloop:
	VPXORQ Z4, Z4, Z4
	VPXORQ Z5, Z5, Z5
	STEP
	JLT setloop
	VZEROUPPER
	RET
