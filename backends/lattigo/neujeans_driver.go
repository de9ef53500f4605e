package slotlattigo

import (
	"fmt"
	"math/big"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// The NeuJeans bootstrapping driver: a CinS layer on one ciphertext in NeuJeans' order
// (Alg. 1 with Sec. 4's fusion), on the bootstrapping parameters (boot.go):
//
//	to_cins:  z = re + i im (a monomial product, no level), c = S_(l<-1) z   [to_cins_levels]
//	conv:     y = K c (BSGS over the C slices, offsets b l and g B l)         [1 level]
//	          fused: y' = (S_(N/2<-l) K) c, the same C diagonals             [1 level]
//	StoC2:    y' = S_(N/2<-l) y (unfused only)                               [stoc_levels]
//	bootstrap: scale by SlotsToCoeffs' Scaling, ScaleDown, ModUp, CoeffsToSlots, EvalMod on
//	          both halves: the Re/Im pair of the result (docs/cins.md, bootstrap_cins).
//
// The client (holding the secret) writes the bootstrapping key block and the layer's extra
// rotation keys (offsets the block does not hold) into a key directory; the evaluation
// side reads them (keyStore) and never holds the secret key.

// neujeansEnv is the evaluation side plus its client, built once for several layers.
type neujeansEnv struct {
	setup   *evalSetup
	c       *client
	keys    *keyStore
	eval    *ckks.Evaluator
	btpEval *bootstrapping.Evaluator
	ecd     *ckks.Encoder
	keyInfo neujeansKeys
	// seconds spent generating keys (client) and encoding Lattigo's DFT matrices
	KeygenSeconds, BootMatrixSeconds float64
}

// neujeansKeys is the key model of the layers' extra keys.
type neujeansKeys struct {
	Offsets        []int `json:"offsets"`          // every rotation the layers use
	InBlock        []int `json:"in_block"`         // served by the bootstrapping block
	Extra          []int `json:"extra"`            // generated for the layers
	ExtraCount     int   `json:"extra_count"`      // len(Extra)
	ExtraBytes     int64 `json:"extra_bytes"`      // their BinarySize, as generated (level_q)
	ExtraKeyBytes  int   `json:"extra_key_bytes"`  // one of them
	ExtraLevelQ    int   `json:"extra_level_q"`    // the level they are generated at
	FullChainBytes int   `json:"full_chain_bytes"` // one key on the whole bootstrapping chain
	BlockBytes     int64 `json:"block_bytes"`      // the bootstrapping block (Galois + relin + encapsulation)
	BlockGalois    int   `json:"block_galois"`     // Galois keys of the block
}

// newNeujeansEnv generates the keys (client side) for the given rotation offsets into dir
// and builds the evaluation side from that directory.
func newNeujeansEnv(setup *evalSetup, dir string, offsets []int) (*neujeansEnv, error) {
	if setup.btp == nil {
		return nil, fmt.Errorf("a NeuJeans layer needs params with a \"boot\" object")
	}
	info := bootKeyInfo(*setup.btp)
	env := &neujeansEnv{setup: setup, c: newSetupClient(setup), ecd: newEncoder(setup.params)}
	ki := neujeansKeys{Offsets: offsets, ExtraLevelQ: setup.top, BlockGalois: len(info.galEls)}
	inBlock := map[int]bool{}
	for _, k := range info.offsets {
		inBlock[k] = true
	}
	for _, k := range offsets {
		if inBlock[k] {
			ki.InBlock = append(ki.InBlock, k)
		} else {
			ki.Extra = append(ki.Extra, k)
		}
	}
	ki.ExtraCount = len(ki.Extra)
	t := time.Now()
	m, _, _, err := env.c.writeKeySet(dir, ki.Extra, false, setup.top, nil, true)
	if err != nil {
		return nil, err
	}
	env.KeygenSeconds = time.Since(t).Seconds()
	for _, mk := range m.Rotations {
		ki.ExtraBytes += int64(mk.Bytes)
		ki.ExtraKeyBytes = mk.Bytes
	}
	lq, lp := setup.params.MaxLevelQ(), setup.params.MaxLevelP()
	ki.FullChainBytes = rlwe.NewGaloisKey(setup.params, rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &lp}).BinarySize()
	ki.BlockBytes = m.Boot.Bytes
	env.keyInfo = ki
	releaseMemory()

	// Evaluation side: the keys from the directory, Lattigo's bootstrapping evaluator
	// around the executor-style evaluator (boot.go).
	if env.keys, err = openKeyStore(dir, setup.params); err != nil {
		return nil, err
	}
	if err = env.keys.loadAll(); err != nil {
		return nil, err
	}
	env.eval = ckks.NewEvaluator(setup.params, env.keys)
	t = time.Now()
	ev, err := newBootEvaluator(*setup.btp, info.galEls)
	if err != nil {
		return nil, err
	}
	env.BootMatrixSeconds = time.Since(t).Seconds()
	releaseMemory()
	if err = env.keys.loadBlock(-1); err != nil {
		return nil, err
	}
	wireBootEvaluator(ev, env.eval, env.keys.block)
	env.btpEval = ev
	return env, nil
}

