package slotlattigo

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring/ringqp"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
	"golang.org/x/sys/unix"
)

// Plaintext store (run option plaintext_store = a directory; docs/lattigo.md, "The
// plaintext store").
//
// A fused block whose plaintexts the memory cannot keep encodes every diagonal when its
// product needs it, in every evaluation: ResNet-20 at n16boot encodes 6,350 plaintexts of
// ~10 limbs (31 GB in NTT form) per image, 48.5 s of its ~300 s on one core (session 31's
// profile), the same plaintexts each time. The store spills each encoded plaintext to a file
// the first time and reads it back in the evaluations after: a server's model preparation,
// paid once, like the bootstrapping DFT matrices the process keeps (bootstate.go).
//
//   - Content-addressed: an entry's key is the SHA-256 of the values as the encoder takes
//     them (float64 or complex128 bytes, with their type) with the level, the P level and
//     the scale; the store belongs to one parameter set. Another model, other weights or
//     another level never read an entry they did not write.
//   - On disk only: the file is unlinked as soon as it is made (the space goes back when the
//     process ends), written with the kernel's writeback started behind the writer and the
//     written pages dropped from the page cache, and read with readahead issued ahead of the
//     reader and the read pages dropped behind it, so that the store does not push the key
//     files out of the page cache (a streamed bootstrapping block reads them again in every
//     bootstrap). The bytes are copied into the worker's own plaintext buffer: the store adds
//     nothing to the process's memory.
//   - Bounded: it stops adding entries past plaintext_store_max_bytes or when its file
//     system's free space would fall under storeMinFreeBytes; a plaintext it does not hold is
//     encoded as without it.
//
// Entries are appended in the order of the first evaluation's products, and the next
// evaluations ask for them in the same order (one worker: the program's order), so the
// reads are sequential.

const (
	// storeMinFreeBytes: the store stops growing where its file system would keep less free
	// (the key directory and the plaintext file live on the same disk here).
	storeMinFreeBytes = 4 << 30
	// storeDefaultMaxBytes: the default bound on the file (ResNet-20 at n16boot needs 31 GB).
	storeDefaultMaxBytes = 64 << 30
	// storeWindowBytes: readahead issued this far past the reader, and writeback waited for
	// this far behind the writer (two windows of page cache at most, 128 MiB: 1.6% of the
	// 7.9 GB bootstrapping keys the page cache also holds).
	storeWindowBytes = 64 << 20
	// storeRAChunk: one readahead request (the kernel serves at most read_ahead_kb per
	// request: 8 MiB here).
	storeRAChunk = 8 << 20
	// storeJudgeBytes (below): the reads are compared with the encodings every this many bytes read;
	// reads slower than encoding stop the reading for the rest of the call (ResNet-20 at
	// n16boot: one run read its 19.5 GB in 3.2 s, another, its disk slower, in 46.1 s,
	// against ~30 s of encoding).
)

// storeJudgeBytes (a variable for the tests): see the constants above.
var storeJudgeBytes int64 = 256 << 20

type ptStoreKey struct {
	sum    [32]byte
	levelQ int
	levelP int // -1: Q only
	scale  float64
}

type ptStoreEntry struct {
	off, n int64
}

type ptStore struct {
	mu        sync.Mutex
	f         *os.File
	dir       string
	limbBytes int64
	entries   map[ptStoreKey]ptStoreEntry
	size      int64 // bytes reserved (appended) so far
	written   int64 // bytes whose writes finished, in order, below which writeback was started
	synced    int64 // bytes written back and dropped from the page cache
	maxBytes  int64
	full      string // why the store stopped adding ("" while it adds)
	raEnd     int64  // readahead issued up to here
	dropEnd   int64  // read pages dropped up to here
	pending   map[int64]int64
	stats     ptStoreStats
	// encodings timed by the callers (noteEncode: the process's), reads in the current
	// window, and why this call stopped reading ("" while it reads)
	encNanos, encBytes int64
	winNanos, winBytes int64
	slow               string
}

// ptStoreStats: what one Run did with the store (stats plaintext_store).
type ptStoreStats struct {
	Dir          string  `json:"dir"`
	Entries      int     `json:"entries"`
	FileBytes    int64   `json:"file_bytes"`
	Hits         int64   `json:"hits"`
	Misses       int64   `json:"misses"`
	Added        int64   `json:"added"`
	ReadBytes    int64   `json:"read_bytes"`
	ReadSeconds  float64 `json:"read_seconds"`
	WriteBytes   int64   `json:"write_bytes"`
	WriteSeconds float64 `json:"write_seconds"`
	HashSeconds  float64 `json:"hash_seconds"`
	Full         string  `json:"full,omitempty"`
	// entries not read because this call's reads were slower than encoding (Slow: the rates)
	Skipped int64  `json:"skipped"`
	Slow    string `json:"slow,omitempty"`
}

var ptStores struct {
	sync.Mutex
	m map[string]*ptStore
}

