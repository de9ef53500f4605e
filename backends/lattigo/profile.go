package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"runtime/pprof"
	"sort"
	"syscall"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// startCPUProfile writes a Go CPU profile (go tool pprof) to path until the returned
// function is called (BenchPlan and LintransMatvec option cpu_profile: the timed runs).
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu_profile: %w", err)
	}
	if err = pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu_profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// ---------------------------------------------------------------------------------------
// Phase profile of fused blocks (ProfileBlock; cmd/blockprof; docs/lattigo.md).

// phaseProfile attributes wall time and page faults (getrusage minflt/majflt of the
// process) to the phases of fused blocks: each lap charges what passed since the previous
// one. It is read by one goroutine only (ProfileBlock runs one worker).
type phaseProfile struct {
	t       float64
	min     int64
	maj     int64
	Seconds map[string]float64 `json:"seconds"`
	MinFlt  map[string]int64   `json:"minflt"`
	MajFlt  map[string]int64   `json:"majflt"`
	Counts  map[string]int     `json:"counts"`
}

func newPhaseProfile() *phaseProfile {
	p := &phaseProfile{Seconds: map[string]float64{}, MinFlt: map[string]int64{}, MajFlt: map[string]int64{}, Counts: map[string]int{}}
	p.start()
	return p
}

func faults() (minflt, majflt int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return ru.Minflt, ru.Majflt
}

// start begins a lap without charging what came before (nil-safe).
func (p *phaseProfile) start() {
	if p == nil {
		return
	}
	p.t = nowSeconds()
	p.min, p.maj = faults()
}

// lap charges the time and faults since the last lap (or start) to phase (nil-safe).
func (p *phaseProfile) lap(phase string) {
	if p == nil {
		return
	}
	t := nowSeconds()
	mn, mj := faults()
	p.Seconds[phase] += t - p.t
	p.MinFlt[phase] += mn - p.min
	p.MajFlt[phase] += mj - p.maj
	p.Counts[phase]++
	p.t, p.min, p.maj = t, mn, mj
}

type profileBlockOptions struct {
	// Levels: the input levels the blocks are run at (default: the top level)
	Levels []int `json:"levels"`
	// Repeat: runs per level (default 1); each run is a fresh evaluation like Run's
	Repeat int `json:"repeat"`
	// Cached: plaintexts encoded once (BenchPlan's cache; the first run encodes them, untimed
	// as a preparation run) instead of streamed in each block as Run does
	Cached bool  `json:"cached"`
	Seed   int64 `json:"seed"`
	// CPUProfile: a Go CPU profile of the runs (pprof) to this file
	CPUProfile string `json:"cpu_profile"`
	commonOptions
}

type profileBlockRun struct {
	Level        int           `json:"level"`
	Seconds      float64       `json:"seconds"`
	MinFlt       int64         `json:"minflt"`
	MajFlt       int64         `json:"majflt"`
	Phases       *phaseProfile `json:"phases"`
	Products     int           `json:"products"`
	Babies       int           `json:"babies"`
	Giants       int           `json:"giants"`
	Blocks       int           `json:"blocks"`
	OutputLevels []int         `json:"output_levels"`
	// MaxAbs: the largest |slot| of the decrypted outputs, and Checksum their sum (a change of
	// the executor must leave both as they were, to CKKS precision)
	MaxAbs   float64 `json:"max_abs"`
	Checksum float64 `json:"checksum"`
}

type profileBlockResult struct {
	LogN        int               `json:"log_n"`
	QPrimes     int               `json:"q_primes"`
	PPrimes     int               `json:"p_primes"`
	RotKeys     int               `json:"rotation_keys"`
	KeyLevel    int               `json:"key_level"`
	KeyBytes    int64             `json:"key_bytes"`
	KeygenSec   float64           `json:"keygen_seconds"`
	Runs        []profileBlockRun `json:"runs"`
	PeakRSS     int64             `json:"rss_peak_bytes"`
	RSSMeasured bool              `json:"rss_measured"`
}

