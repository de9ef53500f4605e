package slotlattigo

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tuneinsight/lattigo/v6/circuits/ckks/bootstrapping"
	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

// The client holds the secret key: it generates the evaluation keys into a key directory,
// encrypts inputs and decrypts outputs. The evaluation side (executor, keyStore) only
// ever sees ciphertexts and the key directory.

const manifestName = "manifest.json"

type manifestKey struct {
	K             int    `json:"k"`
	GaloisElement uint64 `json:"galois_element"`
	File          string `json:"file"`
	Bytes         int    `json:"bytes"`
	LevelQ        int    `json:"level_q"`
	LevelP        int    `json:"level_p"`
	Conjugation   bool   `json:"conjugation,omitempty"`
	// Kind: "rotation", "conjugation" (complex packing) or "boot_galois" (a key of the
	// bootstrapping block)
	Kind string `json:"kind,omitempty"`
}

// keyManifest describes a key directory; Q and P identify the parameters the keys belong to.
// A directory written by keygen (inference.go) also names its format, the key set and the
// plan and parameters it was generated for (the evaluator refuses ciphertexts of another).
type keyManifest struct {
	Format       string        `json:"format,omitempty"`
	Version      int           `json:"version,omitempty"`
	KeySetID     string        `json:"key_set_id,omitempty"`
	PlanDigest   string        `json:"plan_digest,omitempty"`
	ParamsDigest string        `json:"params_digest,omitempty"`
	LogN         int           `json:"log_n"`
	Q            []uint64      `json:"q"`
	P            []uint64      `json:"p"`
	Relin        string        `json:"relin,omitempty"`
	RelinSize    int           `json:"relin_bytes,omitempty"`
	RelinLevel   *int          `json:"relin_level_q,omitempty"`
	Rotations    []manifestKey `json:"rotations"`
	Boot         *bootManifest `json:"boot,omitempty"`
}

// bootManifest describes the bootstrapping key block of a key directory: the keys of
// bootstrapping.Parameters.GenEvaluationKeys, one file per key.
type bootManifest struct {
	Literal            string        `json:"literal"`
	Galois             []manifestKey `json:"galois"`
	Relin              string        `json:"relin"`
	DenseToSparse      string        `json:"dense_to_sparse"`
	SparseToDense      string        `json:"sparse_to_dense"`
	Bytes              int64         `json:"bytes"`
	EvaluationKeysSize int           `json:"evaluation_keys_binary_size"`
	keygenSeconds      float64
}

type client struct {
	params ckks.Parameters
	top    int // level inputs are encrypted at
	sk     *rlwe.SecretKey
	kgen   *rlwe.KeyGenerator
	ecd    *ckks.Encoder
	enc    *rlwe.Encryptor
	dec    *rlwe.Decryptor

	// bootstrapping plans: the parameters and the residual secret the bootstrapping keys
	// are generated from (sk is the same key extended to the bootstrapping chain).
	btp  *bootstrapping.Parameters
	skN1 *rlwe.SecretKey
	boot *bootParams
	// the sparse bootstrap variants of the plan: their Galois keys join the block
	// (bootvariant.go)
	variants map[int]*bootstrapping.Parameters
}

func newClient(params ckks.Parameters) *client {
	return newSetupClient(&evalSetup{params: params, top: params.MaxLevel()})
}

// newSetupClient is the client of a plan's setup: for a bootstrapping plan the secret is
// generated on the residual parameters and extended to the bootstrapping chain, on which
// everything (keys, encryption, decryption) then happens.
func newSetupClient(s *evalSetup) *client {
	params := s.params
	c := &client{params: params, top: s.top, kgen: rlwe.NewKeyGenerator(params), btp: s.btp, boot: s.boot, variants: s.variants}
	if s.btp != nil {
		c.skN1 = rlwe.NewKeyGenerator(s.btp.ResidualParameters).GenSecretKeyNew()
		c.sk = extendSecret(*s.btp, c.skN1)
	} else {
		c.sk = c.kgen.GenSecretKeyNew()
	}
	c.ecd = newEncoder(params)
	c.enc = rlwe.NewEncryptor(params, c.sk)
	c.dec = rlwe.NewDecryptor(params, c.sk)
	return c
}

