package slotlattigo

import (
	"fmt"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// Key prefetching (KeyMemRT's balanced mode). With prefetching on, load_key does not read
// the key in line: it hands the key to one background goroutine (a FIFO queue, keys read
// one after the other) and the program goes on; the key's bytes count as resident from
// that moment (the plan's memory model counts a key from its load_key). The first use of
// the key (a rotation asking the store for it) or its drop_key waits until the read has
// finished; that wait is reported as key_wait_seconds. The plan issues load_key early
// enough that the modelled compute between the load and the use covers the read
// (planner/keys/joint.py), so a cap costs little time.

type prefetchJob struct {
	mk   manifestKey
	gk   *rlwe.GaloisKey // the key to read into (a dropped key of the same shape, or a new one)
	done chan prefetchResult
}

type prefetchResult struct {
	gk      *rlwe.GaloisKey
	err     error
	seconds float64
	mapping []byte // a streamed block key's mapping (pagecache.go); nil: read into memory
}

type prefetcher struct {
	jobs     chan prefetchJob
	inflight map[uint64]chan prefetchResult // by Galois element; owned by the evaluation goroutine
	reserved map[uint64]int64               // bytes counted for an in-flight key
	waitSec  float64
}

// enablePrefetch starts the background loader (idempotent). stopPrefetch ends it.
func (s *keyStore) enablePrefetch() {
	if s.pf != nil {
		return
	}
	pf := &prefetcher{jobs: make(chan prefetchJob, 1024), inflight: map[uint64]chan prefetchResult{}, reserved: map[uint64]int64{}}
	go func(dir *keyStore, jobs <-chan prefetchJob) {
		for j := range jobs {
			t := time.Now()
			gk := j.gk
			err := dir.readInto(j.mk.File, gk, readPlan)
			if err == nil && gk.GaloisElement != j.mk.GaloisElement {
				err = fmt.Errorf("key file %s holds Galois element %d, expected %d (k=%d)", j.mk.File, gk.GaloisElement, j.mk.GaloisElement, j.mk.K)
			}
			j.done <- prefetchResult{gk: gk, err: err, seconds: time.Since(t).Seconds()}
		}
	}(s, pf.jobs)
	s.pf = pf
}

func (s *keyStore) stopPrefetch() {
	if s.pf == nil {
		return
	}
	for galEl := range s.pf.inflight {
		_ = s.settle(galEl)
	}
	close(s.pf.jobs)
	s.pf = nil
}

// startLoad queues the key's read and counts its bytes as resident at once.
func (s *keyStore) startLoad(galEl uint64, mk manifestKey) {
	done := make(chan prefetchResult, 1)
	s.addResident(int64(mk.Bytes), 1)
	s.pf.inflight[galEl] = done
	s.pf.reserved[galEl] = int64(mk.Bytes)
	s.pf.jobs <- prefetchJob{mk, s.takeFree(mk), done}
}

// settle waits for an in-flight read of the key (if any) and makes the key resident.
func (s *keyStore) settle(galEl uint64) error {
	if s.pf == nil {
		return nil
	}
	done, ok := s.pf.inflight[galEl]
	if !ok {
		return nil
	}
	t := time.Now()
	r := <-done
	s.pf.waitSec += time.Since(t).Seconds()
	delete(s.pf.inflight, galEl)
	reserved := s.pf.reserved[galEl]
	delete(s.pf.reserved, galEl)
	s.residentBytes -= reserved
	s.loadSeconds += r.seconds
	s.planLoadSeconds += r.seconds
	if r.err != nil {
		return r.err
	}
	s.loads++
	s.resident[galEl] = r.gk
	s.residentBytes += int64(r.gk.BinarySize())
	if s.residentBytes > s.peakBytes {
		s.peakBytes = s.residentBytes
	}
	return nil
}

// waitSeconds is the time the evaluation waited for prefetched keys.
func (s *keyStore) waitSeconds() float64 {
	if s.pf == nil {
		return s.streamWait
	}
	return s.pf.waitSec + s.streamWait
}
