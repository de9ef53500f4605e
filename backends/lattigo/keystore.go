package slotlattigo

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// keyStore is the evaluation side's rlwe.EvaluationKeySet. It knows every key of a key
// directory (from its manifest) but holds in memory only the resident ones: load reads a
// key from disk, drop forgets it. Lattigo asks it for a key on every rotation.
//
// GetGaloisKeysList returns every Galois element the directory can serve (not only the
// resident ones): Lattigo's evaluator precomputes its automorphism index tables from that
// list, and an incomplete list makes it fill the table lazily (a data race) or panic.
//
// The store is used by one goroutine (with prefetching on, a background goroutine only
// reads key files for it: prefetch.go); ShallowCopy returns the store itself.
type keyStore struct {
	dir      string
	params   ckks.Parameters
	manifest keyManifest
	byGalEl  map[uint64]manifestKey
	galEls   []uint64

	resident map[uint64]*rlwe.GaloisKey
	rlk      *rlwe.RelinearizationKey

	// The bootstrapping key block (bootstrapping plans): what the directory holds, and
	// the resident block (nil when dropped).
	bootByGalEl map[uint64]manifestKey
	block       *bootBlock
	blockLoads  int
	stream      *bootStream         // a streamed block's Galois keys (bootstream.go); nil: whole block
	inBootstrap bool                // the requests are a bootstrap's (a streamed block serves them)
	streamSeq   []uint64            // a bootstrap's key requests, as learned (kept across block loads)
	streamKind  string              // the kind of bootstrap streamSeq belongs to ("" or "full": full-slot; bootvariant.go)
	streamSeqs  map[string][]uint64 // the learned sequences of the other kinds
	// bootstraps that began on a predicted order, began learning one, and left their
	// order (a request off it, or stopping short: learned again)
	streamPredicted, streamLearned, streamMisses int
	streamRequests                               int     // a streamed block's keys asked for by bootstraps
	streamReads                                  int     // streamed block keys read
	streamReused                                 int     // of them read into a key a bootstrap had finished with
	streamWait                                   float64 // seconds a bootstrap waited for a streamed key (read in line or ahead)

	residentBytes int64
	peakBytes     int64
	peakCount     int
	loads         int
	loadSeconds   float64
	// readBytes: bytes of key files read so far (rotation keys, the boot block and its
	// streamed keys), by any goroutine; with loadSeconds the store's measured read rate
	readBytes atomic.Int64
	// readCPUNanos: the CPU time of those reads (the reading thread's), which a loaded
	// machine does not inflate as it does loadSeconds (stats key_load_cpu_seconds)
	readCPUNanos atomic.Int64

	pf *prefetcher // nil: load reads in line

	cache  cacheAccount // storage reads, mapped streamed keys (pagecache.go)
	mapOff bool         // SLOTPLAN_KEY_MAP=off: streamed keys are copied, not mapped

	// Reading key files (keyread.go): the shape a file may hold, whether to read as
	// Lattigo does (SLOTPLAN_KEY_READ=lattigo: no reuse either), and the free key: the plan
	// key dropped last, read into by the next load of a key of its shape (same levels, same
	// bytes) instead of a new key. At most one is kept: a drop replaces it, a load of
	// another shape lets go of it (it becomes garbage, as every dropped key did before), so
	// beyond the keys the model counts the process holds at most one dropped plan key.
	shape       keyShape
	lattigoRead bool
	free        *rlwe.GaloisKey
	freeShape   freeShape
	keysReused  int // plan key loads read into the free key
	// loadSeconds split: the plan's own keys (load_key k), the block's keys read when it is
	// loaded; the rest is its streamed keys, read during bootstraps (keyLoadSplit)
	planLoadSeconds, blockLoadSeconds float64
}

// keyLoadSplit is loadSeconds by what was read (stats key_load_split): a load_key
// instruction's time holds plan_keys and block_keys (and, for the block, the DFT matrices'
// encoding: boot_matrix_seconds); block_stream is read inside the bootstraps.
func (s *keyStore) keyLoadSplit() map[string]float64 {
	return map[string]float64{
		"plan_keys":    s.planLoadSeconds,
		"block_keys":   s.blockLoadSeconds,
		"block_stream": max(0, s.loadSeconds-s.planLoadSeconds-s.blockLoadSeconds), // (rounding)
	}
}

// freeShape identifies keys whose limbs are interchangeable: same levels, same size.
type freeShape struct {
	bytes, levelQ, levelP int
}

