package slotlattigo

import (
	"fmt"
	"math/bits"
	"sort"
	"sync"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/lintrans"
	ltcommon "github.com/tuneinsight/lattigo/v6/circuits/common/lintrans"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/ring"
)

// CinS instructions in the plan executor (docs/neujeans.md), with the matrices of the
// NeuJeans driver (neujeans.go):
//
//   - to_cins {dst, re, im, l, levels}: z = re + i im (a monomial product, no level), then
//     S_(l<-1) z, the first log2 l butterfly stages of Lattigo's SlotsToCoeffs merged into
//     `levels` factors the way the planner counts them (planner.ir.to_cins_stages: the
//     larger factors first), each one lintrans and one level.
//   - bootstrap_cins {dsts, src, l, fused}: the rest of SlotsToCoeffs, S_(N/2<-l), then the
//     bootstrap in NeuJeans' order (neujeansBootTail: Scaling, ScaleDown, ModUp,
//     CoeffsToSlots, EvalMod on both halves). fused: the plan's convolution that produces
//     src (rotations, cins pmuls, additions and rescales back to the registers it reads:
//     its bases) is not run instruction by instruction; per base its diagonal matrix K_b
//     is read off the plan (the same dataflow interpretation as the simulator's), S_(N/2<-l)
//     K_b is formed offline (the same slice diagonals, NeuJeans Sec. 4) and evaluated with
//     lintrans in the one level the plan's convolution takes. Not fused: S_(N/2<-l) is one
//     more lintrans (one level) before the bootstrap.
//
// The matrices are encoded once per model and level and kept in the plaintext cache.

// cinsFusedConv is a convolution fused into bootstrap_cins instruction `at`.
type cinsFusedConv struct {
	at     int
	l      int
	bases  []string         // the registers it reads, sorted
	instrs []int            // the plan's instructions it replaces, in program order
	offs   map[string][]int // per base: the diagonal offsets of S_(N/2<-l) K_b, sorted
}

type cinsPlan struct {
	skip  map[int]bool
	fused map[int]*cinsFusedConv
	err   error // a fused convolution the executor cannot absorb (reported at its bootstrap)
}

// linear ops a fused convolution is made of
func cinsLinear(in instr, p *plan) bool {
	switch in.Op {
	case "rescale", "add", "sub", "rot", "rot_hoisted":
		return true
	case "pmul":
		return p.Plaintexts[in.Pt].L > 0
	}
	return false
}

// analyseCins finds the fused convolutions of a plan (nil: the plan has no CinS op).
func analyseCins(p *plan, slots int) *cinsPlan {
	has := false
	for _, in := range p.Program {
		if in.Op == "to_cins" || in.Op == "bootstrap_cins" {
			has = true
		}
	}
	if !has {
		return nil
	}
	cp := &cinsPlan{skip: map[int]bool{}, fused: map[int]*cinsFusedConv{}}
	def := map[string]int{}
	users := map[string][]int{}
	for i, in := range p.Program {
		for _, r := range in.defs() {
			def[r] = i
		}
		for _, r := range in.uses() {
			users[r] = append(users[r], i)
		}
	}
	var logN int
	if p.Params != nil {
		logN = p.Params.LogN
	}
	for i, in := range p.Program {
		if in.Op != "bootstrap_cins" || in.Fused == nil || !*in.Fused {
			continue
		}
		f := &cinsFusedConv{at: i, l: in.L}
		region := map[int]bool{}
		baseSet := map[string]bool{}
		stack := []string{in.Src}
		for len(stack) > 0 {
			r := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			j, ok := def[r]
			if !ok || !cinsLinear(p.Program[j], p) {
				baseSet[r] = true
				continue
			}
			if region[j] {
				continue
			}
			region[j] = true
			stack = append(stack, p.Program[j].uses()...)
		}
		if len(region) == 0 {
			cp.err = fmt.Errorf("instruction %d (bootstrap_cins): fused, but %q is not computed by a convolution", i, in.Src)
			continue
		}
		for j := range region {
			f.instrs = append(f.instrs, j)
			for _, r := range p.Program[j].defs() {
				for _, u := range users[r] {
					if !region[u] && u != i && cp.err == nil {
						cp.err = fmt.Errorf("instruction %d (bootstrap_cins): register %q of its fused convolution is also read by instruction %d", i, r, u)
					}
				}
			}
		}
		sort.Ints(f.instrs)
		for b := range baseSet {
			f.bases = append(f.bases, b)
		}
		sort.Strings(f.bases)
		// structural diagonal offsets of K_b, then of S_(N/2<-l) K_b
		sets := cinsOffsetSets(p, f.instrs, f.bases, slots)
		s2 := s2FullOffsets(logN, slots, in.L)
		f.offs = map[string][]int{}
		for _, b := range f.bases {
			set := map[int]bool{}
			for d := range sets[b] {
				for _, a := range s2 {
					set[(a+d)&(slots-1)] = true
				}
			}
			f.offs[b] = sortedKeys(set)
		}
		for _, j := range f.instrs {
			cp.skip[j] = true
		}
		cp.fused[i] = f
	}
	return cp
}

