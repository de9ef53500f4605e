package slotlattigo

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

const planSchema = "slotplan.plan/1"

// planParams is the part of a plan's "params" object the backend reads (SPEC section 3).
type planParams struct {
	LogN     int   `json:"log_n"`
	LogQ     []int `json:"log_q"`
	LogP     []int `json:"log_p"`
	LogScale int   `json:"log_scale"`
	Slots    int   `json:"slots"`
	// Boot: the bootstrapping preset's object (boot.go); absent for plain presets.
	Boot *bootParams `json:"boot"`
}

type plaintextSpec struct {
	Source string `json:"source"`
	Table  string `json:"table"`
	// ImagTable: a complex plaintext (complex packing, docs/formats.md); its vector is
	// packed as 2*slots values, the real parts then the imaginary parts
	ImagTable string `json:"imag_table"`
	// L: a cins(l) plaintext (docs/cins.md): its vector is the 2*slots local coefficients,
	// encoded as the complex CinS slots (cinsSlots)
	L int `json:"l"`
}

// conjOffset stands for the conjugation key among the rotation offsets (key generation,
// the key store and the key count): no rotation has a negative offset.
const conjOffset = -1

// galoisOf is the Galois element of rotation offset k, or the conjugation's for conjOffset.
func galoisOf(params ckks.Parameters, k int) uint64 {
	if k == conjOffset {
		return params.GaloisElementForComplexConjugation()
	}
	return params.GaloisElement(k)
}

// instr is one program instruction (SPEC section 4). Which fields are used depends on Op.
type instr struct {
	Op     string    `json:"op"`
	Dst    string    `json:"dst"`
	Dsts   []string  `json:"dsts"`
	Src    string    `json:"src"`
	A      string    `json:"a"`
	B      string    `json:"b"`
	K      *int      `json:"k"`
	Ks     []int     `json:"ks"`
	Pt     string    `json:"pt"`
	Coeffs []float64 `json:"coeffs"`
	Basis  string    `json:"basis"`
	Domain []float64 `json:"domain"`
	// poly: a real slot plaintext; dst = mask * p(src) at the poly's depth (maskedPoly)
	Mask   string `json:"mask"`
	Tensor string `json:"tensor"`
	Table  string `json:"table"`
	Block  string `json:"block"`
	Stream *int   `json:"stream"` // load_key of the block: stream its Galois keys, this many read ahead
	// CinS (docs/neujeans.md): to_cins {dst, re, im (null: zero), l, levels} and
	// bootstrap_cins {dsts: [re, im], src, l, fused}; input with l is refused
	Re     string  `json:"re"`
	Im     *string `json:"im"`
	L      int     `json:"l"`
	Levels *int    `json:"levels"`
	Fused  *bool   `json:"fused"`
	Keys   []int   `json:"keys"` // CinS: the rotation keys the planner counted for the op (checked: checkCinsKeys)
	// bootstrap_cins: the SlotsToCoeffs levels its outputs keep above the top residual
	// level (docs/cins.md; absent: none)
	StocLevels *int `json:"stoc_levels"`
	// sparse bootstrap variants (issue 36, bootvariant.go): bootstrap {log_slots, halves,
	// scale} and bootstrap2 {dsts, srcs, log_slots, scale}
	Srcs     []string `json:"srcs"`
	LogSlots *int     `json:"log_slots"`
	Halves   *bool    `json:"halves"`
	Replicas *bool    `json:"replicas"`
	// premasked (halves only): the source carries the halves packing already (a poly's
	// complex mask), so no mask product comes before the bootstrap (bootvariant.go)
	Premasked *bool    `json:"premasked"`
	Scale     *float64 `json:"scale"`
	// in_scale (bootstrap, full or sparse): the source's scale is relabelled so that the
	// bootstrap refreshes src / in_scale (no product, no level; bootvariant.go)
	InScale *float64 `json:"in_scale"`
}

// givenBackLevels is the most SlotsToCoeffs levels a bootstrap_cins of the plan gives back:
// its registers reach the top residual level plus that, and so must its rotation keys when
// the plan records no per-key levels (planner.ir.analysis.default_key_level).
func (p *plan) givenBackLevels() int {
	n := 0
	for _, in := range p.Program {
		if in.Op == "bootstrap_cins" && in.StocLevels != nil && *in.StocLevels > n {
			n = *in.StocLevels
		}
	}
	return n
}

