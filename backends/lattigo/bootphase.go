package slotlattigo

import (
	"os"
	"runtime"
	"runtime/metrics"
	"syscall"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// ---------------------------------------------------------------------------------------
// Where an evaluation's time goes (issue 36): the phases of each sparse bootstrap, and the
// process's CPU, collector and page faults over the evaluation (Run's stats eval_cpu).

// Bootstrap phases, in Lattigo's order (bootstrapping.Evaluator.bootstrap): ScaleDown,
// ModUp (with the sparse trace), CoeffsToSlots, EvalMod (of both halves where there are
// two), SlotsToCoeffs.
var bootPhaseNames = []string{"scale_down", "mod_up", "coeffs_to_slots", "eval_mod", "slots_to_coeffs"}

// bootPhases sums, per phase, the wall time, the bootstrapping thread's CPU time and the
// time the phase waited for a streamed key (keyStore.streamWait, bootstream.go).
type bootPhases struct {
	Seconds    map[string]float64 `json:"seconds"`
	CPUSeconds map[string]float64 `json:"cpu_seconds"`
	KeyWait    map[string]float64 `json:"key_wait_seconds"`
	Count      int                `json:"bootstraps"`
}

func newBootPhases() *bootPhases {
	return &bootPhases{Seconds: map[string]float64{}, CPUSeconds: map[string]float64{}, KeyWait: map[string]float64{}}
}

// phaseClock laps a bootstrap's phases into a bootPhases (nil-safe: no accounting).
type phaseClock struct {
	ph   *bootPhases
	wait func() float64
	t    time.Time
	cpu  float64
	w    float64
}

func (p *bootPhases) clock(wait func() float64) *phaseClock {
	if p == nil {
		return nil
	}
	c := &phaseClock{ph: p, wait: wait}
	c.t, c.cpu = time.Now(), threadCPUSeconds()
	if wait != nil {
		c.w = wait()
	}
	return c
}

func (c *phaseClock) lap(phase string) {
	if c == nil {
		return
	}
	t, cpu := time.Now(), threadCPUSeconds()
	c.ph.Seconds[phase] += t.Sub(c.t).Seconds()
	c.ph.CPUSeconds[phase] += cpu - c.cpu
	if c.wait != nil {
		w := c.wait()
		c.ph.KeyWait[phase] += w - c.w
		c.w = w
	}
	c.t, c.cpu = t, cpu
}

// evaluatePhased is Lattigo's bootstrapping.Evaluator.Evaluate (v6.1.1) for parameters
// without iterations (Meta-BTS) below 128-bit precision, called phase by phase so that
// each is timed; with iterations or PREC128 it calls Evaluate itself (untimed phases).
// ctIn is consumed (ScaleDown works in place), as Evaluate's own bootstrap step does.
func evaluatePhased(ev *bootstrapping.Evaluator, ctIn *rlwe.Ciphertext, ph *bootPhases, wait func() float64) (*rlwe.Ciphertext, error) {
	if ev.IterationsParameters != nil || ev.ResidualParameters.PrecisionMode() == ckks.PREC128 {
		return ev.Evaluate(ctIn)
	}
	// thread CPU time is the bootstrapping goroutine's only while it stays on one thread
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c := ph.clock(wait)
	ct, _, err := ev.ScaleDown(ctIn)
	if err != nil {
		return nil, err
	}
	c.lap("scale_down")
	if ct, err = ev.ModUp(ct); err != nil {
		return nil, err
	}
	c.lap("mod_up")
	re, im, err := ev.CoeffsToSlots(ct)
	if err != nil {
		return nil, err
	}
	c.lap("coeffs_to_slots")
	if re, err = ev.EvalMod(re); err != nil {
		return nil, err
	}
	if im != nil {
		if im, err = ev.EvalMod(im); err != nil {
			return nil, err
		}
	}
	c.lap("eval_mod")
	out, err := ev.SlotsToCoeffs(re, im)
	if err != nil {
		return nil, err
	}
	c.lap("slots_to_coeffs")
	if ph != nil {
		ph.Count++
	}
	return out, nil
}

// evalCPU is what the process spent over an evaluation (ex.run): user and system CPU time
// of all its threads (getrusage), of it the Go collector's (runtime/metrics, an estimate
// the runtime keeps per GC cycle) and the scavenger's, the GC cycles, and the page faults
// (minor: a page mapped without storage; major: read from storage).
type evalCPU struct {
	UserSeconds     float64 `json:"user_seconds"`
	SystemSeconds   float64 `json:"system_seconds"`
	GCCPUSeconds    float64 `json:"gc_cpu_seconds"`
	ScavengeSeconds float64 `json:"scavenge_cpu_seconds"`
	GCCycles        uint64  `json:"gc_cycles"`
	MinorFaults     int64   `json:"minor_faults"`
	MajorFaults     int64   `json:"major_faults"`
}

var evalCPUMetrics = []string{"/cpu/classes/gc/total:cpu-seconds", "/cpu/classes/scavenge/total:cpu-seconds", "/gc/cycles/total:gc-cycles"}

func sampleEvalCPU() evalCPU {
	var out evalCPU
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out.UserSeconds = float64(ru.Utime.Sec) + float64(ru.Utime.Usec)/1e6
		out.SystemSeconds = float64(ru.Stime.Sec) + float64(ru.Stime.Usec)/1e6
		out.MinorFaults, out.MajorFaults = ru.Minflt, ru.Majflt
	}
	s := make([]metrics.Sample, len(evalCPUMetrics))
	for i, name := range evalCPUMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindFloat64 {
		out.GCCPUSeconds = s[0].Value.Float64()
	}
	if s[1].Value.Kind() == metrics.KindFloat64 {
		out.ScavengeSeconds = s[1].Value.Float64()
	}
	if s[2].Value.Kind() == metrics.KindUint64 {
		out.GCCycles = s[2].Value.Uint64()
	}
	return out
}

// since is what passed from a to b.
func (b evalCPU) since(a evalCPU) evalCPU {
	return evalCPU{
		UserSeconds: b.UserSeconds - a.UserSeconds, SystemSeconds: b.SystemSeconds - a.SystemSeconds,
		GCCPUSeconds: b.GCCPUSeconds - a.GCCPUSeconds, ScavengeSeconds: b.ScavengeSeconds - a.ScavengeSeconds,
		GCCycles: b.GCCycles - a.GCCycles, MinorFaults: b.MinorFaults - a.MinorFaults, MajorFaults: b.MajorFaults - a.MajorFaults,
	}
}

// cpuProfileEnv names a file that Run writes a Go CPU profile of its evaluation to
// (go tool pprof; docs/lattigo.md): a diagnostic switch, read by Run only.
const cpuProfileEnv = "SLOTPLAN_CPU_PROFILE"

// startEnvCPUProfile starts the profile SLOTPLAN_CPU_PROFILE asks for (a no-op without it).
func startEnvCPUProfile() (func(), error) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() {}, nil
	}
	return startCPUProfile(path)
}