// clientWithSecret is the client of a plan's setup around a secret key read back from a
// secret key file (encrypt and decrypt; keygen made it with newSetupClient). It cannot
// generate bootstrapping keys (that needs the residual secret, used only by keygen).
func clientWithSecret(s *evalSetup, sk *rlwe.SecretKey) *client {
	c := &client{params: s.params, top: s.top, sk: sk, btp: s.btp, boot: s.boot}
	c.ecd = newEncoder(s.params)
	c.enc = rlwe.NewEncryptor(s.params, sk)
	c.dec = rlwe.NewDecryptor(s.params, sk)
	return c
}

// planKeys is what a plan needs generated: rotation offsets (for a bootstrapping plan those
// its boot block does not hold, and those it loads), each key's level (nil: every key at
// the key level), the relinearisation key, the bootstrapping block.
type planKeys struct {
	offsets   []int
	levels    map[int]int
	relin     bool
	withBlock bool
}

// planKeySet derives a plan's key set; fixedLevel drops the plan's per-key levels (an
// explicit key_level option of Run).
func planKeySet(p *plan, setup *evalSetup, fixedLevel bool) (planKeys, error) {
	var ks planKeys
	if _, uses := p.usesBootBlock(); uses && setup.btp != nil {
		ks.withBlock = true
	}
	ks.offsets = p.rotationOffsets()
	if ks.withBlock {
		ks.offsets = planKeyOffsets(p, setup.blockKeys())
	}
	levels, err := p.keyLevels()
	if err != nil {
		return ks, err
	}
	if fixedLevel {
		levels = nil // an explicit key_level option overrides the plan's per-key levels
	}
	for k, l := range levels {
		if l < 0 || l > setup.params.MaxLevel() {
			return ks, fmt.Errorf("keys: level %d of key %d outside 0..%d", l, k, setup.params.MaxLevel())
		}
	}
	ks.levels = levels
	// Without a key schedule the boot block stays resident and its relinearisation key
	// serves the plan's multiplications.
	ks.relin = p.needsRelin() && (p.hasKeySchedule() || !ks.withBlock)
	return ks, nil
}

// decryptOutputs decrypts one evaluation's output ciphertexts (one per "output"
// instruction, program order) into Run's output records.
func (c *client) decryptOutputs(p *plan, cts []*rlwe.Ciphertext) ([]outputRecord, error) {
	var outs []outputRecord
	for _, in := range p.Program {
		if in.Op != "output" {
			continue
		}
		n := len(outs)
		if n >= len(cts) {
			return nil, fmt.Errorf("%d output ciphertexts, the plan has more output instructions", len(cts))
		}
		v, err := c.decrypt(cts[n])
		if err != nil {
			return nil, err
		}
		outs = append(outs, outputRecord{Tensor: in.Tensor, Table: in.Table, Level: cts[n].Level(),
			Log2Scale: cts[n].Scale.Log2(), Data: pack(v)})
	}
	if len(outs) != len(cts) {
		return nil, fmt.Errorf("%d output ciphertexts for %d output instructions", len(cts), len(outs))
	}
	return outs, nil
}

// writeKeys generates one Galois key per rotation offset (at levels[k] when given, else at
// level keyLevelQ) and, when asked, the relinearisation key, writing each to dir as soon
// as it exists so at most one key is held in client memory. It returns the manifest plus
// generation and write times.
func (c *client) writeKeys(dir string, offsets []int, relin bool, keyLevelQ int, levels map[int]int) (m keyManifest, genSec, writeSec float64, err error) {
	return c.writeKeySet(dir, offsets, relin, keyLevelQ, levels, false)
}

// writeKeyFile writes one key object to path through a 1 MiB buffer (mode 0600), as the
// key store reads it.
func writeKeyFile(path string, obj io.WriterTo) error {
	err := writeFileSafely(path, 0o600, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if _, err := obj.WriteTo(bw); err != nil {
			return err
		}
		return bw.Flush()
	})
	if err != nil {
		return fmt.Errorf("cannot write key file %s: %w", path, err)
	}
	return nil
}