// paramsDigest identifies a parameter set (its JSON form's SHA-256).
func paramsDigest(params ckks.Parameters) (string, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", sha256.Sum256(b)), nil
}

// openPtStore returns the process's store for dir, params and scope (made on first use;
// kept for the process's life, so the next call finds what this one wrote). scope keeps
// stores apart where their callers must not share (a serving process: the plan and weights
// digests its plaintext cache is kept under, so that no model learns from a store's timing
// what another model's weights are); "" for Run.
func openPtStore(dir string, params ckks.Parameters, maxBytes int64, scope string) (*ptStore, error) {
	id, err := paramsDigest(params)
	if err != nil {
		return nil, fmt.Errorf("plaintext_store: %w", err)
	}
	ptStores.Lock()
	defer ptStores.Unlock()
	if ptStores.m == nil {
		ptStores.m = map[string]*ptStore{}
	}
	name := dir + "\x00" + id + "\x00" + scope
	if s, ok := ptStores.m[name]; ok {
		s.mu.Lock()
		if maxBytes > 0 {
			s.maxBytes = maxBytes
		}
		s.stats = ptStoreStats{Dir: dir}
		s.slow, s.winNanos, s.winBytes = "", 0, 0 // each call judges its own reads
		s.mu.Unlock()
		return s, nil
	}
	f, err := os.CreateTemp(dir, "slotplan-plaintexts-*")
	if err != nil {
		return nil, fmt.Errorf("plaintext_store: cannot make a file in %q: %w", dir, err)
	}
	// unlinked at once: nothing is left behind, whatever ends the process
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("plaintext_store: %w", err)
	}
	if maxBytes <= 0 {
		maxBytes = storeDefaultMaxBytes
	}
	s := &ptStore{f: f, dir: dir, limbBytes: int64(params.N()) * 8, entries: map[ptStoreKey]ptStoreEntry{},
		maxBytes: maxBytes, pending: map[int64]int64{}, stats: ptStoreStats{Dir: dir}}
	ptStores.m[name] = s
	return s, nil
}

// key is the entry key of values v (the encoder's []float64 or []complex128) at (levelQ,
// levelP) and scale.
func (s *ptStore) key(v any, levelQ, levelP int, scale rlwe.Scale) (ptStoreKey, bool) {
	t := time.Now()
	h := sha256.New()
	switch x := v.(type) {
	case []float64:
		h.Write([]byte{'f'})
		if len(x) > 0 {
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), len(x)*8))
		}
	case []complex128:
		h.Write([]byte{'c'})
		if len(x) > 0 {
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), len(x)*16))
		}
	default:
		return ptStoreKey{}, false
	}
	k := ptStoreKey{levelQ: levelQ, levelP: levelP, scale: scale.Float64()}
	h.Sum(k.sum[:0])
	d := time.Since(t).Seconds()
	s.mu.Lock()
	s.stats.HashSeconds += d
	s.mu.Unlock()
	return k, true
}

func polyLimbs(p ringqp.Poly) [][]uint64 {
	limbs := append([][]uint64{}, p.Q.Coeffs...)
	if p.P.Coeffs != nil {
		limbs = append(limbs, p.P.Coeffs...)
	}
	return limbs
}

func limbBytes(l []uint64) []byte {
	if len(l) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&l[0])), len(l)*8)
}

// get reads the entry of k into dst (its limbs: Q, then P), reporting whether it had one.
func (s *ptStore) get(k ptStoreKey, dst ringqp.Poly) (bool, error) {
	limbs := polyLimbs(dst)
	s.mu.Lock()
	e, ok := s.entries[k]
	if !ok {
		s.stats.Misses++
		s.mu.Unlock()
		return false, nil
	}
	if e.n != int64(len(limbs))*s.limbBytes {
		s.mu.Unlock()
		return false, fmt.Errorf("plaintext store: entry of %d bytes for a plaintext of %d limbs", e.n, len(limbs))
	}
	if s.slow != "" {
		s.stats.Skipped++
		s.mu.Unlock()
		return false, nil
	}
	s.readAhead(e.off)
	s.mu.Unlock()
	t := time.Now()
	off := e.off
	for _, l := range limbs {
		b := limbBytes(l)
		for done := 0; done < len(b); {
			n, err := s.f.ReadAt(b[done:], off+int64(done))
			if n <= 0 && err != nil {
				// the store is a cache: a failed read is a miss (the plaintext is encoded),
				// and the store stops being used rather than failing the evaluation
				s.fail(fmt.Sprintf("reading %d bytes at %d: %v", len(b), off, err))
				return false, nil
			}
			done += n
		}
		off += int64(len(b))
	}
	el := time.Since(t)
	s.mu.Lock()
	s.stats.Hits++
	s.stats.ReadBytes += e.n
	s.stats.ReadSeconds += el.Seconds()
	s.winNanos += el.Nanoseconds()
	s.winBytes += e.n
	if s.winBytes >= storeJudgeBytes {
		if s.encBytes > 0 && s.encNanos > 0 && s.winNanos > 0 {
			read := float64(s.winBytes) / float64(s.winNanos) * 1e3 // MB/s
			enc := float64(s.encBytes) / float64(s.encNanos) * 1e3
			if read < enc {
				s.slow = fmt.Sprintf("reads at %.0f MB/s, encoding at %.0f MB/s", read, enc)
				s.stats.Slow = s.slow
			}
		}
		s.winNanos, s.winBytes = 0, 0
	}
	s.mu.Unlock()
	return true, nil
}