// ProfileBlock runs the fused blocks of a plan (a sub-plan cut from a real plan by
// scripts/block_subplan.py: inputs, the blocks' baby rotations and blocks, outputs) with
// the plan's parameters (for a bootstrapping preset its bootstrapping parameters, as Run
// evaluates) but only the blocks' rotation keys, on random inputs and plaintexts at each
// of the given input levels, one worker, and reports per run the wall time, the page
// faults and the phases of the blocks (phaseProfile).
func ProfileBlock(planJSON string, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	defer releaseMemory()
	var opt profileBlockOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	p, setup, slots, err := loadPlan(planJSON)
	if err != nil {
		return "", err
	}
	if p.hasKeySchedule() {
		return "", fmt.Errorf("plan: ProfileBlock takes a plan without key schedule (scripts/block_subplan.py)")
	}
	if opt.Repeat <= 0 {
		opt.Repeat = 1
	}
	if len(opt.Levels) == 0 {
		opt.Levels = []int{setup.top}
	}
	keyLevel := 0
	for _, l := range opt.Levels {
		if l < 1 || l > setup.top {
			return "", fmt.Errorf("options: levels: %d is outside 1..%d", l, setup.top)
		}
		keyLevel = max(keyLevel, l)
	}
	params := setup.params
	rng := rand.New(rand.NewSource(opt.Seed + 1))
	random := func() []float64 {
		v := make([]float64, slots)
		for i := range v {
			v[i] = 2*rng.Float64() - 1
		}
		return v
	}
	names := make([]string, 0, len(p.Plaintexts))
	for name, spec := range p.Plaintexts {
		if spec.ImagTable != "" || spec.L != 0 {
			return "", fmt.Errorf("plaintexts: %q is complex or cins (ProfileBlock takes real ones)", name)
		}
		names = append(names, name)
	}
	sort.Strings(names) // (the same values for the same plan, run after run)
	pts := map[string][]float64{}
	for _, name := range names {
		pts[name] = random()
	}
	c := newSetupClient(setup)
	res := &profileBlockResult{LogN: params.LogN(), QPrimes: params.QCount(), PPrimes: params.PCount(), KeyLevel: keyLevel}
	keys, sec := memoryKeyStoreAt(c, p.rotationOffsets(), false, keyLevel)
	res.RotKeys, res.KeyBytes, res.KeygenSec = len(keys.resident), keys.residentBytes, sec
	var inputs []*rlwe.Ciphertext
	for range p.count("input") {
		ct, err := c.encrypt(random())
		if err != nil {
			return "", err
		}
		inputs = append(inputs, ct)
	}
	collectGarbage()
	_, res.RSSMeasured = resetPeakRSS()
	if opt.CPUProfile != "" {
		stop, err := startCPUProfile(opt.CPUProfile)
		if err != nil {
			return "", err
		}
		defer stop()
	}
	for _, level := range opt.Levels {
		cache := newPtCache(-1)
		first := 0
		if opt.Cached {
			cache, first = newPtCache(0), -1
		}
		for r := first; r < opt.Repeat; r++ {
			io := &ctIO{}
			for _, ct := range inputs {
				in := ct.CopyNew()
				in.Resize(in.Degree(), level)
				io.inputs = append(io.inputs, in)
			}
			st := &stats{OpCounts: map[string]int{}, OpSeconds: map[string]float64{}}
			e := newExecutor(setup, keys, p, pts, io, st, executorOptions{Workers: 1, Cache: cache})
			e.prof = newPhaseProfile()
			collectGarbage()
			mn0, mj0 := faults()
			t := nowSeconds()
			if err := e.run(); err != nil {
				return "", err
			}
			run := profileBlockRun{Level: level, Seconds: nowSeconds() - t, Phases: e.prof, Products: st.FusedProducts,
				Babies: st.FusedBabies, Giants: st.FusedGiants, Blocks: st.FusedBlocks}
			mn1, mj1 := faults()
			run.MinFlt, run.MajFlt = mn1-mn0, mj1-mj0
			for _, ct := range io.outputs {
				run.OutputLevels = append(run.OutputLevels, ct.Level())
				v, err := c.decrypt(ct)
				if err != nil {
					return "", err
				}
				for _, x := range v {
					run.MaxAbs = math.Max(run.MaxAbs, math.Abs(x))
					run.Checksum += x
				}
			}
			if r >= 0 {
				res.Runs = append(res.Runs, run)
			}
		}
	}
	res.PeakRSS = peakRSS()
	out, err := json.Marshal(res)
	return string(out), err
}
