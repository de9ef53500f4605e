package slotlattigo

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
)

// Reading key files (docs/lattigo.md, "Loading a key").
//
// A key file is what Lattigo's WriteTo writes: a GaloisKey is its Galois element, its
// NthRoot and a GadgetCiphertext; a GadgetCiphertext (also a relinearisation key and an
// evaluation key) its base-2 decomposition and a matrix of vectors of QP polynomials; every
// length is a uint64 written before what it counts, every coefficient a little-endian
// uint64. So the whole file is a sequence of little-endian words, and a limb's N
// coefficients lie in the file exactly as they lie in memory on a little-endian machine.
//
// Lattigo's ReadFrom copies the file through a buffer and decodes it word by word into
// slices it allocates (one per limb). readKeyFile reads each limb's bytes straight into the
// limb (one io.ReadFull per limb, the kernel's copy the only one): into the limbs the key
// has already (the store's free key, a streamed block key the bootstrap finished with: no
// allocation at all), else into limbs it allocates one by one as Lattigo does. The
// lengths are read through a small buffer. On a big-endian machine each limb's words are
// swapped in place after the read.
//
// SLOTPLAN_KEY_READ=lattigo reads with Lattigo's ReadFrom through a 1 MiB buffer (the
// reader before 2026-11-26) and turns the store's free list off: the A/B switch.

// hostLittleEndian: the machine stores a uint64 as the file does.
var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// forceSwapKeyWords makes the reader take the big-endian path (tests).
var forceSwapKeyWords = false

// lattigoKeyReader: SLOTPLAN_KEY_READ=lattigo (read as Lattigo does, no reuse).
func lattigoKeyReader() bool {
	return os.Getenv("SLOTPLAN_KEY_READ") == "lattigo"
}

// errKeyShape: the file does not hold a key of the expected shape.
var errKeyShape = errors.New("not a key of these parameters")

// keyShape bounds what a key file of the parameters may hold.
type keyShape struct {
	n          int // coefficients per limb
	maxQ, maxP int // limbs of Q and P
}

// keyDecoder yields a key file's words: the lengths and the limbs.
type keyDecoder interface {
	word() (uint64, error)
	// limb returns n coefficients read from the file: into dst when its capacity holds n,
	// else into a new slice.
	limb(dst []uint64, n int) ([]uint64, error)
}

// streamDecoder reads a key from a reader; limbs are read straight into their memory.
type streamDecoder struct {
	r    *bufio.Reader
	b    [8]byte
	read int64
}

func (d *streamDecoder) word() (uint64, error) {
	if _, err := io.ReadFull(d.r, d.b[:]); err != nil {
		return 0, unexpected(err)
	}
	d.read += 8
	return binary.LittleEndian.Uint64(d.b[:]), nil
}

func (d *streamDecoder) limb(dst []uint64, n int) ([]uint64, error) {
	if cap(dst) >= n {
		dst = dst[:n]
	} else {
		dst = make([]uint64, n)
	}
	if n == 0 {
		return dst, nil
	}
	if _, err := io.ReadFull(d.r, unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 8*n)); err != nil {
		return nil, unexpected(err)
	}
	d.read += int64(8 * n)
	swapWords(dst)
	return dst, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// swapWords turns words read as little-endian bytes into the host's order (a no-op on a
// little-endian host).
func swapWords(w []uint64) {
	if hostLittleEndian && !forceSwapKeyWords {
		return
	}
	for i, x := range w {
		var b [8]byte
		*(*uint64)(unsafe.Pointer(&b[0])) = x // the bytes as they came from the file
		w[i] = binary.LittleEndian.Uint64(b[:])
	}
}

// bounded reads a length and checks it is in [lo, hi].
func bounded(d keyDecoder, what string, lo, hi int) (int, error) {
	v, err := d.word()
	if err != nil {
		return 0, err
	}
	if v < uint64(lo) || v > uint64(hi) {
		return 0, fmt.Errorf("%w: %s %d outside [%d, %d]", errKeyShape, what, v, lo, hi)
	}
	return int(v), nil
}