// defaultKeyLevel is the level of a key the plan records no level for.
func (p *plan) defaultKeyLevel(top int) int {
	return top + p.givenBackLevels()
}

// maxStreamDepth bounds a streamed block's read-ahead (keys resident at once: depth + 1).
const maxStreamDepth = 64

type plan struct {
	Schema     string                   `json:"schema"`
	Params     *planParams              `json:"params"`
	Plaintexts map[string]plaintextSpec `json:"plaintexts"`
	Program    []instr                  `json:"program"`
	// Keys: per rotation offset, the level its key is generated at (written by a key
	// schedule; a key used only at lower levels is smaller). Absent: all at one level.
	Keys map[string]planKey `json:"keys"`
	// Fused: the fused blocks the planner decided (docs/formats.md; fused.go readFusion),
	// kept raw so that a malformed one is refused with its field named
	Fused json.RawMessage `json:"fused"`
	// LevelDrops: instruction index (an input or a full-slot bootstrap) -> the level its
	// register is dropped to, the levels its consumers until the next bootstrap need
	// (planner.ir.analysis.level_drops; the Python backend adds it when it hands a plan
	// over, as it does "fused"; docs/lattigo.md). Absent: no drop.
	LevelDrops map[string]int `json:"level_drops"`
	// fusion: the checked blocks of Fused (loadPlan; nil until read)
	fusion *fusionPlan
}

type planKey struct {
	Level *int `json:"level"`
}

// keyLevels maps each offset with a recorded level to that level.
func (p *plan) keyLevels() (map[int]int, error) {
	out := map[int]int{}
	for ks, v := range p.Keys {
		var k int
		if _, err := fmt.Sscanf(ks, "%d", &k); err != nil {
			return nil, fmt.Errorf("keys: %q is not a rotation offset", ks)
		}
		if v.Level != nil {
			out[k] = *v.Level
		}
	}
	return out, nil
}

// opName is used in error messages; it never fails on an instruction without "op".
func (in instr) opName() string {
	if in.Op == "" {
		return "?"
	}
	return in.Op
}

// uses lists the registers an instruction reads.
func (in instr) uses() []string {
	switch in.Op {
	case "rot", "rot_hoisted", "pmul", "padd", "psub", "poly", "rescale", "bootstrap", "output", "mul_i", "conj":
		return []string{in.Src}
	case "add", "sub", "cmul":
		return []string{in.A, in.B}
	case "to_cins":
		if in.Im == nil {
			return []string{in.Re}
		}
		return []string{in.Re, *in.Im}
	case "bootstrap_cins":
		return []string{in.Src}
	case "bootstrap2":
		return in.Srcs
	}
	return nil
}

// defs lists the registers an instruction writes.
func (in instr) defs() []string {
	switch in.Op {
	case "rot_hoisted", "bootstrap_cins", "bootstrap2":
		return in.Dsts
	case "to_cins", "input", "rot", "add", "sub", "cmul", "pmul", "padd", "psub", "poly", "rescale", "bootstrap", "mul_i", "conj":
		return []string{in.Dst}
	}
	return nil
}

func parsePlan(planJSON string) (*plan, error) {
	dec := json.NewDecoder(strings.NewReader(planJSON))
	var p plan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("plan is not valid JSON for %s: %w", planSchema, err)
	}
	if p.Schema != planSchema {
		return nil, fmt.Errorf("plan schema is %q, expected %q", p.Schema, planSchema)
	}
	if p.Params == nil {
		return nil, fmt.Errorf("plan has no \"params\" object")
	}
	if p.Plaintexts == nil {
		p.Plaintexts = map[string]plaintextSpec{}
	}
	return &p, nil
}