// writeFileSafely writes path through a new file in the same directory, created with
// O_EXCL|O_NOFOLLOW (never through a symbolic link or into a file another process left or
// planted), then renamed over path: a reader sees the old file or the whole new one, and
// a killed writer leaves at most its own temporary file, which is removed on error.
func writeFileSafely(path string, mode os.FileMode, write func(io.Writer) error) (err error) {
	var suffix [8]byte
	if _, err = rand.Read(suffix[:]); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp-%d-%x", path, os.Getpid(), suffix)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeKeySet is writeKeys, plus the bootstrapping key block when boot is set (see
// writeBootKeys).
func (c *client) writeKeySet(dir string, offsets []int, relin bool, keyLevelQ int, levels map[int]int, boot bool) (m keyManifest, genSec, writeSec float64, err error) {
	if err = os.MkdirAll(dir, 0o755); err != nil {
		return m, 0, 0, fmt.Errorf("cannot create key directory %s: %w", dir, err)
	}
	m = keyManifest{LogN: c.params.LogN(), Q: c.params.Q(), P: c.params.P(), Rotations: []manifestKey{}}
	write := func(name string, obj io.WriterTo) error {
		t := time.Now()
		defer func() { writeSec += time.Since(t).Seconds() }()
		return writeKeyFile(filepath.Join(dir, name), obj)
	}
	levelP := c.params.MaxLevelP()
	for _, k := range offsets {
		lq := keyLevelQ
		if l, ok := levels[k]; ok {
			lq = l
		}
		evkParams := rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &levelP}
		galEl := galoisOf(c.params, k) // (conjOffset: the conjugation key, complex packing)
		t := time.Now()
		gk := c.kgen.GenGaloisKeyNew(galEl, c.sk, evkParams)
		genSec += time.Since(t).Seconds()
		name := fmt.Sprintf("rot_%d.key", k)
		if k == conjOffset {
			name = "conj.key"
		}
		if err = write(name, gk); err != nil {
			return m, genSec, writeSec, err
		}
		kind := "rotation"
		if k == conjOffset {
			kind = "conjugation"
		}
		m.Rotations = append(m.Rotations, manifestKey{
			K: k, GaloisElement: galEl, File: name, Bytes: gk.BinarySize(),
			LevelQ: gk.LevelQ(), LevelP: gk.LevelP(), Conjugation: k == conjOffset, Kind: kind,
		})
	}
	if relin {
		t := time.Now()
		lq := c.top
		rlk := c.kgen.GenRelinearizationKeyNew(c.sk, rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &levelP})
		genSec += time.Since(t).Seconds()
		if err = write("relin.key", rlk); err != nil {
			return m, genSec, writeSec, err
		}
		m.Relin, m.RelinSize = "relin.key", rlk.BinarySize()
		rl := rlk.LevelQ()
		m.RelinLevel = &rl
	}
	if boot {
		var g float64
		m.Boot, g, err = c.writeBootKeys(write)
		genSec += g
		if m.Boot != nil {
			m.Boot.keygenSeconds = g
		}
		if err != nil {
			return m, genSec, writeSec, err
		}
	}
	return m, genSec, writeSec, writeManifest(dir, m)
}

// writeManifest writes a key directory's manifest.json.
func writeManifest(dir string, m keyManifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err == nil {
		err = writeFileSafely(filepath.Join(dir, manifestName), 0o644, func(w io.Writer) error {
			_, werr := w.Write(data)
			return werr
		})
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", manifestName, err)
	}
	return nil
}