// decodePoly reads a ring.Poly (a matrix of limbs) into p, reusing its limbs.
func decodePoly(d keyDecoder, p *ring.Poly, sh keyShape, maxLimbs int) error {
	limbs, err := bounded(d, "limb count", 0, maxLimbs)
	if err != nil {
		return err
	}
	if cap(p.Coeffs) < limbs {
		p.Coeffs = make([][]uint64, limbs)
	}
	p.Coeffs = p.Coeffs[:limbs]
	for i := range p.Coeffs {
		if _, err := bounded(d, "limb size", sh.n, sh.n); err != nil {
			return err
		}
		if p.Coeffs[i], err = d.limb(p.Coeffs[i], sh.n); err != nil {
			return err
		}
	}
	return nil
}

// decodeGadget reads a GadgetCiphertext into ct, reusing its polynomials.
func decodeGadget(d keyDecoder, ct *rlwe.GadgetCiphertext, sh keyShape) error {
	base2, err := d.word()
	if err != nil {
		return err
	}
	if base2 > 64 {
		return fmt.Errorf("%w: base-2 decomposition %d", errKeyShape, base2)
	}
	ct.BaseTwoDecomposition = int(base2)
	rows, err := bounded(d, "RNS decomposition size", 0, sh.maxQ)
	if err != nil {
		return err
	}
	if cap(ct.Value) < rows {
		ct.Value = make([][]rlwe.VectorQP, rows)
	}
	ct.Value = ct.Value[:rows]
	for i := range ct.Value {
		cols, err := bounded(d, "base-2 decomposition size", 0, 64)
		if err != nil {
			return err
		}
		if cap(ct.Value[i]) < cols {
			ct.Value[i] = make([]rlwe.VectorQP, cols)
		}
		ct.Value[i] = ct.Value[i][:cols]
		for j := range ct.Value[i] {
			deg, err := bounded(d, "ciphertext degree + 1", 0, 3)
			if err != nil {
				return err
			}
			v := ct.Value[i][j]
			if cap(v) < deg {
				v = make(rlwe.VectorQP, deg)
			}
			v = v[:deg]
			for k := range v {
				if err := decodePoly(d, &v[k].Q, sh, sh.maxQ); err != nil {
					return err
				}
				if err := decodePoly(d, &v[k].P, sh, sh.maxP); err != nil {
					return err
				}
			}
			ct.Value[i][j] = v
		}
	}
	return nil
}

// gadgetOf returns the GadgetCiphertext a key object holds after its header words (the
// Galois element and NthRoot of a GaloisKey), or nil for another type.
func gadgetOf(obj any) (ct *rlwe.GadgetCiphertext, galois *rlwe.GaloisKey) {
	switch o := obj.(type) {
	case *rlwe.GaloisKey:
		return &o.GadgetCiphertext, o
	case *rlwe.RelinearizationKey:
		return &o.GadgetCiphertext, nil
	case *rlwe.EvaluationKey:
		return &o.GadgetCiphertext, nil
	}
	return nil, nil
}

func decodeKey(d keyDecoder, obj any, sh keyShape) error {
	ct, gk := gadgetOf(obj)
	if gk != nil {
		var err error
		if gk.GaloisElement, err = d.word(); err != nil {
			return err
		}
		if gk.NthRoot, err = d.word(); err != nil {
			return err
		}
	}
	return decodeGadget(d, ct, sh)
}

// readKeyFile reads a key file into obj (a *rlwe.GaloisKey, *rlwe.RelinearizationKey or
// *rlwe.EvaluationKey) and returns the bytes read. A file that is not a whole key of the
// shape's parameters is an error (obj is then unspecified).
func readKeyFile(path string, obj any, sh keyShape) (int64, error) {
	ct, _ := gadgetOf(obj)
	if ct == nil {
		return 0, fmt.Errorf("cannot read a %T from a key file", obj)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// limb by limb: into the key's limbs when it has them, else into limbs allocated one by
	// one as Lattigo allocates them (one contiguous allocation per key read 35-70 MB more
	// peak RSS in LeNet-5's capped run at n14boot: large spans of several sizes fragment)
	d := &streamDecoder{r: bufio.NewReaderSize(f, 4096)}
	if err := decodeKey(d, obj, sh); err != nil {
		return d.read, err
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		return d.read, fmt.Errorf("%w: bytes after the key", errKeyShape)
	}
	return d.read, nil
}

// shapeOf is the key shape of parameters with N coefficients, qCount and pCount primes.
func shapeOf(n, qCount, pCount int) keyShape {
	return keyShape{n: n, maxQ: qCount, maxP: pCount}
}
