package slotlattigo

import (
	"fmt"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// A streamed bootstrapping key block (plan: load_key {"block": "boot", "stream": D}).
//
// The whole block holds every Galois key a bootstrap uses (35 at log N 14, 1.3 GiB; 48 at
// log N 16, 7 GiB), but a bootstrap asks for them one at a time: each DFT stage rotates by
// its own offsets, each once (one GetGaloisKey per rotation, hoisted or not). A streamed
// block keeps resident its relinearisation and encapsulation keys and at most D+1 of its
// Galois keys: the one handed out last (the caller is using it) and the next D of the
// bootstrap's request sequence, read ahead by a background goroutine. The key the bootstrap
// asked for before is dropped at the next request (the evaluation is one goroutine, so the
// previous rotation has finished by then).
//
// The sequence is predicted from the bootstrap's evaluator (bootorder.go), else learned:
// the first bootstrap of its kind reads each key when asked (no read-ahead) and records the
// order. Bootstraps prefetch along it: on into the next bootstrap's first keys when the
// plan's next bootstrap is of the same kind, else up to their own last key, the next
// kind's first keys being read ahead as they end (bootorder.go). A request off the sequence is read in line and the sequence is learned again (counted:
// stats boot_stream_misses).
//
// The block's keys do not serve the plan's own rotations while streamed (the key schedule
// gives such rotations keys of their own).
//
// A read-ahead reads into the key the bootstrap finished with (GaloisKey.ReadFrom reuses
// the polynomials of a key of the same shape, and the block's keys share one) instead of
// a new one: without that every bootstrap at n14boot allocated its 35 keys anew (1.4 GB),
// the collector ran every ~110 MB at GOGC 10 and the bootstrap itself paid for it in
// assists (3.6-4.4 s against 3.3-3.5 s with the block resident, ResNet-20 and LeNet-5).

type bootStream struct {
	depth int
	// wrap: the read-ahead runs on past the end of the order into the next bootstrap's
	// first keys (the plan's next bootstrap is of the same kind; else it stops at the end
	// and the next kind's keys are read ahead when this bootstrap ends)
	wrap    bool
	seq     []uint64 // the request order of one bootstrap (predicted or learned)
	learned bool
	pos     int                 // next expected position in seq (learned)
	slots   map[int]*streamSlot // by position in seq: resident or in flight
	last    int                 // position handed out last (-1: none)
	jobs    chan streamJob      // read-ahead queue (nil: depth 0)
	learnKs []uint64            // the sequence being learned
	onlyKey *rlwe.GaloisKey     // learning: the key handed out last
	onlyMap []byte              // its mapping (mapped keys: pagecache.go)
	onlyEl  uint64
	// keys the bootstrap finished with, read into again by the next read-ahead (at most
	// one waits here: a slot is freed right before the next read is queued)
	free []*rlwe.GaloisKey
}

type streamSlot struct {
	galEl   uint64
	bytes   int64
	gk      *rlwe.GaloisKey
	mapping []byte // the key's file mapped (nil: read into memory)
	done    chan prefetchResult
}

type streamJob struct {
	mk   manifestKey
	gk   *rlwe.GaloisKey // a finished key to read into (nil: a new one)
	done chan prefetchResult
}

func (s *keyStore) startStream(depth int) {
	st := &bootStream{depth: depth, slots: map[int]*streamSlot{}, last: -1, wrap: true}
	defer func() {
		// a sequence learned while the block was loaded before: read ahead at once
		if len(s.streamSeq) > 0 {
			st.seq, st.learned = s.streamSeq, true
			for p := 0; p < depth && p < len(st.seq); p++ {
				s.ahead(p)
			}
		}
	}()
	if depth > 0 {
		st.jobs = make(chan streamJob, depth+1)
		go func(dir *keyStore, jobs <-chan streamJob) {
			for j := range jobs {
				t := time.Now()
				gk, mapping, err := dir.readStreamKey(j.mk, j.gk)
				j.done <- prefetchResult{gk: gk, err: err, seconds: time.Since(t).Seconds(), mapping: mapping}
			}
		}(s, st.jobs)
	}
	s.stream = st
}

// stopStream waits for reads in flight and forgets every streamed key.
func (s *keyStore) stopStream() {
	st := s.stream
	if st == nil {
		return
	}
	for p := range st.slots {
		s.freeSlot(p)
	}
	s.dropLearnKey()
	st.free = nil
	if st.jobs != nil {
		close(st.jobs)
	}
	s.stream = nil
}

func (s *keyStore) dropLearnKey() {
	st := s.stream
	if st.onlyKey != nil {
		s.residentBytes -= int64(st.onlyKey.BinarySize())
		st.onlyKey = nil
		s.unmapKey(st.onlyMap)
		st.onlyMap = nil
	}
}

// readStreamKey reads a streamed block key: mapped (pagecache.go), else into the key
// `into` (a key the bootstrap finished with) or a new one. It may run on the stream's
// reading goroutine.
func (s *keyStore) readStreamKey(mk manifestKey, into *rlwe.GaloisKey) (*rlwe.GaloisKey, []byte, error) {
	var mapping []byte
	var err error
	gk := into
	if s.mapsStreamedKeys() {
		gk, mapping, err = s.mapStreamKey(mk.File)
	} else {
		if gk == nil {
			gk = new(rlwe.GaloisKey)
		}
		err = s.readInto(mk.File, gk, readStream)
	}
	if err == nil && gk.GaloisElement != mk.GaloisElement {
		s.unmapKey(mapping)
		err = fmt.Errorf("key file %s holds Galois element %d, expected %d", mk.File, gk.GaloisElement, mk.GaloisElement)
	}
	if err != nil {
		return nil, nil, err
	}
	return gk, mapping, nil
}

// freeSlot forgets the key at sequence position p (waiting for its read if in flight).
func (s *keyStore) freeSlot(p int) {
	st := s.stream
	sl, ok := st.slots[p]
	if !ok {
		return
	}
	gk, mapping := sl.gk, sl.mapping
	if sl.done != nil {
		r := <-sl.done
		s.loadSeconds += r.seconds
		gk, mapping = nil, nil
		if r.err == nil {
			gk, mapping = r.gk, r.mapping
		}
	}
	if mapping != nil {
		s.unmapKey(mapping) // (a mapped key's memory is the page cache's: nothing to reuse)
	} else if gk != nil {
		st.free = append(st.free, gk)
	}
	s.residentBytes -= sl.bytes
	delete(st.slots, p)
}

// ahead queues the read of sequence position p (mod the sequence) unless it is there.
func (s *keyStore) ahead(p int) {
	st := s.stream
	p %= len(st.seq)
	if _, ok := st.slots[p]; ok || st.jobs == nil {
		return
	}
	mk := s.bootByGalEl[st.seq[p]]
	sl := &streamSlot{galEl: st.seq[p], bytes: int64(mk.Bytes), done: make(chan prefetchResult, 1)}
	st.slots[p] = sl
	s.addResident(sl.bytes, 1)
	s.streamReads++
	s.loads++
	var into *rlwe.GaloisKey
	if n := len(st.free); n > 0 {
		into, st.free = st.free[n-1], st.free[:n-1]
		s.streamReused++
	}
	st.jobs <- streamJob{mk, into, sl.done}
}

// readNow reads the block key galEl in line (and returns its mapping, if mapped).
func (s *keyStore) readNow(galEl uint64) (*rlwe.GaloisKey, []byte, error) {
	mk, ok := s.bootByGalEl[galEl]
	if !ok {
		return nil, nil, fmt.Errorf("no bootstrapping key for Galois element %d", galEl)
	}
	t := time.Now()
	gk, mapping, err := s.readStreamKey(mk, nil)
	if err != nil {
		return nil, nil, err
	}
	s.loadSeconds += time.Since(t).Seconds()
	s.streamWait += time.Since(t).Seconds()
	s.streamReads++
	s.loads++
	return gk, mapping, nil
}

// beginBootstrapKind: the requests that follow are a bootstrap's of this kind ("full", or a
// sparse variant s<k>/h<k>/p<k>, bootvariant.go; "cins": NeuJeans' bootstrap_cins;
// executor.bootKind). Each kind asks for its own keys in its own order, kept per kind. A
// kind with no order yet takes predict's (bootorder.go; predict may be nil, or return
// nil: none), and failing that its bootstrap learns one, reading each key in line.
// wrap: the plan's next bootstrap is of the same kind (bootStream.wrap).
func (s *keyStore) beginBootstrapKind(kind string, predict func() []uint64, wrap bool) {
	s.switchBootstrapKind(kind, predict)
	if st := s.stream; st != nil {
		st.wrap = wrap
		if !st.learned {
			st.learnKs = st.learnKs[:0]
			s.streamLearned++
		}
	}
}

// expectBootstrapKind: the plan's next bootstrap is of this kind. When it is another kind
// than the one just run, the read-ahead moves to its first keys now (the current kind's
// next bootstrap, which the read-ahead wraps around to, is not the next one), so that they
// are read during the work between the two.
func (s *keyStore) expectBootstrapKind(kind string, predict func() []uint64) {
	if s.stream != nil && kind != s.streamKind {
		s.switchBootstrapKind(kind, predict)
	}
}

// switchBootstrapKind makes kind the stream's: a change of kind keeps the previous kind's
// order, drops its read-ahead and reads ahead along the new kind's order (predicted when
// it has none).
func (s *keyStore) switchBootstrapKind(kind string, predict func() []uint64) {
	if s.streamKind == "" {
		s.streamKind = "full"
	}
	restart := false
	if kind != s.streamKind {
		if s.streamSeqs == nil {
			s.streamSeqs = map[string][]uint64{}
		}
		s.streamSeqs[s.streamKind] = s.streamSeq
		s.streamKind, s.streamSeq = kind, s.streamSeqs[kind]
		restart = true
	}
	st := s.stream
	if st != nil && len(s.streamSeq) == 0 && predict != nil {
		if seq := reorderPrediction(predict()); len(seq) > 0 {
			s.streamSeq, restart = seq, true
			s.streamPredicted++
		}
	}
	if st != nil && restart {
		for p := range st.slots {
			s.freeSlot(p)
		}
		s.dropLearnKey()
		st.seq, st.learned, st.pos, st.last = s.streamSeq, len(s.streamSeq) > 0, 0, -1
		for p := 0; st.learned && p < st.depth && p < len(st.seq); p++ {
			s.ahead(p)
		}
	}
}

// reorderPrediction: the identity; the tests swap in a wrong order to check that a
// bootstrap off its predicted order still gets its keys, and learns the order.
var reorderPrediction = func(seq []uint64) []uint64 { return seq }

// endBootstrap: a bootstrap finished. One that learned the sequence fixes it; read-ahead then
// starts on the next bootstrap's first keys when the next is of the same kind (wrap).
func (s *keyStore) endBootstrap() {
	st := s.stream
	if st == nil {
		return
	}
	s.dropLearnKey()
	if !st.learned {
		if len(st.learnKs) == 0 {
			return
		}
		st.seq = append([]uint64(nil), st.learnKs...)
		s.streamSeq = st.seq
		st.learned, st.pos, st.last = true, 0, -1
		for p := 0; st.wrap && p < st.depth && p < len(st.seq); p++ {
			s.ahead(p)
		}
		return
	}
	if st.pos != 0 { // the bootstrap stopped short of the sequence: learn again
		s.streamMisses++
		for p := range st.slots {
			s.freeSlot(p)
		}
		st.learned, st.last = false, -1
	}
}

// streamKey hands out the block key galEl to a bootstrap.
func (s *keyStore) streamKey(galEl uint64) (*rlwe.GaloisKey, error) {
	st := s.stream
	s.streamRequests++
	if st.learned && st.seq[st.pos] == galEl {
		p := st.pos
		if st.last >= 0 && st.last != p {
			s.freeSlot(st.last)
		}
		sl, ok := st.slots[p]
		if !ok { // not read ahead (depth 0)
			gk, mapping, err := s.readNow(galEl)
			if err != nil {
				return nil, err
			}
			sl = &streamSlot{galEl: galEl, bytes: int64(gk.BinarySize()), gk: gk, mapping: mapping}
			st.slots[p] = sl
			s.addResident(sl.bytes, 1)
		} else if sl.done != nil {
			t := time.Now()
			r := <-sl.done
			s.streamWait += time.Since(t).Seconds()
			s.loadSeconds += r.seconds
			sl.done = nil
			if r.err != nil {
				return nil, r.err
			}
			sl.gk, sl.mapping = r.gk, r.mapping
			s.residentBytes += int64(r.gk.BinarySize()) - sl.bytes
			sl.bytes = int64(r.gk.BinarySize())
		}
		st.last = p
		st.pos = (p + 1) % len(st.seq)
		if st.depth > 0 && (st.wrap || p+st.depth < len(st.seq)) {
			s.ahead(p + st.depth)
		}
		s.notePeak()
		return sl.gk, nil
	}
	if st.learned { // off the sequence: drop the read-ahead, read in line, learn again
		s.streamMisses++
		for p := range st.slots {
			s.freeSlot(p)
		}
		st.learned, st.last = false, -1
		st.learnKs = st.learnKs[:0]
	}
	s.dropLearnKey()
	gk, mapping, err := s.readNow(galEl)
	if err != nil {
		return nil, err
	}
	st.onlyKey, st.onlyMap, st.onlyEl = gk, mapping, galEl
	s.addResident(int64(gk.BinarySize()), 1)
	st.learnKs = append(st.learnKs, galEl)
	return gk, nil
}

// streamCount is the number of resident streamed keys (for the peak key count).
func (s *keyStore) streamCount() int {
	if s.stream == nil {
		return 0
	}
	n := len(s.stream.slots)
	if s.stream.onlyKey != nil {
		n++
	}
	return n
}