// ckksParameters turns a plan's params object into Lattigo parameters.
func (pp *planParams) ckksParameters() (ckks.Parameters, error) {
	if pp.LogN < 10 || pp.LogN > 17 {
		return ckks.Parameters{}, fmt.Errorf("params: log_n must be in 10..17, got %d", pp.LogN)
	}
	if len(pp.LogQ) == 0 {
		return ckks.Parameters{}, fmt.Errorf("params: log_q must list at least one prime size")
	}
	if len(pp.LogP) == 0 {
		return ckks.Parameters{}, fmt.Errorf("params: log_p must list at least one prime size (rotations need key switching)")
	}
	if pp.LogScale < 10 || pp.LogScale > 120 {
		return ckks.Parameters{}, fmt.Errorf("params: log_scale must be in 10..120, got %d", pp.LogScale)
	}
	if slots := 1 << (pp.LogN - 1); pp.Slots != 0 && pp.Slots != slots {
		return ckks.Parameters{}, fmt.Errorf("params: slots = %d but log_n = %d gives %d slots", pp.Slots, pp.LogN, slots)
	}
	params, err := ckks.NewParametersFromLiteral(ckks.ParametersLiteral{
		LogN:            pp.LogN,
		LogQ:            pp.LogQ,
		LogP:            pp.LogP,
		LogDefaultScale: pp.LogScale,
	})
	if err != nil {
		return ckks.Parameters{}, fmt.Errorf("params: Lattigo rejects log_n=%d log_q=%v log_p=%v log_scale=%d: %w",
			pp.LogN, pp.LogQ, pp.LogP, pp.LogScale, err)
	}
	return params, nil
}

// validate checks the program's structure (SSA, operands, fields, offsets) before any
// cryptography runs, so errors name the instruction and the rule broken.
func (p *plan) validate(slots int) error {
	defined := map[string]int{}
	checkK := func(k int) error {
		if k < 1 || k >= slots {
			return fmt.Errorf("rotation offset k=%d outside 1..%d (offsets must be normalised mod slots)", k, slots-1)
		}
		return nil
	}
	for i, in := range p.Program {
		fail := func(format string, args ...any) error {
			return fmt.Errorf("instruction %d (%s): %s", i, in.opName(), fmt.Sprintf(format, args...))
		}
		need := func(field, value string) error {
			if value == "" {
				return fail("missing field %q", field)
			}
			return nil
		}
		var err error
		switch in.Op {
		case "input", "output":
			if in.Op == "input" && in.L != 0 {
				err = fail("a cins(l) input is not supported by the Lattigo executor (plans enter CinS through to_cins)")
			} else if in.Op == "input" {
				err = need("dst", in.Dst)
			} else {
				err = need("src", in.Src)
			}
			if err == nil {
				err = need("tensor", in.Tensor)
			}
			if err == nil {
				err = need("table", in.Table)
			}
		case "rot":
			if err = need("dst", in.Dst); err == nil {
				err = need("src", in.Src)
			}
			if err == nil && in.K == nil {
				err = fail("missing field \"k\"")
			}
			if err == nil {
				if e := checkK(*in.K); e != nil {
					err = fail("%v", e)
				}
			}
		case "rot_hoisted":
			err = need("src", in.Src)
			if err == nil && (len(in.Ks) == 0 || len(in.Ks) != len(in.Dsts)) {
				err = fail("needs non-empty \"ks\" and \"dsts\" of equal length (got %d and %d)", len(in.Ks), len(in.Dsts))
			}
			for j := 0; err == nil && j < len(in.Ks); j++ {
				if e := checkK(in.Ks[j]); e != nil {
					err = fail("%v", e)
				} else if in.Dsts[j] == "" {
					err = fail("dsts[%d] is empty", j)
				}
			}
		case "add", "sub", "cmul":
			if err = need("dst", in.Dst); err == nil {
				if err = need("a", in.A); err == nil {
					err = need("b", in.B)
				}
			}
		case "pmul", "padd", "psub":
			if err = need("dst", in.Dst); err == nil {
				if err = need("src", in.Src); err == nil {
					err = need("pt", in.Pt)
				}
			}
			if err == nil {
				if _, ok := p.Plaintexts[in.Pt]; !ok {
					err = fail("plaintext %q is not declared in \"plaintexts\"", in.Pt)
				}
			}
		case "poly":
			if err = need("dst", in.Dst); err == nil {
				err = need("src", in.Src)
			}
			if err == nil && len(in.Coeffs) == 0 {
				err = fail("missing or empty \"coeffs\"")
			}
			for _, c := range in.Coeffs {
				if err == nil && (math.IsNaN(c) || math.IsInf(c, 0)) {
					err = fail("coefficient %v is not finite", c)
				}
			}
			if err == nil {
				err = checkPolyBasis(in, fail)
			}
			if err == nil && in.Mask != "" {
				if pt, ok := p.Plaintexts[in.Mask]; !ok {
					err = fail("mask: plaintext %q is not declared in \"plaintexts\"", in.Mask)
				} else if pt.L > 0 {
					err = fail("mask: plaintext %q is a CinS plaintext, a poly's mask is a slot one", in.Mask)
				} else if polyDegree(in.Coeffs) == 0 {
					err = fail("mask: a masked poly has degree >= 1 (a constant's mask is a plaintext product)")
				}
			}
		case "rescale", "bootstrap", "mul_i", "conj":
			if err = need("dst", in.Dst); err == nil {
				err = need("src", in.Src)
			}
			if err == nil && in.Op == "bootstrap" {
				err = validateBootVariant(in, slots, fail)
			}
			if err == nil && in.Premasked != nil && *in.Premasked {
				err = p.checkPremasked(in, defined, fail)
			}
		case "bootstrap2":
			err = validateBootVariant(in, slots, fail)
		case "to_cins", "bootstrap_cins":
			err = validateCins(in, slots, fail)
		case "load_key", "drop_key":
			if in.Block != "" {
				if in.Block != "boot" {
					err = fail("unknown key block %q (the only block is \"boot\")", in.Block)
				} else if in.K != nil {
					err = fail("names both a key block and a rotation offset")
				} else if in.Stream != nil && (in.Op != "load_key" || *in.Stream < 0 || *in.Stream > maxStreamDepth) {
					err = fail("\"stream\" is a read-ahead depth in [0, %d] of a load_key of the block", maxStreamDepth)
				}
			} else if in.K == nil {
				err = fail("missing field \"k\"")
			} else if e := checkK(*in.K); e != nil {
				err = fail("%v", e)
			}
		case "":
			err = fail("missing field \"op\"")
		default:
			err = fail("unknown op %q (known: input rot rot_hoisted add sub pmul padd psub cmul poly rescale bootstrap to_cins bootstrap_cins load_key drop_key output mul_i conj bootstrap2)", in.Op)
		}
		if err != nil {
			return err
		}
		for _, r := range in.uses() {
			if _, ok := defined[r]; !ok {
				return fail("reads register %q before it is written", r)
			}
		}
		for _, r := range in.defs() {
			if j, ok := defined[r]; ok {
				return fail("writes register %q a second time (first written by instruction %d; programs are SSA)", r, j)
			}
			defined[r] = i
		}
	}
	return nil
}