// addResident counts bytes (and keys) becoming resident and keeps the peaks.
func (s *keyStore) addResident(bytes int64, keys int) {
	s.residentBytes += bytes
	if s.residentBytes > s.peakBytes {
		s.peakBytes = s.residentBytes
	}
	if n := s.residentCount() + keys + s.inflightCount(); n > s.peakCount {
		s.peakCount = n
	}
}

func (s *keyStore) inflightCount() int {
	if s.pf == nil {
		return 0
	}
	return len(s.pf.inflight)
}

func openKeyStore(dir string, params ckks.Parameters) (*keyStore, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, fmt.Errorf("key directory %s has no readable %s: %w", dir, manifestName, err)
	}
	var m keyManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("key directory %s: %s is not valid: %w", dir, manifestName, err)
	}
	if m.LogN != params.LogN() || !slices.Equal(m.Q, params.Q()) || !slices.Equal(m.P, params.P()) {
		return nil, fmt.Errorf("key directory %s holds keys for other parameters (log_n %d, %d+%d primes)",
			dir, m.LogN, len(m.Q), len(m.P))
	}
	s := &keyStore{
		dir: dir, params: params, manifest: m,
		byGalEl:     map[uint64]manifestKey{},
		resident:    map[uint64]*rlwe.GaloisKey{},
		bootByGalEl: map[uint64]manifestKey{},
		shape:       shapeOf(params.N(), params.QCount(), params.PCount()),
		lattigoRead: lattigoKeyReader(),
	}
	s.mapOff = keyMapOff()
	for _, mk := range m.Rotations {
		if mk.GaloisElement != galoisOf(params, mk.K) {
			return nil, fmt.Errorf("key directory %s: key %s claims k=%d but Galois element %d", dir, mk.File, mk.K, mk.GaloisElement)
		}
		s.byGalEl[mk.GaloisElement] = mk
		s.galEls = append(s.galEls, mk.GaloisElement)
	}
	if m.Boot != nil {
		conj := params.GaloisElementForComplexConjugation()
		for _, mk := range m.Boot.Galois {
			want := conj
			if !mk.Conjugation {
				want = params.GaloisElement(mk.K)
			}
			if mk.GaloisElement != want {
				return nil, fmt.Errorf("key directory %s: boot key %s claims k=%d but Galois element %d", dir, mk.File, mk.K, mk.GaloisElement)
			}
			s.bootByGalEl[mk.GaloisElement] = mk
			if _, dup := s.byGalEl[mk.GaloisElement]; !dup {
				s.galEls = append(s.galEls, mk.GaloisElement)
			}
		}
	}
	sort.Slice(s.galEls, func(i, j int) bool { return s.galEls[i] < s.galEls[j] })
	if m.Relin != "" {
		rlk := new(rlwe.RelinearizationKey)
		if err := s.readInto(m.Relin, rlk, readPlan); err != nil {
			return nil, err
		}
		s.rlk = rlk
	}
	return s, nil
}

// readInto reads a key file into obj (no second in-memory copy of the key): a Galois,
// relinearisation or evaluation key with readKeyFile (keyread.go; into obj's limbs when it
// has them), else (or with SLOTPLAN_KEY_READ=lattigo) with obj's ReadFrom through a buffer.
// It may run on a prefetching goroutine: it touches only obj and the byte counter.
func (s *keyStore) readInto(name string, obj io.ReaderFrom, cat int) error {
	path := filepath.Join(s.dir, name)
	return s.accountedRead(path, cat, func() (int64, error) {
		if ct, _ := gadgetOf(obj); ct != nil && !s.lattigoRead {
			return readKeyFile(path, obj, s.shape)
		}
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		return obj.ReadFrom(bufio.NewReaderSize(f, 1<<20))
	})
}

// accountedRead runs one key read of path (read returns the bytes it read) on a locked
// OS thread and counts it: the thread's CPU time, its storage reads by category
// (pagecache.go) and the bytes. A missing or unreadable file and a corrupt one are told
// apart in the error.
func (s *keyStore) accountedRead(path string, cat int, read func() (int64, error)) error {
	runtime.LockOSThread() // the thread's CPU clock and I/O counter time this read only
	defer runtime.UnlockOSThread()
	c0, b0 := threadCPUSeconds(), threadStorageReadBytes()
	n, err := read()
	s.readCPUNanos.Add(int64(1e9 * (threadCPUSeconds() - c0)))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("cannot read key file: %w", err)
	}
	if err != nil {
		return fmt.Errorf("key file %s is corrupt or truncated: %w", path, err)
	}
	s.cache.countRead(cat, b0, threadStorageReadBytes())
	s.readBytes.Add(n)
	return nil
}

