package slotlattigo

import (
	"fmt"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// Lazy relinearisation of sums of ciphertext products.
//
// A plan spells a sum of ct-ct products (a Rotom / FAME ct-ct matrix product: cmul of
// rotated operands and an add tree) as cmul instructions, each relinearised, and adds.
// The executor recognises such a sum from the dataflow (no attribute, no new op) and
// evaluates it with one relinearisation: the degree-2 tensor products accumulate
// (MulThenAdd) and the sum is relinearised once where the add tree ends.
//
// Rules (planner/ir/fusion.py product_sums applies the same):
//   - cmul(a, b) starts a sum of one term;
//   - add of two sums, each used only there (and not the same register), merges them;
//   - a sum not merged further with two or more terms is a root: evaluated at its last
//     add, its cmuls and adds skipped. Not under a key schedule (the relinearisation key
//     is then resident where the plan multiplies, not necessarily at the root).

type productSum struct {
	terms  [][2]string // (a, b) operand registers
	instrs []int
}

// analyseProductSums adds the product-sum roots of the plan to fp (not under a key
// schedule).
func analyseProductSums(p *plan, fp *fusionPlan) {
	if p.hasKeySchedule() {
		return
	}
	users := map[string]int{}
	for _, in := range p.Program {
		for _, r := range in.uses() {
			users[r]++
		}
	}
	sums := map[string]*productSum{}
	absorbed := map[string]bool{}
	for i, in := range p.Program {
		switch in.Op {
		case "cmul":
			sums[in.Dst] = &productSum{terms: [][2]string{{in.A, in.B}}, instrs: []int{i}}
		case "add":
			sa, sb := sums[in.A], sums[in.B]
			if sa == nil || sb == nil || in.A == in.B || users[in.A] != 1 || users[in.B] != 1 {
				continue
			}
			s := &productSum{terms: append(append([][2]string{}, sa.terms...), sb.terms...)}
			s.instrs = append(append(append([]int{}, sa.instrs...), sb.instrs...), i)
			sums[in.Dst] = s
			absorbed[in.A], absorbed[in.B] = true, true
		}
	}
	for r, s := range sums {
		if absorbed[r] || len(s.terms) < 2 {
			continue
		}
		at := s.instrs[len(s.instrs)-1]
		fp.sums[at] = s
		fp.rootDst[at] = r
		for _, i := range s.instrs {
			fp.skip[i] = true
		}
	}
}

// sumRegs lists the registers a product-sum root reads.
func (s *productSum) regs() []string {
	out := make([]string, 0, 2*len(s.terms))
	for _, t := range s.terms {
		out = append(out, t[0], t[1])
	}
	return out
}

// evalProductSum evaluates a product-sum root: every term's operands as cmul takes them
// (an unrescaled product rescaled first, the level checked), the tensor products
// accumulated in degree 2 at the lowest operand level, one relinearisation.
func (e *executor) evalProductSum(s *productSum) (*rlwe.Ciphertext, error) {
	type pair struct{ a, b *rlwe.Ciphertext }
	ops := make([]pair, len(s.terms))
	level := e.top
	for j, t := range s.terms {
		a, err := e.operand(t[0], true)
		if err != nil {
			return nil, err
		}
		b, err := e.operand(t[1], true)
		if err != nil {
			return nil, err
		}
		if err = e.checkMulLevel(t[0], a, 1); err != nil {
			return nil, err
		}
		if err = e.checkMulLevel(t[1], b, 1); err != nil {
			return nil, err
		}
		ops[j] = pair{a, b}
		level = min(level, a.Level(), b.Level())
	}
	rlk, err := e.keys.GetRelinearizationKey()
	if err != nil {
		return nil, fmt.Errorf("no relinearisation key resident: %w", err)
	}
	if rlk.LevelQ() < level {
		return nil, fmt.Errorf("the relinearisation key was generated at level %d, below the operands' level %d (it would give wrong results)",
			rlk.LevelQ(), level)
	}
	if e.sumAcc == nil || e.sumAcc.Level() < level {
		e.sumAcc = ckks.NewCiphertext(e.params, 2, level)
	}
	acc := e.sumAcc
	acc.Resize(2, level)
	for _, v := range acc.Value {
		v.Zero()
	}
	*acc.MetaData = *ops[0].a.MetaData
	acc.Scale = ops[0].a.Scale.Mul(ops[0].b.Scale)
	for _, o := range ops {
		if err = e.eval.MulThenAdd(o.a, o.b, acc); err != nil {
			return nil, err
		}
	}
	out := e.newCt(level)
	if err = e.eval.Relinearize(acc, out); err != nil {
		return nil, err
	}
	e.st.ProductSums++
	e.st.ProductSumTerms += len(ops)
	return out, nil
}