// neujeansStats describes one layer run.
type neujeansStats struct {
	Steps            []ltStep `json:"steps"`
	Rotations        int      `json:"rotations"`         // all matrices
	ConvRotations    int      `json:"conv_rotations"`    // conv (fused or not) + StoC2
	LevelIn          int      `json:"level_in"`          // of the input ciphertext(s)
	LevelBeforeBoot  int      `json:"level_before_boot"` // after the last matrix
	ConvLevels       int      `json:"conv_levels"`       // levels of conv + StoC2
	ToCinsLevels     int      `json:"to_cins_levels"`    // levels of S_(l<-1)
	LevelOut         int      `json:"level_out"`         // of the Re/Im outputs
	EncodeSeconds    float64  `json:"encode_seconds"`    // encoding them
	LinearSeconds    float64  `json:"linear_seconds"`    // evaluating them
	BootstrapSeconds float64  `json:"bootstrap_seconds"` // ScaleDown .. EvalMod
	StocScaling      float64  `json:"stoc_scaling"`      // the factor applied before ScaleDown (SlotsToCoeffs' Scaling * 2^gain)
	BootLogGain      int      `json:"boot_log_gain"`     // neujeansSpec.BootLogGain
	PlaintextBytes   int64    `json:"plaintext_bytes"`   // encoded matrices of the layer
}

// encryptComplex encrypts complex slots at the top residual level.
func (c *client) encryptComplex(values []complex128) (*rlwe.Ciphertext, error) {
	pt := ckks.NewPlaintext(c.params, c.top)
	if err := c.ecd.Encode(values, pt); err != nil {
		return nil, fmt.Errorf("cannot encode input: %w", err)
	}
	return c.enc.EncryptNew(pt)
}

// run evaluates a layer's matrices on ct (a CinS ciphertext when the matrices have no
// S_(l<-1), else the complex z = re + i im) and bootstraps: the Re and Im ciphertexts.
func (env *neujeansEnv) run(ct *rlwe.Ciphertext, mats *neujeansMatrices, logRatio, logGain int, st *neujeansStats) (re, im *rlwe.Ciphertext, err error) {
	st.LevelIn = ct.Level()
	names, ms := mats.all()
	nToCins := len(mats.toCins)
	for i, m := range ms {
		var s ltStep
		if ct, s, err = evalDiagMap(env.eval, env.ecd, ct, names[i], m, logRatio); err != nil {
			return nil, nil, err
		}
		st.Steps = append(st.Steps, s)
		st.Rotations += s.Rotations
		st.EncodeSeconds += s.EncodeSeconds
		st.LinearSeconds += s.EvalSeconds
		st.PlaintextBytes += s.PlaintextByte
		if i < nToCins {
			st.ToCinsLevels += s.LevelIn - s.LevelOut
		} else {
			st.ConvRotations += s.Rotations
			st.ConvLevels += s.LevelIn - s.LevelOut
		}
		releaseMemory()
	}
	st.LevelBeforeBoot = ct.Level()
	ev := env.btpEval
	st.StocScaling = neujeansScaling(ev, logGain)
	st.BootLogGain = logGain
	t := time.Now()
	if re, im, err = neujeansBootTail(ev, ct, logGain); err != nil {
		return nil, nil, err
	}
	st.BootstrapSeconds = time.Since(t).Seconds()
	st.LevelOut = re.Level()
	return re, im, nil
}

// toCinsInput is the client's input of a layer with S_(l<-1): the pair (re, im) encrypted
// as two real ciphertexts, combined by the evaluation side into z = re + i im.
func (env *neujeansEnv) toCinsInput(re, im []float64) (*rlwe.Ciphertext, error) {
	cr, err := env.c.encrypt(re)
	if err != nil {
		return nil, err
	}
	ci, err := env.c.encrypt(im)
	if err != nil {
		return nil, err
	}
	if err = env.eval.Mul(ci, 1i, ci); err != nil {
		return nil, err
	}
	if err = env.eval.Add(cr, ci, cr); err != nil {
		return nil, err
	}
	return cr, nil
}

// neujeansScaling is the factor the message is multiplied by before ScaleDown:
// SlotsToCoeffs' Scaling (bootstrapping.Evaluator.initialize) times 2^logGain.
func neujeansScaling(ev *bootstrapping.Evaluator, logGain int) float64 {
	f, _ := new(big.Float).Mul(ev.SlotsToCoeffsParameters.Scaling, new(big.Float).SetMantExp(big.NewFloat(1), logGain)).Float64()
	return f
}

// neujeansBootTail bootstraps a ciphertext whose slots already went through SlotsToCoeffs
// (NeuJeans' order): SlotsToCoeffs' scaling (applied to the scale, no cost), ScaleDown,
// ModUp, CoeffsToSlots and EvalMod on both halves; the gain 2^logGain
// (neujeansSpec.BootLogGain) is undone on the outputs' scales. ct is consumed.
func neujeansBootTail(ev *bootstrapping.Evaluator, ct *rlwe.Ciphertext, logGain int) (re, im *rlwe.Ciphertext, err error) {
	scaling := new(big.Float).Mul(ev.SlotsToCoeffsParameters.Scaling, new(big.Float).SetMantExp(big.NewFloat(1), logGain))
	ct.Scale = ct.Scale.Div(rlwe.NewScale(scaling))
	if ct, _, err = ev.ScaleDown(ct); err != nil {
		return nil, nil, fmt.Errorf("ScaleDown: %w", err)
	}
	if ct, err = ev.ModUp(ct); err != nil {
		return nil, nil, fmt.Errorf("ModUp: %w", err)
	}
	if re, im, err = ev.CoeffsToSlots(ct); err != nil {
		return nil, nil, fmt.Errorf("CoeffsToSlots: %w", err)
	}
	if re, err = ev.EvalMod(re); err != nil {
		return nil, nil, fmt.Errorf("EvalMod: %w", err)
	}
	if im, err = ev.EvalMod(im); err != nil {
		return nil, nil, fmt.Errorf("EvalMod: %w", err)
	}
	gain := rlwe.NewScale(new(big.Float).SetMantExp(big.NewFloat(1), logGain))
	re.Scale, im.Scale = re.Scale.Mul(gain), im.Scale.Mul(gain)
	return re, im, nil
}