// checkPremasked: a premasked halves bootstrap reads a register a poly with a complex mask
// wrote (the packing the executor then does not apply; the simulator checks the values).
func (p *plan) checkPremasked(in instr, defined map[string]int, fail func(string, ...any) error) error {
	j, ok := defined[in.Src]
	if !ok {
		return nil // (reported as a read before the write)
	}
	w := p.Program[j]
	if w.Op != "poly" || w.Mask == "" || p.Plaintexts[w.Mask].ImagTable == "" {
		return fail("field \"premasked\": register %q must be written by a poly with a complex mask (the halves packing), not by instruction %d (%s)", in.Src, j, w.opName())
	}
	return nil
}

// rotationOffsets returns the sorted distinct offsets the plan needs keys for (conjOffset
// first when the plan conjugates: the conjugation key).
func (p *plan) rotationOffsets() []int {
	set := map[int]bool{}
	for _, in := range p.Program {
		switch in.Op {
		case "conj":
			set[conjOffset] = true
		case "rot", "load_key":
			if in.K != nil {
				set[*in.K] = true
			}
		case "rot_hoisted":
			for _, k := range in.Ks {
				set[k] = true
			}
		}
	}
	for _, k := range p.cinsOffsets() { // the rotations inside to_cins and fused convolutions
		set[k] = true
	}
	ks := make([]int, 0, len(set))
	for k := range set {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// needsRelin reports whether the program multiplies two ciphertexts (cmul, poly of degree >= 2).
func (p *plan) needsRelin() bool {
	for _, in := range p.Program {
		if in.Op == "cmul" || (in.Op == "poly" && polyDegree(in.Coeffs) >= 2) {
			return true
		}
	}
	return false
}

func (p *plan) hasKeySchedule() bool {
	for _, in := range p.Program {
		if in.Op == "load_key" {
			return true
		}
	}
	return false
}

func (p *plan) count(op string) int {
	n := 0
	for _, in := range p.Program {
		if in.Op == op {
			n++
		}
	}
	return n
}

// usesConjugation reports whether the program conjugates (complex packing).
func (p *plan) usesConjugation() bool {
	for _, in := range p.Program {
		if in.Op == "conj" {
			return true
		}
	}
	return false
}

// plaintextWidths is the packed length of each plaintext's vector, in plaintextNames
// order: slots, or 2*slots for a complex plaintext (real parts, then imaginary parts).
func (p *plan) plaintextWidths(slots int) []int {
	names := p.plaintextNames()
	out := make([]int, len(names))
	for i, n := range names {
		out[i] = slots
		if p.Plaintexts[n].ImagTable != "" || p.Plaintexts[n].L > 0 {
			out[i] = 2 * slots
		}
	}
	return out
}

// plaintextNames returns the plaintext names in the order their vectors are packed.
func (p *plan) plaintextNames() []string {
	names := make([]string, 0, len(p.Plaintexts))
	for n := range p.Plaintexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// checkPolyBasis: basis "monomial" (or absent) without a domain, or "chebyshev" with a
// domain [a, b], a < b, both finite.
func checkPolyBasis(in instr, fail func(string, ...any) error) error {
	switch in.Basis {
	case "", "monomial":
		if in.Domain != nil {
			return fail("\"domain\" is only meaningful with basis \"chebyshev\"")
		}
	case "chebyshev":
		if len(in.Domain) != 2 || math.IsNaN(in.Domain[0]) || math.IsInf(in.Domain[0], 0) ||
			math.IsNaN(in.Domain[1]) || math.IsInf(in.Domain[1], 0) || !(in.Domain[0] < in.Domain[1]) {
			return fail("a chebyshev poly needs \"domain\" [a, b] with finite a < b, got %v", in.Domain)
		}
	default:
		return fail("unknown basis %q (known: monomial chebyshev)", in.Basis)
	}
	return nil
}

// unitDomain reports a Chebyshev poly over [-1, 1] (no change of variable needed).
func (in instr) unitDomain() bool {
	return len(in.Domain) == 2 && in.Domain[0] == -1 && in.Domain[1] == 1
}

// polyDegree is the degree after trailing zero coefficients are dropped.
func polyDegree(coeffs []float64) int {
	d := len(coeffs) - 1
	for d > 0 && coeffs[d] == 0 {
		d--
	}
	return d
}

// loadOffsets returns the offsets named by load_key instructions.
func (p *plan) loadOffsets() map[int]bool {
	out := map[int]bool{}
	for _, in := range p.Program {
		if in.Op == "load_key" && in.K != nil {
			out[*in.K] = true
		}
	}
	return out
}

// usesBootBlock reports whether the program bootstraps or loads the key block "boot".
func (p *plan) usesBootBlock() (int, bool) {
	for i, in := range p.Program {
		if in.Op == "bootstrap" || in.Op == "bootstrap2" || in.Op == "bootstrap_cins" || ((in.Op == "load_key" || in.Op == "drop_key") && in.Block != "") {
			return i, true
		}
	}
	return -1, false
}

// loadPlan parses a plan, builds its CKKS parameters and validates the program against
// the slot count: the shared first step of every entry point that executes a plan.
func loadPlan(planJSON string) (*plan, *evalSetup, int, error) {
	p, err := parsePlan(planJSON)
	if err != nil {
		return nil, nil, 0, err
	}
	setup, err := p.Params.setup()
	if err != nil {
		return nil, nil, 0, err
	}
	slots := setup.params.MaxSlots()
	if err = p.validate(slots); err != nil {
		return nil, nil, 0, err
	}
	if err = p.checkCinsKeys(slots); err != nil {
		return nil, nil, 0, err
	}
	if p.fusion, err = readFusion(p, slots); err != nil {
		return nil, nil, 0, err
	}
	if i, ok := p.usesBootBlock(); ok && setup.btp == nil {
		return nil, nil, 0, fmt.Errorf("instruction %d (%s): the plan's params carry no \"boot\" object (a bootstrapping preset is needed to bootstrap)",
			i, p.Program[i].Op)
	}
	if err = p.setupBootVariants(setup); err != nil {
		return nil, nil, 0, err
	}
	return p, setup, slots, nil
}