// has reports whether the directory holds a key for rotation offset k.
func (s *keyStore) has(k int) bool {
	_, ok := s.byGalEl[galoisOf(s.params, k)]
	return ok
}

// residentKey returns the resident key for offset k (the plan's own key, else the
// resident boot block's), or nil.
func (s *keyStore) residentKey(k int) *rlwe.GaloisKey {
	galEl := galoisOf(s.params, k)
	if err := s.settle(galEl); err != nil { // a prefetched key: wait for its read
		return nil
	}
	if gk, ok := s.resident[galEl]; ok {
		return gk
	}
	if s.block != nil {
		return s.block.gks[galEl]
	}
	return nil
}

// residentCount is the number of resident Galois keys (plan keys and the block's).
func (s *keyStore) residentCount() int {
	n := len(s.resident) + s.streamCount()
	if s.block != nil {
		n += len(s.block.gks)
	}
	return n
}

func (s *keyStore) notePeak() {
	if s.residentBytes > s.peakBytes {
		s.peakBytes = s.residentBytes
	}
	if n := s.residentCount(); n > s.peakCount {
		s.peakCount = n
	}
}

// bootBlock is the resident bootstrapping key block.
type bootBlock struct {
	gks           map[uint64]*rlwe.GaloisKey
	rlk           *rlwe.RelinearizationKey
	denseToSparse *rlwe.EvaluationKey
	sparseToDense *rlwe.EvaluationKey
	bytes         int64
}

func (b *bootBlock) galoisKeys() []*rlwe.GaloisKey {
	out := make([]*rlwe.GaloisKey, 0, len(b.gks))
	for _, gk := range b.gks {
		out = append(out, gk)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GaloisElement < out[j].GaloisElement })
	return out
}

// hasBlock reports whether the directory holds a bootstrapping key block.
func (s *keyStore) hasBlock() bool {
	return s.manifest.Boot != nil
}

// blockHas reports whether the directory's boot block holds the key for offset k.
func (s *keyStore) blockHas(k int) bool {
	_, ok := s.bootByGalEl[s.params.GaloisElement(k)]
	return ok
}

// loadBlock reads the bootstrapping key block (a no-op when it is resident). With
// stream >= 0 only its relinearisation and encapsulation keys are read now and its
// Galois keys are streamed during each bootstrap, at most stream+1 at a time
// (bootstream.go); stream < 0 reads the whole block.
func (s *keyStore) loadBlock(stream int) error {
	if s.block != nil {
		return nil
	}
	bm := s.manifest.Boot
	if bm == nil {
		return fmt.Errorf("key directory %s has no bootstrapping key block", s.dir)
	}
	t := time.Now()
	b := &bootBlock{gks: map[uint64]*rlwe.GaloisKey{}}
	for _, mk := range bm.Galois {
		if stream >= 0 {
			break
		}
		gk := new(rlwe.GaloisKey)
		if err := s.readInto(mk.File, gk, readBlock); err != nil {
			return err
		}
		if gk.GaloisElement != mk.GaloisElement {
			return fmt.Errorf("key file %s holds Galois element %d, expected %d", mk.File, gk.GaloisElement, mk.GaloisElement)
		}
		b.gks[gk.GaloisElement] = gk
		b.bytes += int64(gk.BinarySize())
	}
	b.rlk = new(rlwe.RelinearizationKey)
	b.denseToSparse, b.sparseToDense = new(rlwe.EvaluationKey), new(rlwe.EvaluationKey)
	for _, f := range []struct {
		name string
		obj  interface {
			io.ReaderFrom
			BinarySize() int
		}
	}{{bm.Relin, b.rlk}, {bm.DenseToSparse, b.denseToSparse}, {bm.SparseToDense, b.sparseToDense}} {
		if err := s.readInto(f.name, f.obj, readBlock); err != nil {
			return err
		}
		b.bytes += int64(f.obj.BinarySize())
	}
	s.block = b
	if stream >= 0 {
		s.startStream(stream)
	}
	s.blockLoads++
	s.loadSeconds += time.Since(t).Seconds()
	s.blockLoadSeconds += time.Since(t).Seconds()
	s.residentBytes += b.bytes
	s.notePeak()
	return nil
}

// dropBlock forgets the bootstrapping key block (a no-op when it is not resident).
func (s *keyStore) dropBlock() {
	if s.block != nil {
		s.stopStream()
		s.residentBytes -= s.block.bytes
		s.block = nil
	}
}

