package slotlattigo

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
)

// NeujeansLayers runs CinS layers encrypted (neujeans_driver.go) with one key directory and
// one bootstrapping evaluator, and returns a result JSON.
//
//   - paramsJSON: a plan's "params" object with "boot" (e.g. the n14boot preset).
//   - layersJSON: a list of layers, each {"l", "fused", "to_cins_levels", "stoc_levels",
//     "log_bsgs_ratio", "boot_log_gain" (neujeansSpec), "channels": C of the kernel (0: no
//     convolution)}.
//   - data: per layer, little-endian float64, concatenated: the input, then the kernel.
//     Input: with to_cins_levels > 0 the Re/Im pair of a cins(l) value (re then im,
//     2*slots values), encrypted by the client as two real ciphertexts; with
//     to_cins_levels = 0 the CinS slots themselves (real parts then imaginary parts,
//     2*slots values), encrypted as one complex ciphertext. Kernel: C = slots/l kernel
//     diagonals, each a cins(l) value of N = 2*slots values (diagonal d, slice i: the
//     kernel polynomial from input slice (i+d) mod C to output slice i).
//   - optionsJSON: "" or {"key_dir": where the client writes the keys (default: a
//     temporary directory removed afterwards)}.
//
// Result: {"layers": [{"re", "im" (base64 float64, slots each: the decrypted Re/Im pair of
// the result), "stats": neujeansStats}], "keys": neujeansKeys, "keygen_seconds",
// "boot_matrix_seconds", "build_seconds", "total_seconds", "peak_rss_bytes"}.
func NeujeansLayers(paramsJSON, layersJSON string, data []byte, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	defer releaseMemory()
	return neujeansLayers(paramsJSON, layersJSON, data, optionsJSON)
}

type neujeansLayerIn struct {
	neujeansSpec
	Channels int `json:"channels"`
}

type neujeansOptions struct {
	KeyDir string `json:"key_dir"`
	commonOptions
}

type neujeansLayerOut struct {
	Re    string        `json:"re"`
	Im    string        `json:"im"`
	Stats neujeansStats `json:"stats"`
}

type neujeansResult struct {
	Layers            []neujeansLayerOut `json:"layers"`
	Keys              neujeansKeys       `json:"keys"`
	KeygenSeconds     float64            `json:"keygen_seconds"`
	BootMatrixSeconds float64            `json:"boot_matrix_seconds"`
	BuildSeconds      float64            `json:"build_seconds"`
	TotalSeconds      float64            `json:"total_seconds"`
	PeakRSSBytes      int64              `json:"peak_rss_bytes"`
}

func neujeansLayers(paramsJSON, layersJSON string, data []byte, optionsJSON string) (string, error) {
	t0 := time.Now()
	var opt neujeansOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	resetPeakRSS()
	var pp planParams
	if err := json.Unmarshal([]byte(paramsJSON), &pp); err != nil {
		return "", fmt.Errorf("params are not valid JSON: %w", err)
	}
	if pp.Boot == nil {
		return "", fmt.Errorf("params: a NeuJeans layer needs a \"boot\" object (a bootstrapping preset such as n14boot)")
	}
	setup, err := pp.setup()
	if err != nil {
		return "", err
	}
	var layers []neujeansLayerIn
	if err := json.Unmarshal([]byte(layersJSON), &layers); err != nil {
		return "", fmt.Errorf("layers are not valid JSON: %w", err)
	}
	if len(layers) == 0 {
		return "", fmt.Errorf("layers: at least one layer")
	}
	slots := setup.params.MaxSlots()
	logN := setup.params.LogN()
	inputs := make([][]float64, len(layers))
	mats := make([]*neujeansMatrices, len(layers))
	ratios := make([]int, len(layers))
	offsets := map[int]bool{}
	pos := 0
	tb := time.Now()
	for i, ly := range layers {
		if ly.L < 1 || slots%ly.L != 0 {
			return "", fmt.Errorf("layers[%d].l = %d must be a power of two dividing %d slots", i, ly.L, slots)
		}
		if ly.Channels != 0 && ly.Channels != slots/ly.L {
			return "", fmt.Errorf("layers[%d].channels = %d, want slots/l = %d (or 0: no convolution)", i, ly.Channels, slots/ly.L)
		}
		in, err := unpack(fmt.Sprintf("layers[%d] input", i), sliceOf(data, pos, 2*slots), 1, 2*slots)
		if err != nil {
			return "", err
		}
		pos += 2 * slots * 8
		inputs[i] = in[0]
		var kd [][]float64
		if ly.Channels > 0 {
			if kd, err = unpack(fmt.Sprintf("layers[%d] kernel", i), sliceOf(data, pos, ly.Channels*2*slots), ly.Channels, 2*slots); err != nil {
				return "", err
			}
			pos += ly.Channels * 2 * slots * 8
		}
		if mats[i], err = buildNeujeans(logN, slots, ly.neujeansSpec, kd); err != nil {
			return "", fmt.Errorf("layers[%d]: %w", i, err)
		}
		ratios[i] = 1
		if ly.LogBSGSRatio != nil {
			ratios[i] = *ly.LogBSGSRatio
		}
		for _, k := range mats[i].keyOffsets(slots, ratios[i]) {
			offsets[k] = true
		}
	}
	if pos != len(data) {
		return "", fmt.Errorf("data: %d bytes, the layers describe %d", len(data), pos)
	}
	res := neujeansResult{BuildSeconds: time.Since(tb).Seconds()}
	var offs []int
	for k := range offsets {
		offs = append(offs, k)
	}
	sort.Ints(offs)
	dir := opt.KeyDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "slotplan-neujeans-keys-"); err != nil {
			return "", fmt.Errorf("cannot create a temporary key directory: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	env, err := newNeujeansEnv(setup, dir, offs)
	if err != nil {
		return "", err
	}
	res.Keys, res.KeygenSeconds, res.BootMatrixSeconds = env.keyInfo, env.KeygenSeconds, env.BootMatrixSeconds
	for i, ly := range layers {
		var ct *rlwe.Ciphertext
		if ly.ToCinsLevels > 0 {
			ct, err = env.toCinsInput(inputs[i][:slots], inputs[i][slots:])
		} else {
			z := make([]complex128, slots)
			for s := range z {
				z[s] = complex(inputs[i][s], inputs[i][slots+s])
			}
			ct, err = env.c.encryptComplex(z)
		}
		if err != nil {
			return "", fmt.Errorf("layers[%d]: %w", i, err)
		}
		var st neujeansStats
		re, im, err := env.run(ct, mats[i], ratios[i], ly.logGain(), &st)
		if err != nil {
			return "", fmt.Errorf("layers[%d]: %w", i, err)
		}
		vr, err := env.c.decrypt(re)
		if err != nil {
			return "", err
		}
		vi, err := env.c.decrypt(im)
		if err != nil {
			return "", err
		}
		res.Layers = append(res.Layers, neujeansLayerOut{Re: pack(vr), Im: pack(vi), Stats: st})
		releaseMemory()
	}
	res.TotalSeconds = time.Since(t0).Seconds()
	res.PeakRSSBytes = peakRSS()
	out, err := json.Marshal(res)
	return string(out), err
}

// sliceOf returns data[pos : pos+8n], or what is left when data is shorter (unpack then
// reports the length).
func sliceOf(data []byte, pos, n int) []byte {
	end := pos + 8*n
	if pos > len(data) {
		return nil
	}
	if end > len(data) {
		end = len(data)
	}
	return data[pos:end]
}