func sortedKeys(set map[int]bool) []int {
	out := make([]int, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// cinsOffsetSets interprets a convolution's instructions on diagonal offsets only.
func cinsOffsetSets(p *plan, instrs []int, bases []string, slots int) map[string]map[int]bool {
	type form map[string]map[int]bool
	val := map[string]form{}
	get := func(r string) form {
		if f, ok := val[r]; ok {
			return f
		}
		return form{r: {0: true}}
	}
	rot := func(f form, k int) form {
		out := form{}
		for b, s := range f {
			out[b] = map[int]bool{}
			for d := range s {
				out[b][(d+k)&(slots-1)] = true
			}
		}
		return out
	}
	for _, j := range instrs {
		in := p.Program[j]
		switch in.Op {
		case "rescale", "pmul":
			val[in.Dst] = get(in.Src)
		case "rot":
			val[in.Dst] = rot(get(in.Src), *in.K)
		case "rot_hoisted":
			for t, k := range in.Ks {
				val[in.Dsts[t]] = rot(get(in.Src), k)
			}
		case "add", "sub":
			out := form{}
			for _, f := range []form{get(in.A), get(in.B)} {
				for b, s := range f {
					if out[b] == nil {
						out[b] = map[int]bool{}
					}
					for d := range s {
						out[b][d] = true
					}
				}
			}
			val[in.Dst] = out
		}
	}
	last := p.Program[instrs[len(instrs)-1]]
	res := get(last.defs()[0])
	for _, b := range bases {
		if res[b] == nil {
			res[b] = map[int]bool{}
		}
	}
	return res
}

// the S_(N/2<-l) product (and S_(l<-1) factors) per (log N, l, levels), built once
var cinsMats = struct {
	sync.Mutex
	s2   map[[2]int]diagMap
	toC  map[[3]int][]diagMap
	offs map[[3]int][]int
}{s2: map[[2]int]diagMap{}, toC: map[[3]int][]diagMap{}, offs: map[[3]int][]int{}}

// s2Full returns S_(N/2<-l) (the SlotsToCoeffs stages above log2 l, composed).
func s2Full(logN, slots, l int) diagMap {
	cinsMats.Lock()
	defer cinsMats.Unlock()
	key := [2]int{logN, l}
	if m, ok := cinsMats.s2[key]; ok {
		return m
	}
	logSlots := bits.Len(uint(slots)) - 1
	logL := bits.Len(uint(l)) - 1
	stages := s2cStages(logN, logSlots)[logL:]
	m := diagMap{0: ones(slots)}
	if len(stages) > 0 {
		m = composeAll(stages, slots)
	}
	cinsMats.s2[key] = m
	return m
}

func ones(n int) []complex128 {
	v := make([]complex128, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

func s2FullOffsets(logN, slots, l int) []int {
	if logN == 0 {
		return []int{0}
	}
	return s2Full(logN, slots, l).offsets()
}

// toCinsGroups is planner.ir.to_cins_stages' split: factor i takes
// ceil(remaining / (levels - i)) stages (the larger factors first).
func toCinsGroups(stages, levels int) []int {
	if levels > stages {
		levels = stages
	}
	var out []int
	rem := stages
	for i := 0; i < levels; i++ {
		take := (rem + levels - i - 1) / (levels - i)
		out = append(out, take)
		rem -= take
	}
	return out
}

// toCinsFactors returns the S_(l<-1) factors of to_cins (applied in order).
func toCinsFactors(logN, slots, l, levels int) []diagMap {
	cinsMats.Lock()
	defer cinsMats.Unlock()
	key := [3]int{logN, l, levels}
	if m, ok := cinsMats.toC[key]; ok {
		return m
	}
	logSlots := bits.Len(uint(slots)) - 1
	logL := bits.Len(uint(l)) - 1
	stages := s2cStages(logN, logSlots)[:logL]
	var out []diagMap
	i := 0
	for _, k := range toCinsGroups(logL, levels) {
		out = append(out, composeAll(stages[i:i+k], slots))
		i += k
	}
	cinsMats.toC[key] = out
	return out
}

// ltRatio is the BSGS ratio of every CinS matrix (Lattigo's bootstrapping default).
const ltRatio = 1

// bsgsOffsets: the baby and giant rotations lintrans makes for these diagonals.
func bsgsOffsets(diags []int, slots int) []int {
	n1 := ltcommon.FindBestBSGSRatio(diags, slots, ltRatio)
	_, rotN1, rotN2 := ltcommon.BSGSIndex(diags, slots, n1)
	set := map[int]bool{}
	for _, k := range append(rotN1, rotN2...) {
		if k != 0 {
			set[k&(slots-1)] = true
		}
	}
	return sortedKeys(set)
}

// bsgsCount is the number of rotations lintrans makes for these diagonals: its nonzero
// baby and giant steps (planner.ir.lattigo_bsgs_rotations).
func bsgsCount(diags []int, slots int) int {
	n1 := ltcommon.FindBestBSGSRatio(diags, slots, ltRatio)
	_, rotN1, rotN2 := ltcommon.BSGSIndex(diags, slots, n1)
	n := 0
	for _, k := range append(rotN1, rotN2...) {
		if k != 0 {
			n++
		}
	}
	return n
}

// cinsOffsets returns the rotation offsets of the lintrans inside the plan's to_cins and
// fused bootstrap_cins instructions (their keys belong to the plan's key set).
func (p *plan) cinsOffsets() []int {
	if p.Params == nil || p.Params.LogN == 0 {
		return nil
	}
	slots := 1 << (p.Params.LogN - 1)
	set := map[int]bool{}
	cp := analyseCins(p, slots)
	if cp == nil {
		return nil
	}
	for _, in := range p.Program {
		switch {
		case in.Op == "to_cins" && in.Levels != nil && in.L > 1 && *in.Levels > 0 && slots%in.L == 0:
			for _, m := range toCinsFactors(p.Params.LogN, slots, in.L, *in.Levels) {
				for _, k := range bsgsOffsets(m.offsets(), slots) {
					set[k] = true
				}
			}
		case in.Op == "bootstrap_cins" && (in.Fused == nil || !*in.Fused) && in.L < slots:
			for _, k := range bsgsOffsets(s2Full(p.Params.LogN, slots, in.L).offsets(), slots) {
				set[k] = true
			}
		}
	}
	for _, f := range cp.fused {
		for _, b := range f.bases {
			for _, k := range bsgsOffsets(f.offs[b], slots) {
				set[k] = true
			}
		}
	}
	return sortedKeys(set)
}

// checkCinsKeys: the keys a to_cins or bootstrap_cins carries (the planner's key model:
// planner.ir.to_cins_keys / stoc_keys) are the ones its matrices rotate by here.
func (p *plan) checkCinsKeys(slots int) error {
	cp := analyseCins(p, slots)
	if cp == nil {
		return nil
	}
	for i, in := range p.Program {
		if in.Keys == nil || (in.Op != "to_cins" && in.Op != "bootstrap_cins") {
			continue
		}
		set := map[int]bool{}
		switch {
		case in.Op == "to_cins" && in.L > 1:
			for _, m := range toCinsFactors(p.Params.LogN, slots, in.L, *in.Levels) {
				for _, k := range bsgsOffsets(m.offsets(), slots) {
					set[k] = true
				}
			}
		case in.Op == "bootstrap_cins" && cp.fused[i] != nil:
			for _, b := range cp.fused[i].bases {
				for _, k := range bsgsOffsets(cp.fused[i].offs[b], slots) {
					set[k] = true
				}
			}
		case in.Op == "bootstrap_cins" && in.L < slots:
			for _, k := range bsgsOffsets(s2Full(p.Params.LogN, slots, in.L).offsets(), slots) {
				set[k] = true
			}
		}
		want := sortedKeys(set)
		got := append([]int(nil), in.Keys...)
		sort.Ints(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("instruction %d (%s): keys %v, but its matrices rotate by %v", i, in.Op, got, want)
		}
	}
	return nil
}

// validateCins checks a to_cins or bootstrap_cins instruction's fields.
func validateCins(in instr, slots int, fail func(string, ...any) error) error {
	if in.L < 1 || in.L&(in.L-1) != 0 || slots%in.L != 0 {
		return fail("l=%d must be a power of two dividing %d slots", in.L, slots)
	}
	if in.Op == "to_cins" {
		if in.Dst == "" || in.Re == "" {
			return fail("needs \"dst\" and \"re\"")
		}
		if in.Levels == nil || *in.Levels < 0 {
			return fail("needs \"levels\" >= 0")
		}
		if in.L > 1 && *in.Levels == 0 {
			return fail("l=%d needs levels >= 1 (S_(l<-1) has %d stages)", in.L, bits.Len(uint(in.L))-1)
		}
		return nil
	}
	if in.Src == "" || len(in.Dsts) != 2 || in.Dsts[0] == "" || in.Dsts[1] == "" {
		return fail("needs \"src\" and \"dsts\": [re, im]")
	}
	return nil
}

// cinsLT returns matrix m encoded for lintrans at (level, scale), from the plaintext cache.
func (e *executor) cinsLT(name string, m diagMap, offs []int, level int, scale rlwe.Scale) (*lintrans.LinearTransformation, error) {
	key := ptKey{"\x00cins/" + name, level, scale.Float64()}
	c := e.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lts == nil {
		c.lts = map[ptKey]*lintrans.LinearTransformation{}
	}
	if lt, ok := c.lts[key]; ok {
		return lt, nil
	}
	t := nowSeconds()
	slots := e.params.MaxSlots()
	diags := lintrans.Diagonals[complex128]{}
	for _, k := range offs {
		if v, ok := m[k]; ok {
			diags[k] = v
		} else {
			diags[k] = make([]complex128, slots) // a structural diagonal that is zero here
		}
	}
	lt := lintrans.NewTransformation(e.params, lintrans.Parameters{
		DiagonalsIndexList:        offs,
		LevelQ:                    level,
		LevelP:                    e.params.MaxLevelP(),
		Scale:                     scale,
		LogDimensions:             ring.Dimensions{Rows: 0, Cols: e.params.LogMaxSlots()},
		LogBabyStepGiantStepRatio: ltRatio,
	})
	if err := lintrans.Encode(e.ecd, diags, lt); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d := nowSeconds() - t
	c.seconds += d
	e.encodeSec += d
	var n int64
	for _, p := range lt.Vec {
		n += int64(p.BinarySize())
	}
	e.st.CinsMatrixBytes += n
	if c.keep(n) { // as plaintexts: kept for the model's next evaluations, not in one run
		c.lts[key] = &lt
	}
	return &lt, nil
}

// applyLT evaluates lt on ct (one level: lintrans, then rescale) and counts its rotations.
func (e *executor) applyLT(ct *rlwe.Ciphertext, lt *lintrans.LinearTransformation, offs []int) (*rlwe.Ciphertext, error) {
	out := e.newCt(ct.Level())
	if err := lintrans.NewEvaluator(e.eval).Evaluate(ct, *lt, out); err != nil {
		return nil, err
	}
	e.st.CinsRotations += bsgsCount(offs, e.params.MaxSlots())
	return e.rescale(out)
}

// sameLevel drops the higher of two ciphertexts to the other's level (copies).
func (e *executor) sameLevel(a, b *rlwe.Ciphertext) (*rlwe.Ciphertext, *rlwe.Ciphertext) {
	if a.Level() > b.Level() {
		a = a.CopyNew()
		e.eval.DropLevel(a, a.Level()-b.Level())
	} else if b.Level() > a.Level() {
		b = b.CopyNew()
		e.eval.DropLevel(b, b.Level()-a.Level())
	}
	return a, b
}

func (e *executor) toCins(in instr) error {
	z, err := e.operand(in.Re, true)
	if err != nil {
		return err
	}
	if in.Im != nil {
		im, err := e.operand(*in.Im, true)
		if err != nil {
			return err
		}
		z, im = e.sameLevel(z, im)
		t := e.newCt(im.Level())
		if err = e.eval.Mul(im, complex(0, 1), t); err != nil {
			return err
		}
		out := e.newCt(z.Level())
		if err = e.eval.Add(z, t, out); err != nil {
			return err
		}
		e.recycle(t)
		z = out
	}
	slots := e.params.MaxSlots()
	if in.L > 1 {
		ms := toCinsFactors(e.params.LogN(), slots, in.L, *in.Levels)
		if z.Level() < len(ms) {
			return fmt.Errorf("S_(l<-1) takes %d levels, %q is at level %d", len(ms), in.Re, z.Level())
		}
		for j, m := range ms {
			offs := m.offsets()
			lt, err := e.cinsLT(fmt.Sprintf("to_cins/l%d/%d.%d", in.L, *in.Levels, j), m, offs, z.Level(), e.rescaleFactor(z.Level()))
			if err != nil {
				return err
			}
			if z, err = e.applyLT(z, lt, offs); err != nil {
				return fmt.Errorf("S_(l<-1) factor %d: %w", j, err)
			}
		}
	}
	e.set(in.Dst, z)
	return nil
}

// fusedForms reads the fused convolution's diagonal matrices off the plan (per base K_b:
// offset -> slot vector), interpreting its instructions on diagonal forms.
func (e *executor) fusedForms(f *cinsFusedConv) (map[string]diagMap, error) {
	slots := e.params.MaxSlots()
	type form map[string]diagMap
	val := map[string]form{}
	get := func(r string) form {
		if v, ok := val[r]; ok {
			return v
		}
		return form{r: {0: ones(slots)}}
	}
	rot := func(v form, k int) form {
		out := form{}
		for b, m := range v {
			out[b] = diagMap{}
			for d, vec := range m {
				w := make([]complex128, slots)
				for t := range w {
					w[t] = vec[(t+k)&(slots-1)]
				}
				out[b][(d+k)&(slots-1)] = w
			}
		}
		return out
	}
	for _, j := range f.instrs {
		in := e.plan.Program[j]
		switch in.Op {
		case "rescale":
			val[in.Dst] = get(in.Src)
		case "pmul":
			raw, err := e.ptVector(in.Pt)
			if err != nil {
				return nil, err
			}
			pv := raw.([]complex128)
			out := form{}
			for b, m := range get(in.Src) {
				out[b] = diagMap{}
				for d, vec := range m {
					w := make([]complex128, slots)
					for t := range w {
						w[t] = vec[t] * pv[t]
					}
					out[b][d] = w
				}
			}
			val[in.Dst] = out
		case "rot":
			val[in.Dst] = rot(get(in.Src), *in.K)
		case "rot_hoisted":
			for t, k := range in.Ks {
				val[in.Dsts[t]] = rot(get(in.Src), k)
			}
		case "add", "sub":
			out := form{}
			sign := complex(1, 0)
			for n, v := range []form{get(in.A), get(in.B)} {
				if n == 1 && in.Op == "sub" {
					sign = -1
				}
				for b, m := range v {
					if out[b] == nil {
						out[b] = diagMap{}
					}
					for d, vec := range m {
						acc := out[b][d]
						if acc == nil {
							acc = make([]complex128, slots)
							out[b][d] = acc
						}
						for t := range acc {
							acc[t] += sign * vec[t]
						}
					}
				}
			}
			val[in.Dst] = out
		}
	}
	res := get(e.plan.Program[f.at].Src)
	for _, b := range f.bases {
		if res[b] == nil {
			res[b] = diagMap{}
		}
	}
	return res, nil
}

func (e *executor) bootstrapCins(in instr) error {
	if e.btpEval == nil {
		return fmt.Errorf("the key block \"boot\" is not resident (the key schedule must load_key block \"boot\" before a bootstrap)")
	}
	if e.cins != nil && e.cins.err != nil {
		return e.cins.err
	}
	slots := e.params.MaxSlots()
	logN := e.params.LogN()
	var ct *rlwe.Ciphertext
	if f := e.cins.fused[e.cur]; f != nil {
		var err error
		if ct, err = e.fusedConv(f); err != nil {
			return err
		}
		e.st.CinsFused++
	} else {
		src, err := e.operand(in.Src, true)
		if err != nil {
			return err
		}
		ct = src
		if in.L < slots {
			m := s2Full(logN, slots, in.L)
			offs := m.offsets()
			if ct.Level() < 1 {
				return fmt.Errorf("S_(N/2<-l) takes one level, %q is at level 0", in.Src)
			}
			lt, err := e.cinsLT(fmt.Sprintf("stoc2/l%d", in.L), m, offs, ct.Level(), e.rescaleFactor(ct.Level()))
			if err != nil {
				return err
			}
			if ct, err = e.applyLT(ct, lt, offs); err != nil {
				return fmt.Errorf("S_(N/2<-l): %w", err)
			}
		}
	}
	e.beginBootstrap(in)
	levelIn := ct.Level()
	t := nowSeconds()
	re, im, err := neujeansBootTail(e.btpEval, ct.CopyNew(), DefaultBootLogGain)
	e.endBootstrap()
	if err != nil {
		return fmt.Errorf("bootstrap_cins of %q (level %d): %w", in.Src, levelIn, err)
	}
	e.st.BootstrapSeconds = append(e.st.BootstrapSeconds, nowSeconds()-t)
	e.st.BootstrapInLevels = append(e.st.BootstrapInLevels, levelIn)
	e.st.CinsOutLevels = append(e.st.CinsOutLevels, re.Level())
	// the levels SlotsToCoeffs leaves free: the plan keeps stoc_levels of them above the
	// top residual level (its depth -stoc_levels), the rest are dropped
	want := e.top
	if in.StocLevels != nil {
		want += *in.StocLevels
	}
	for _, c := range []*rlwe.Ciphertext{re, im} {
		if c.Level() < want {
			return fmt.Errorf("bootstrap_cins of %q: the plan keeps %d levels above the top %d, the bootstrap returned level %d", in.Src, want-e.top, e.top, c.Level())
		}
		if c.Level() > want {
			e.eval.DropLevel(c, c.Level()-want)
		}
	}
	e.set(in.Dsts[0], re)
	e.set(in.Dsts[1], im)
	return nil
}

// fusedConv evaluates a fused convolution's S_(N/2<-l) K_b on its bases and sums them
// (one level): what bootstrap_cins then bootstraps.
func (e *executor) fusedConv(f *cinsFusedConv) (*rlwe.Ciphertext, error) {
	slots := e.params.MaxSlots()
	logN := e.params.LogN()
	var ct *rlwe.Ciphertext
	cts := map[string]*rlwe.Ciphertext{}
	level := -1
	for _, b := range f.bases {
		c, err := e.operand(b, true)
		if err != nil {
			return nil, err
		}
		cts[b] = c
		if level < 0 || c.Level() < level {
			level = c.Level()
		}
	}
	if level < 1 {
		return nil, fmt.Errorf("the fused convolution needs one level, its input is at level %d", level)
	}
	var forms map[string]diagMap
	for _, b := range f.bases {
		name := fmt.Sprintf("fused/%d/%s", f.at, b)
		key := ptKey{"\x00cins/" + name, level, e.rescaleFactor(level).Float64()}
		e.cache.mu.Lock()
		_, cached := e.cache.lts[key]
		e.cache.mu.Unlock()
		var m diagMap
		if !cached {
			if forms == nil {
				var err error
				if forms, err = e.fusedForms(f); err != nil {
					return nil, err
				}
			}
			m = compose(s2Full(logN, slots, f.l), forms[b], slots)
		}
		lt, err := e.cinsLT(name, m, f.offs[b], level, e.rescaleFactor(level))
		if err != nil {
			return nil, err
		}
		c := cts[b]
		if c.Level() > level {
			c = c.CopyNew()
			e.eval.DropLevel(c, c.Level()-level)
		}
		out := e.newCt(level)
		if err = lintrans.NewEvaluator(e.eval).Evaluate(c, *lt, out); err != nil {
			return nil, fmt.Errorf("fused convolution: %w", err)
		}
		e.st.CinsFusedRotations += bsgsCount(f.offs[b], slots)
		if ct == nil {
			ct = out
		} else if err = e.eval.Add(ct, out, ct); err != nil {
			return nil, err
		}
	}
	var err error
	if ct, err = e.rescale(ct); err != nil {
		return nil, err
	}
	return ct, nil
}
