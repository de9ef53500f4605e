package slotlattigo

import (
	"fmt"
	"sync"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
)

// The bootstrapping evaluation state kept across evaluations (issue 36 item 4).
//
// The DFT matrices of a bootstrap (CoeffsToSlots and SlotsToCoeffs, of the full-slot
// bootstrap and of every sparse variant the plan uses) are public plaintexts that depend on
// the bootstrapping parameters only: not on the keys, not on the inputs. loadBlock encodes
// them under stand-in keys (newBootEvaluator) and wires the result to the executor's
// evaluator and the block's keys. A bootState is that key-independent part: the unwired
// evaluators with their encoded matrices. An executor wires a shallow copy of each (the
// matrices are shared and read only), so one state can serve evaluations one after the
// other and with different key sets (the keys are wired at every block load).
//
// Where it is kept: in the ptCache, beside the evaluator state (evalScratch) that a model
// evaluated again and again keeps (Evaluate's cache per call or the server's cache per
// plan, BenchPlan's cache across its runs); Run, one evaluation per call, keeps it in
// keptBoot across calls when its option keep_boot_state asks (a batched plan's ciphertext
// sets, model-bench's repeats).
//
// When it may be kept (memory): the plan's memory model counts the matrices from the
// block's load_key to its drop_key. Kept across evaluations they are resident from the end
// of one evaluation to the first block load of the next, so the executor keeps them only
// when (keepable) the program's first block load comes before any instruction other than
// input and load_key (the model's peak at that load already counts them with everything
// before it), and after its last block drop there is no load_key and no bootstrap (nothing
// there grows the keys the model counts; the kept bytes are tracked in peak_tracked_bytes
// until the program ends). A block dropped and loaded again inside one evaluation (a key
// schedule under a memory cap) is rebuilt at its reload as before, since its absence there is
// what the model counts.
type bootState struct {
	id       string
	full     *bootstrapping.Evaluator         // unwired (newBootEvaluator)
	variants map[int]*bootstrapping.Evaluator // unwired, by log_slots
	bytes    int64                            // the encoded matrices (matrixBytes)
	seconds  float64                          // the time it took to encode them
}

// bootStateID names what a bootState depends on: the literal, the ring and the variants.
func bootStateID(setup *evalSetup) string {
	return fmt.Sprintf("%s/logN=%d/variants=%v", setup.boot.Literal, setup.params.LogN(), setup.sortedVariants())
}

// buildBootState encodes the matrices of the full-slot bootstrap and of every variant
// setup uses (only those: setup.variants holds the plan's, setupBootVariants), under
// stand-in keys for galEls.
func buildBootState(setup *evalSetup, galEls []uint64) (*bootState, error) {
	t := time.Now()
	full, err := newBootEvaluator(*setup.btp, galEls)
	if err != nil {
		return nil, err
	}
	bs := &bootState{id: bootStateID(setup), full: full, variants: map[int]*bootstrapping.Evaluator{}, bytes: matrixBytes(full)}
	for _, k := range setup.sortedVariants() {
		ev, err := newBootEvaluator(*setup.variants[k], galEls)
		if err != nil {
			return nil, fmt.Errorf("sparse bootstrap at 2^%d slots: %w", k, err)
		}
		bs.variants[k] = ev
		bs.bytes += matrixBytes(ev)
	}
	releaseMemory() // the encoder's temporaries, before any key is read
	bs.seconds = time.Since(t).Seconds()
	return bs, nil
}

// copyEvaluator is a shallow copy of an unwired evaluator, for one executor to wire.
func copyEvaluator(ev *bootstrapping.Evaluator) *bootstrapping.Evaluator {
	cp := *ev
	return &cp
}

// keptBoot is the state Run leaves for the next Run call of the same process (option
// keep_boot_state); nil when none.
var keptBoot struct {
	sync.Mutex
	st *bootState
}

// takeKeptBoot hands the kept state to a Run call (and forgets it: the call puts it back
// when it keeps it again).
func takeKeptBoot() *bootState {
	keptBoot.Lock()
	defer keptBoot.Unlock()
	st := keptBoot.st
	keptBoot.st = nil
	return st
}

// putKeptBoot keeps st (nil: nothing) for the next Run call.
func putKeptBoot(st *bootState) {
	keptBoot.Lock()
	keptBoot.st = st
	keptBoot.Unlock()
}

// bootKeepable reports whether the plan lets the state stay across evaluations (see
// bootState) and, when not, why.
func (p *plan) bootKeepable() (bool, string) {
	first, last := -1, -1
	for i, in := range p.Program {
		if in.Block == "" {
			continue
		}
		if in.Op == "load_key" && first < 0 {
			first = i
		}
		if in.Op == "drop_key" {
			last = i
		}
	}
	if first < 0 {
		return true, "" // no schedule of the block: resident throughout (keep-all)
	}
	for _, in := range p.Program[:first] {
		if in.Op != "input" && in.Op != "load_key" {
			return false, fmt.Sprintf("the first load_key block comes after a %s", in.Op)
		}
	}
	if last < 0 {
		return true, ""
	}
	for _, in := range p.Program[last+1:] {
		if in.Op == "load_key" || in.Op == "bootstrap" || in.Op == "bootstrap2" || in.Op == "bootstrap_cins" {
			return false, fmt.Sprintf("a %s follows the last drop_key block", in.Op)
		}
	}
	return true, ""
}

// isLastBlockDrop: instruction i is the program's last drop_key of the block.
func (p *plan) isLastBlockDrop(i int) bool {
	for _, in := range p.Program[i+1:] {
		if in.Block != "" && in.Op == "drop_key" {
			return false
		}
	}
	return true
}

// bootStateFor returns the bootstrapping state to wire at a block load: the one kept in the
// cache when it is the setup's (reused: no encoding), else a new one.
func (e *executor) bootStateFor(galEls []uint64) (*bootState, bool, error) {
	id := bootStateID(e.setup)
	e.cache.mu.Lock()
	kept := e.cache.boot
	e.cache.mu.Unlock()
	if kept != nil && kept.id == id {
		return kept, true, nil
	}
	st, err := buildBootState(e.setup, galEls)
	return st, false, err
}

// keepBootState leaves the executor's state in the cache for the next evaluation, or lets
// go of it (keep false) so that a dropped block frees its matrices.
func (e *executor) keepBootState(keep bool) {
	e.cache.mu.Lock()
	defer e.cache.mu.Unlock()
	if keep && e.boot != nil {
		e.cache.boot = e.boot
		e.st.BootStateKept = true
		return
	}
	if e.cache.boot == e.boot {
		e.cache.boot = nil
	}
}