// writeBootKeys generates the bootstrapping keys once (GenEvaluationKeys, from the
// residual secret) and writes them with write, one file per key: boot_gal_<element>.key
// for each Galois key, boot_relin.key and the two encapsulation keys. The generated keys
// are dropped before returning (the evaluation side reads them from the directory).
// It returns the generation time (write times are counted by write).
func (c *client) writeBootKeys(write func(string, io.WriterTo) error) (bm *bootManifest, genSec float64, err error) {
	t := time.Now()
	evk, skN2, err := c.btp.GenEvaluationKeys(c.skN1)
	if err != nil {
		return nil, 0, fmt.Errorf("bootstrapping key generation: %w", err)
	}
	genSec = time.Since(t).Seconds()
	if !skN2.Equal(c.sk) {
		return nil, genSec, fmt.Errorf("bootstrapping key generation used another secret than the client's")
	}
	full := bootKeyInfo(*c.btp)
	info := blockKeyInfo(*c.btp, c.variants) // with the variants' keys (one per Galois element)
	conj := c.params.GaloisElementForComplexConjugation()
	bm = &bootManifest{Literal: c.boot.Literal, EvaluationKeysSize: evk.BinarySize()}
	for _, g := range info.galEls {
		gk, err := evk.GetGaloisKey(g)
		if err != nil && full.byGalEl[g] == 0 && g != conj {
			// a key only a sparse variant uses: generated as GenEvaluationKeys does (the
			// bootstrapping chain's top level, from the same secret)
			t := time.Now()
			gk, err = c.kgen.GenGaloisKeyNew(g, c.sk), nil
			genSec += time.Since(t).Seconds()
		}
		if err != nil {
			return nil, genSec, fmt.Errorf("bootstrapping keys: %w", err)
		}
		name := fmt.Sprintf("boot_gal_%d.key", g)
		if err = write(name, gk); err != nil {
			return nil, genSec, err
		}
		bm.Galois = append(bm.Galois, manifestKey{K: info.byGalEl[g], GaloisElement: g, File: name,
			Bytes: gk.BinarySize(), LevelQ: gk.LevelQ(), LevelP: gk.LevelP(), Conjugation: g == conj, Kind: "boot_galois"})
		bm.Bytes += int64(gk.BinarySize())
	}
	if len(evk.GaloisKeys) != len(full.galEls) {
		return nil, genSec, fmt.Errorf("bootstrapping keys: %d Galois keys generated, %d expected", len(evk.GaloisKeys), len(full.galEls))
	}
	for _, f := range []struct {
		name string
		dst  *string
		obj  interface {
			io.WriterTo
			BinarySize() int
		}
	}{{"boot_relin.key", &bm.Relin, evk.RelinearizationKey}, {"boot_dense_to_sparse.key", &bm.DenseToSparse, evk.EvkDenseToSparse},
		{"boot_sparse_to_dense.key", &bm.SparseToDense, evk.EvkSparseToDense}} {
		if err = write(f.name, f.obj); err != nil {
			return nil, genSec, err
		}
		*f.dst = f.name
		bm.Bytes += int64(f.obj.BinarySize())
	}
	return bm, genSec, nil
}

// encrypt encodes a length-slots vector at the top level and the default scale.
func (c *client) encrypt(values []float64) (*rlwe.Ciphertext, error) {
	pt := ckks.NewPlaintext(c.params, c.top)
	if err := c.ecd.Encode(values, pt); err != nil {
		return nil, fmt.Errorf("cannot encode input: %w", err)
	}
	ct, err := c.enc.EncryptNew(pt)
	if err != nil {
		return nil, fmt.Errorf("cannot encrypt input: %w", err)
	}
	return ct, nil
}

// decrypt decrypts and decodes a ciphertext into its length-slots real vector.
func (c *client) decrypt(ct *rlwe.Ciphertext) ([]float64, error) {
	pt := c.dec.DecryptNew(ct)
	values := make([]float64, c.params.MaxSlots())
	if err := c.ecd.Decode(pt, values); err != nil {
		return nil, fmt.Errorf("cannot decode output: %w", err)
	}
	return values, nil
}

// newEncoder encodes with float64 FFTs: above a 53-bit scale Lattigo's default switches to
// big-float arithmetic, ~15x slower at LogN 16 (measured by slotplan calibrate), for no
// gain at CKKS precision (a float64 mantissa still carries 2^-53 relative error).
func newEncoder(params ckks.Parameters) *ckks.Encoder {
	return ckks.NewEncoder(params, 53)
}