// noteEncode records an encoding the caller timed (seconds, the bytes it produced): the
// rate the reads are judged against.
func (s *ptStore) noteEncode(seconds float64, bytes int64) {
	s.mu.Lock()
	s.encNanos += int64(seconds * 1e9)
	s.encBytes += bytes
	s.mu.Unlock()
}

// readAhead (under mu) asks the kernel for the window past off and drops what lies well
// behind it.
func (s *ptStore) readAhead(off int64) {
	fd := int(s.f.Fd())
	if off < s.dropEnd { // a new pass (the next evaluation) starts again at the front
		s.dropEnd, s.raEnd = off, off
	}
	if s.raEnd < off {
		s.raEnd = off
	}
	for s.raEnd < min(off+storeWindowBytes, s.size) {
		n := min(int64(storeRAChunk), s.size-s.raEnd)
		_ = unix.Fadvise(fd, s.raEnd, n, unix.FADV_WILLNEED)
		s.raEnd += n
	}
	if off > s.dropEnd+storeWindowBytes {
		_ = unix.Fadvise(fd, s.dropEnd, off-s.dropEnd, unix.FADV_DONTNEED)
		s.dropEnd = off
	}
}

// put appends src's limbs as the entry of k (nothing when the store is full, has failed or
// already holds it: a failed write stops the store, never the evaluation).
func (s *ptStore) put(k ptStoreKey, src ringqp.Poly) {
	limbs := polyLimbs(src)
	n := int64(len(limbs)) * s.limbBytes
	s.mu.Lock()
	if _, ok := s.entries[k]; ok || s.full != "" {
		s.mu.Unlock()
		return
	}
	if s.size+n > s.maxBytes {
		s.full = fmt.Sprintf("plaintext_store_max_bytes (%d) reached", s.maxBytes)
		s.stats.Full = s.full
		s.mu.Unlock()
		return
	}
	// the free space, checked once per window
	if s.size/storeWindowBytes != (s.size+n)/storeWindowBytes || s.size == 0 {
		var fs unix.Statfs_t
		if err := unix.Fstatfs(int(s.f.Fd()), &fs); err == nil {
			if free := int64(fs.Bavail) * int64(fs.Bsize); free-n < storeMinFreeBytes {
				s.full = fmt.Sprintf("free space in %s under %d bytes", s.dir, int64(storeMinFreeBytes))
				s.stats.Full = s.full
				s.mu.Unlock()
				return
			}
		}
	}
	off := s.size
	s.size += n
	s.mu.Unlock()
	t := time.Now()
	o := off
	for _, l := range limbs {
		b := limbBytes(l)
		if _, err := s.f.WriteAt(b, o); err != nil { // (a full disk): no entry, no more added
			s.fail(fmt.Sprintf("writing %d bytes at %d: %v", len(b), o, err))
			return
		}
		o += int64(len(b))
	}
	d := time.Since(t).Seconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries[k] = ptStoreEntry{off: off, n: n}
	s.stats.Added++
	s.stats.WriteBytes += n
	s.stats.WriteSeconds += d
	s.pending[off] = n
	for { // the written prefix (workers may finish out of order)
		m, ok := s.pending[s.written]
		if !ok {
			break
		}
		delete(s.pending, s.written)
		s.written += m
	}
	s.writeBack()
}

// writeBack (under mu) starts the kernel's writeback of the written prefix and, a window
// behind it, waits for it and drops those pages from the page cache.
func (s *ptStore) writeBack() {
	fd := int(s.f.Fd())
	if s.written-s.synced < 2*storeWindowBytes {
		return
	}
	t := time.Now()
	end := s.written - storeWindowBytes
	_ = unix.SyncFileRange(fd, end, s.written-end, unix.SYNC_FILE_RANGE_WRITE)
	_ = unix.SyncFileRange(fd, s.synced, end-s.synced,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	_ = unix.Fadvise(fd, s.synced, end-s.synced, unix.FADV_DONTNEED)
	s.synced = end
	s.stats.WriteSeconds += time.Since(t).Seconds()
}

// fail stops the store: nothing more is added or read (every entry is dropped, so each
// plaintext is encoded as without a store), and why is reported.
func (s *ptStore) fail(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.full = "failed: " + why
	s.stats.Full = s.full
	s.entries = map[ptStoreKey]ptStoreEntry{}
}

// finish (end of a Run) returns the Run's statistics.
func (s *ptStore) finish() ptStoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Entries, st.FileBytes = len(s.entries), s.size
	st.ReadSeconds = math.Round(st.ReadSeconds*1e6) / 1e6
	return st
}
