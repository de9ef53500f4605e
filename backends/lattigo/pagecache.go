package slotlattigo

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// Key reads and the page cache (docs/lattigo.md, "Streamed keys mapped, not copied").
//
// Storage reads. Each key read counts the bytes its thread made the kernel fetch from
// storage (/proc/thread-self/io read_bytes: the page cache did not hold them), by what was
// read (stats key_storage_read_bytes: the plan's keys, the block's keys read when it is
// loaded, its streamed keys).
//
// Mapped streamed keys. A streamed bootstrapping block reads its Galois keys again in every
// bootstrap: ResNet-20 at n16boot read 521 keys of 157 MB (82 GB) in one evaluation, ~40 s
// of reading on the evaluation's one core (25 s of it CPU), most of it copying pages the
// kernel already held. Mapped, the reading CPU is 12 s; the evaluation's wall time did not
// move beyond the runs' spread (docs/model-bench.md, session 26).
// A streamed key is now mapped instead (mmap of its file, read-only, MAP_POPULATE: the
// kernel maps the cached pages, or reads them first, in the one system call of the reading
// goroutine): its limbs are slices of the mapping, the bytes are the page cache's own and
// nothing is copied. The key file's limbs lie in it as in memory on a little-endian host
// (keyread.go), so the same decoder walks the mapping and checks the same shape. The
// mapping is unmapped when the stream lets go of the key (the bootstrap asked for the next
// one: the evaluation is one goroutine, so the rotation that used it has finished), where
// the copying stream read the next key into its memory instead. Lattigo only reads a key:
// the mapping is read-only, so a write would fault rather than change a file.
//
// SLOTPLAN_KEY_MAP=off (or SLOTPLAN_KEY_READ=lattigo, or a big-endian host) copies as
// before: the A/B switch.

// key read categories (cacheAccount.diskBytes)
const (
	readPlan   = iota // the plan's rotation keys and the relinearisation key
	readBlock         // the block's keys read when it is loaded
	readStream        // a streamed block's Galois keys, read during bootstraps
	readCategories
)

var readCategoryNames = [readCategories]string{"plan_keys", "block_keys", "block_stream"}

// keyMapOff: SLOTPLAN_KEY_MAP=off (streamed keys copied, not mapped).
func keyMapOff() bool {
	return os.Getenv("SLOTPLAN_KEY_MAP") == "off"
}

// threadStorageReadBytes is the calling OS thread's read_bytes (/proc/thread-self/io: the
// bytes it made the kernel fetch from storage), or -1 where the kernel does not say. The
// caller holds its OS thread (runtime.LockOSThread) between two readings.
func threadStorageReadBytes() int64 {
	data, err := os.ReadFile("/proc/thread-self/io")
	if err != nil {
		return -1
	}
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		if v, ok := bytes.CutPrefix(line, []byte("read_bytes:")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// cacheAccount is the store's storage-read bookkeeping (shared with its reading goroutines).
type cacheAccount struct {
	diskBytes [readCategories]atomic.Int64
	uncounted atomic.Bool  // the kernel did not say for some read
	mapped    atomic.Int64 // streamed keys mapped
	unmapped  atomic.Int64 // of them unmapped again
}

// storageReadBytes is key_storage_read_bytes (nil where the kernel does not count).
func (c *cacheAccount) storageReadBytes() map[string]int64 {
	if c.uncounted.Load() {
		return nil
	}
	out := map[string]int64{}
	for i, name := range readCategoryNames {
		out[name] = c.diskBytes[i].Load()
	}
	return out
}

// countRead adds the storage bytes between two readings of the thread's counter.
func (c *cacheAccount) countRead(cat int, b0, b1 int64) {
	if b0 < 0 || b1 < b0 {
		c.uncounted.Store(true)
		return
	}
	c.diskBytes[cat].Add(b1 - b0)
}

// mapDecoder walks a key file mapped in memory: words are read from it, limbs are slices
// of it (little-endian hosts only).
type mapDecoder struct {
	b   []byte
	off int
}

func (d *mapDecoder) word() (uint64, error) {
	if d.off+8 > len(d.b) {
		return 0, io.ErrUnexpectedEOF
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v, nil
}

func (d *mapDecoder) limb(_ []uint64, n int) ([]uint64, error) {
	if n == 0 {
		return []uint64{}, nil
	}
	if d.off+8*n > len(d.b) {
		return nil, io.ErrUnexpectedEOF
	}
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&d.b[d.off])), n)
	d.off += 8 * n
	return w, nil
}

// mapKeyFile maps a key file and decodes a Galois key whose limbs lie in the mapping. The
// caller unmaps the returned mapping (unmapKey) once the key is no longer used.
func mapKeyFile(path string, sh keyShape) (*rlwe.GaloisKey, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := fi.Size()
	if size <= 0 || size > 1<<40 {
		return nil, nil, fmt.Errorf("%w: %d bytes", errKeyShape, size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot map key file: %w", err)
	}
	gk := new(rlwe.GaloisKey)
	d := &mapDecoder{b: b}
	if err := decodeKey(d, gk, sh); err != nil {
		_ = syscall.Munmap(b)
		return nil, nil, err
	}
	if d.off != len(b) {
		_ = syscall.Munmap(b)
		return nil, nil, fmt.Errorf("%w: bytes after the key", errKeyShape)
	}
	return gk, b, nil
}

// mapStreamKey maps a streamed block key (the stream's reader or an in-line read), with
// the store's accounting of reads; it may run on the stream's reading goroutine.
func (s *keyStore) mapStreamKey(name string) (gk *rlwe.GaloisKey, mapping []byte, err error) {
	err = s.accountedRead(filepath.Join(s.dir, name), readStream, func() (int64, error) {
		var err error
		gk, mapping, err = mapKeyFile(filepath.Join(s.dir, name), s.shape)
		return int64(len(mapping)), err
	})
	if err != nil {
		return nil, nil, err
	}
	s.cache.mapped.Add(1)
	return gk, mapping, nil
}

// unmapKey lets go of a mapped key's memory (the key must not be used again).
func (s *keyStore) unmapKey(mapping []byte) {
	if mapping == nil {
		return
	}
	_ = syscall.Munmap(mapping)
	s.cache.unmapped.Add(1)
}

// mapsStreamedKeys: whether the stream maps its keys (little-endian host, not switched off).
func (s *keyStore) mapsStreamedKeys() bool {
	return hostLittleEndian && !forceSwapKeyWords && !s.lattigoRead && !s.mapOff
}