// load makes the key for offset k resident (a no-op when it already is); with prefetching
// on, it queues the read and returns at once.
func (s *keyStore) load(k int) error {
	galEl := galoisOf(s.params, k)
	if _, ok := s.resident[galEl]; ok {
		return nil
	}
	mk, ok := s.byGalEl[galEl]
	if !ok {
		return fmt.Errorf("key directory %s has no rotation key for k=%d", s.dir, k)
	}
	if s.pf != nil {
		if _, busy := s.pf.inflight[galEl]; !busy {
			s.startLoad(galEl, mk)
		}
		return nil
	}
	t := time.Now()
	gk := s.takeFree(mk)
	if err := s.readInto(mk.File, gk, readPlan); err != nil {
		return err
	}
	if gk.GaloisElement != galEl {
		return fmt.Errorf("key file %s holds Galois element %d, expected %d (k=%d)", mk.File, gk.GaloisElement, galEl, k)
	}
	s.loadSeconds += time.Since(t).Seconds()
	s.planLoadSeconds += time.Since(t).Seconds()
	s.loads++
	s.resident[galEl] = gk
	s.addResident(int64(gk.BinarySize()), 0)
	return nil
}

// drop forgets the key for offset k (a no-op when it is not resident; an in-flight
// prefetch is waited for first).
func (s *keyStore) drop(k int) {
	galEl := galoisOf(s.params, k)
	_ = s.settle(galEl)
	if gk, ok := s.resident[galEl]; ok {
		s.residentBytes -= int64(gk.BinarySize())
		delete(s.resident, galEl)
		if !s.lattigoRead {
			s.free, s.freeShape = gk, freeShape{gk.BinarySize(), gk.LevelQ(), gk.LevelP()}
		}
	}
}

// takeFree returns the free key when it has mk's shape (counted in keysReused), else a new
// key (and lets go of the free key).
func (s *keyStore) takeFree(mk manifestKey) *rlwe.GaloisKey {
	gk := s.free
	s.free = nil
	if gk != nil && s.freeShape == (freeShape{mk.Bytes, mk.LevelQ, mk.LevelP}) {
		s.keysReused++
		return gk
	}
	return new(rlwe.GaloisKey)
}

// loadAll makes every rotation key of the directory resident (the keep-all policy; the
// boot block is loaded by the executor, which builds its evaluator around it).
func (s *keyStore) loadAll() error {
	for _, mk := range s.manifest.Rotations {
		if err := s.load(mk.K); err != nil {
			return err
		}
	}
	return nil
}

// GetGaloisKey implements rlwe.EvaluationKeySet.
func (s *keyStore) GetGaloisKey(galEl uint64) (*rlwe.GaloisKey, error) {
	if err := s.settle(galEl); err != nil {
		return nil, err
	}
	// the boot block's key first: it is made for the bootstrapping chain's top level, and
	// the bootstrapper (through this evaluator's key set) rotates at levels above a plan
	// key of the same offset made at the plan's level (LeNet at n14boot under a cap held
	// both); a plan rotation at a lower level works with it as well
	if s.block != nil {
		if gk, ok := s.block.gks[galEl]; ok {
			return gk, nil
		}
		if _, ok := s.bootByGalEl[galEl]; ok && s.stream != nil && s.inBootstrap {
			return s.streamKey(galEl)
		}
	}
	if gk, ok := s.resident[galEl]; ok {
		return gk, nil
	}
	if mk, ok := s.byGalEl[galEl]; ok {
		return nil, fmt.Errorf("rotation key k=%d is not resident", mk.K)
	}
	if mk, ok := s.bootByGalEl[galEl]; ok {
		return nil, fmt.Errorf("the key block \"boot\" (holding k=%d) is not resident", mk.K)
	}
	return nil, fmt.Errorf("no rotation key for Galois element %d", galEl)
}

// GetGaloisKeysList implements rlwe.EvaluationKeySet: every element the store can serve.
func (s *keyStore) GetGaloisKeysList() []uint64 {
	return slices.Clone(s.galEls)
}

// GetRelinearizationKey implements rlwe.EvaluationKeySet: the resident boot block's key
// (generated at the top of the bootstrapping chain: the bootstrap's own multiplications
// need it there, and a lower-level key would give silently wrong results), else the plan's
// own key.
func (s *keyStore) GetRelinearizationKey() (*rlwe.RelinearizationKey, error) {
	if s.block != nil {
		return s.block.rlk, nil
	}
	if s.rlk == nil {
		return nil, fmt.Errorf("no relinearisation key in %s", s.dir)
	}
	return s.rlk, nil
}

// ShallowCopy implements rlwe.EvaluationKeySet (single goroutine: the store itself).
func (s *keyStore) ShallowCopy() rlwe.EvaluationKeySet {
	return s
}
