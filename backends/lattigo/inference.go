package slotlattigo

// Private inference with the client and the evaluator apart (shared/SPEC.md section 7,
// docs/inference.md). Four entry points, each usable in its own process:
//
//   - Keygen (client): a fresh secret key into K/secret.key (mode 0600, created exclusively)
//     and every evaluation key the plan needs into K/eval (rotation keys at the levels of
//     the plan's key schedule, relinearisation key, bootstrapping keys) with manifest.json.
//   - Encrypt (client): reads K/secret.key, encrypts N samples' input vectors, writes the
//     ciphertexts framed (see below).
//   - Evaluate (evaluator): reads K/eval and the input ciphertexts, evaluates the plan once
//     per sample (key schedule, fused blocks, bootstraps exactly as Run), writes the output
//     ciphertexts. Its state (evaluator below) is built from the key store, the plan and
//     ciphertexts only: none of its types can reach an rlwe.SecretKey or the client
//     (TestEvaluatorReachesNoSecret walks them).
//   - Decrypt (client): reads K/secret.key and the output ciphertexts.
//
// Ciphertexts travel as a payload of frames, each an 8-byte little-endian length followed
// by Lattigo's MarshalBinary of one ciphertext; the self-describing file around a payload
// (header with plan, parameters and key set, per ciphertext its level and scale) is
// written and checked by the Python side (backends/inference.py), which passes the file
// and the payload's offset in it.

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tuneinsight/lattigo/v6/core/rlwe"
	"github.com/tuneinsight/lattigo/v6/schemes/ckks"
)

const (
	// secretKeyMagic opens a secret key file: then a 4-byte little-endian header length,
	// the JSON header (secretKeyHeader) and the secret key's MarshalBinary.
	secretKeyMagic         = "SLOTPLAN-SK\n"
	secretKeyFormat        = "slotplan.secret-key"
	evalKeysFormat         = "slotplan.eval-keys"
	inferenceFormatVersion = 1
	secretKeyName          = "secret.key"
	evalDirName            = "eval"
	// maxFrameBytes bounds one ciphertext frame (a corrupt length is refused before any
	// allocation): 2 polynomials of 2^17 coefficients over 64 primes is far below it.
	maxFrameBytes = 1 << 32
)

// secretKeyHeader is the JSON header of secret.key (no secret material in it).
type secretKeyHeader struct {
	Format       string `json:"format"`
	Version      int    `json:"version"`
	KeySetID     string `json:"key_set_id"`
	PlanDigest   string `json:"plan_digest"`
	ParamsDigest string `json:"params_digest"`
	LogN         int    `json:"log_n"`
	LevelQ       int    `json:"level_q"`
	Bytes        int    `json:"bytes"`
}

// identity names a key set and what it was generated for (given by the caller: the
// digests are computed in Python over the plan as the user holds it).
type identity struct {
	KeySetID     string `json:"key_set_id"`
	PlanDigest   string `json:"plan_digest"`
	ParamsDigest string `json:"params_digest"`
}

type keygenOptions struct {
	identity
	commonOptions
}

type keygenResult struct {
	KeyDir            string  `json:"key_dir"`
	SecretKeyFile     string  `json:"secret_key_file"`
	EvalDir           string  `json:"eval_dir"`
	SecretKeyBytes    int64   `json:"secret_key_bytes"`
	EvalBytes         int64   `json:"eval_bytes"` // every file of eval/, manifest included
	BytesWritten      int64   `json:"bytes_written"`
	Files             int     `json:"files"`
	RotationKeys      int     `json:"rotation_keys"`
	RelinKey          bool    `json:"relin_key"`
	BootKeyBytes      int64   `json:"boot_key_bytes"`
	KeygenSeconds     float64 `json:"keygen_seconds"`
	KeyWriteSeconds   float64 `json:"key_write_seconds"`
	BootKeygenSeconds float64 `json:"boot_keygen_seconds"`
	Seconds           float64 `json:"seconds"`
}

// Keygen generates a plan's key set into keyDir (client side): keyDir/secret.key and
// keyDir/eval (see the file comment). optionsJSON: {"key_set_id", "plan_digest",
// "params_digest"} recorded in both. An existing secret.key or a non-empty eval directory
// is refused (keys are never overwritten). Returns a keygenResult as JSON.
func Keygen(planJSON, keyDir, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	return keygen(planJSON, keyDir, optionsJSON)
}

func keygen(planJSON, keyDir, optionsJSON string) (string, error) {
	t0 := time.Now()
	var opt keygenOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	if opt.KeySetID == "" {
		return "", fmt.Errorf("options: key_set_id is required")
	}
	p, setup, _, err := loadPlan(planJSON)
	if err != nil {
		return "", err
	}
	defer withGCPercent(defaultGCPercent)()
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		return "", fmt.Errorf("cannot create key directory %s: %w", keyDir, err)
	}
	evalDir := filepath.Join(keyDir, evalDirName)
	if entries, err := os.ReadDir(evalDir); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("%s is not empty: keygen never overwrites keys (use a new key directory)", evalDir)
	}
	ks, err := planKeySet(p, setup, false)
	if err != nil {
		return "", err
	}
	t := time.Now()
	c := newSetupClient(setup)
	skSec := time.Since(t).Seconds()
	skPath := filepath.Join(keyDir, secretKeyName)
	hdr := secretKeyHeader{Format: secretKeyFormat, Version: inferenceFormatVersion, KeySetID: opt.KeySetID,
		PlanDigest: opt.PlanDigest, ParamsDigest: opt.ParamsDigest, LogN: c.params.LogN(),
		LevelQ: c.sk.LevelQ(), Bytes: c.sk.BinarySize()}
	skBytes, err := writeSecretKey(skPath, hdr, c.sk)
	if err != nil {
		return "", err
	}
	m, genSec, writeSec, err := c.writeKeySet(evalDir, ks.offsets, ks.relin, p.defaultKeyLevel(setup.top), ks.levels, ks.withBlock)
	if err != nil {
		return "", err
	}
	m.Format, m.Version = evalKeysFormat, inferenceFormatVersion
	m.KeySetID, m.PlanDigest, m.ParamsDigest = opt.KeySetID, opt.PlanDigest, opt.ParamsDigest
	if err := writeManifest(evalDir, m); err != nil {
		return "", err
	}
	releaseMemory()
	res := keygenResult{KeyDir: keyDir, SecretKeyFile: skPath, EvalDir: evalDir, SecretKeyBytes: skBytes,
		RotationKeys: len(m.Rotations), RelinKey: m.Relin != "", KeygenSeconds: skSec + genSec, KeyWriteSeconds: writeSec}
	if m.Boot != nil {
		res.BootKeyBytes, res.BootKeygenSeconds = m.Boot.Bytes, m.Boot.keygenSeconds
	}
	entries, err := os.ReadDir(evalDir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return "", err
		}
		res.EvalBytes += fi.Size()
		res.Files++
	}
	res.Files++ // secret.key
	res.BytesWritten = res.EvalBytes + res.SecretKeyBytes
	res.Seconds = time.Since(t0).Seconds()
	data, err := json.Marshal(res)
	return string(data), err
}

// writeSecretKey creates path exclusively (mode 0600, never following a link) and writes
// the secret key file; it returns the bytes written. A failed write removes the file.
func writeSecretKey(path string, hdr secretKeyHeader, sk *rlwe.SecretKey) (int64, error) {
	head, err := json.Marshal(hdr)
	if err != nil {
		return 0, err
	}
	body, err := sk.MarshalBinary()
	if err != nil {
		return 0, fmt.Errorf("cannot serialise the secret key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("%s exists: keygen never overwrites keys (use a new key directory)", path)
		}
		return 0, fmt.Errorf("cannot create %s: %w", path, err)
	}
	var lenBuf [4]byte
	binary.LittleEndian.PutUint32(lenBuf[:], uint32(len(head)))
	var n int64
	for _, part := range [][]byte{[]byte(secretKeyMagic), lenBuf[:], head, body} {
		k, werr := f.Write(part)
		n += int64(k)
		if werr != nil {
			err = werr
			break
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return 0, fmt.Errorf("cannot write %s: %w", path, err)
	}
	return n, nil
}

// readSecretKey reads a secret key file for the setup's parameters.
func readSecretKey(path string, setup *evalSetup) (*rlwe.SecretKey, secretKeyHeader, error) {
	var hdr secretKeyHeader
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, hdr, fmt.Errorf("cannot read the secret key: %w", err)
	}
	if len(data) < len(secretKeyMagic)+4 || string(data[:len(secretKeyMagic)]) != secretKeyMagic {
		return nil, hdr, fmt.Errorf("%s is not a slotplan secret key file", path)
	}
	at := len(secretKeyMagic)
	hl := int(binary.LittleEndian.Uint32(data[at:]))
	at += 4
	if hl > len(data)-at {
		return nil, hdr, fmt.Errorf("%s is truncated (header)", path)
	}
	if err := json.Unmarshal(data[at:at+hl], &hdr); err != nil {
		return nil, hdr, fmt.Errorf("%s: header is not valid JSON: %w", path, err)
	}
	at += hl
	if hdr.Format != secretKeyFormat || hdr.Version != inferenceFormatVersion {
		return nil, hdr, fmt.Errorf("%s: format %q version %d, expected %q version %d", path, hdr.Format, hdr.Version, secretKeyFormat, inferenceFormatVersion)
	}
	if hdr.LogN != setup.params.LogN() || hdr.Bytes != len(data)-at {
		return nil, hdr, fmt.Errorf("%s holds a key for log_n %d (%d bytes), not for these parameters (log_n %d) or it is truncated",
			path, hdr.LogN, len(data)-at, setup.params.LogN())
	}
	sk := new(rlwe.SecretKey)
	if err := sk.UnmarshalBinary(data[at:]); err != nil {
		return nil, hdr, fmt.Errorf("%s: the secret key is corrupt: %w", path, err)
	}
	if sk.LevelQ() != hdr.LevelQ || sk.Value.Q.N() != setup.params.N() {
		return nil, hdr, fmt.Errorf("%s: the secret key does not match these parameters", path)
	}
	return sk, hdr, nil
}

// ciphertext frames -------------------------------------------------------------------

type ctMeta struct {
	Level     int     `json:"level"`
	Log2Scale float64 `json:"log2_scale"`
	Bytes     int     `json:"bytes"`
}

// writeFrames writes ciphertexts as frames to path (created or truncated, mode 0644).
func writeFrames(path string, cts []*rlwe.Ciphertext) ([]ctMeta, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cannot write ciphertexts: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	metas := make([]ctMeta, 0, len(cts))
	for _, ct := range cts {
		var lenBuf [8]byte
		binary.LittleEndian.PutUint64(lenBuf[:], uint64(ct.BinarySize()))
		if _, err = w.Write(lenBuf[:]); err != nil {
			break
		}
		if _, err = ct.WriteTo(w); err != nil {
			break
		}
		metas = append(metas, ctMeta{Level: ct.Level(), Log2Scale: ct.Scale.Log2(), Bytes: ct.BinarySize()})
	}
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("cannot write ciphertexts to %s: %w", path, err)
	}
	return metas, nil
}

// readFrames reads n ciphertext frames from path starting at offset; the payload must end
// exactly after them.
func readFrames(path string, offset int64, n int, params ckks.Parameters) ([]*rlwe.Ciphertext, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read ciphertexts: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("ciphertexts: %w", err)
	}
	r := bufio.NewReaderSize(f, 1<<20)
	cts := make([]*rlwe.Ciphertext, 0, n)
	for i := 0; i < n; i++ {
		var lenBuf [8]byte
		if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
			return nil, fmt.Errorf("ciphertext %d of %d: truncated file", i, n)
		}
		size := binary.LittleEndian.Uint64(lenBuf[:])
		if size == 0 || size > maxFrameBytes {
			return nil, fmt.Errorf("ciphertext %d: corrupt frame length %d", i, size)
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("ciphertext %d of %d: truncated file", i, n)
		}
		ct := new(rlwe.Ciphertext)
		if err := ct.UnmarshalBinary(buf); err != nil {
			return nil, fmt.Errorf("ciphertext %d is corrupt: %w", i, err)
		}
		if ct.Degree() != 1 || ct.Value[0].N() != params.N() || ct.Level() > params.MaxLevel() {
			return nil, fmt.Errorf("ciphertext %d (degree %d, ring degree %d, level %d) is not a ciphertext of these parameters (ring degree %d, levels 0..%d)",
				i, ct.Degree(), ct.Value[0].N(), ct.Level(), params.N(), params.MaxLevel())
		}
		cts = append(cts, ct)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		return nil, fmt.Errorf("ciphertexts: data after the %d expected ciphertexts", n)
	}
	return cts, nil
}

// Encrypt (client) ---------------------------------------------------------------------

// clientPlan is Encrypt's and Decrypt's common start: the options decoded, the plan loaded
// with its parameters and slot count, and a sample count of at least one.
func clientPlan(planJSON, optionsJSON string, samples int) (*plan, *evalSetup, int, error) {
	var opt commonOptions
	if err := decodeOptions(optionsJSON, &opt, &opt); err != nil {
		return nil, nil, 0, err
	}
	p, setup, slots, err := loadPlan(planJSON)
	if err != nil {
		return nil, nil, 0, err
	}
	if samples < 1 {
		return nil, nil, 0, fmt.Errorf("samples must be >= 1, got %d", samples)
	}
	return p, setup, slots, nil
}

type encryptResult struct {
	Ciphertexts []ctMeta  `json:"ciphertexts"`    // sample-major: sample 0's inputs, then sample 1's, ...
	Seconds     []float64 `json:"sample_seconds"` // encryption seconds per sample
	KeySetID    string    `json:"key_set_id"`
}

// Encrypt encrypts samples sets of input vectors (inputs: samples x (one length-slots
// vector per "input" instruction, program order), little-endian float64) under the secret
// key file skPath and writes them as frames to outPath. Returns an encryptResult as JSON.
func Encrypt(planJSON, skPath string, inputs []byte, samples int, outPath, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	p, setup, slots, err := clientPlan(planJSON, optionsJSON, samples)
	if err != nil {
		return "", err
	}
	nIn := p.count("input")
	vecs, err := unpack("inputs", inputs, samples*nIn, slots)
	if err != nil {
		return "", err
	}
	sk, hdr, err := readSecretKey(skPath, setup)
	if err != nil {
		return "", err
	}
	c := clientWithSecret(setup, sk)
	res := encryptResult{KeySetID: hdr.KeySetID}
	cts := make([]*rlwe.Ciphertext, 0, len(vecs))
	for s := 0; s < samples; s++ {
		t := time.Now()
		for _, v := range vecs[s*nIn : (s+1)*nIn] {
			ct, err := c.encrypt(v)
			if err != nil {
				return "", err
			}
			cts = append(cts, ct)
		}
		res.Seconds = append(res.Seconds, time.Since(t).Seconds())
	}
	if res.Ciphertexts, err = writeFrames(outPath, cts); err != nil {
		return "", err
	}
	data, err := json.Marshal(res)
	return string(data), err
}

// Decrypt (client) ---------------------------------------------------------------------

type decryptResult struct {
	Samples  [][]outputRecord `json:"samples"` // per sample, one record per "output" instruction
	Seconds  []float64        `json:"sample_seconds"`
	KeySetID string           `json:"key_set_id"`
}

// Decrypt reads samples sets of output ciphertexts (one per "output" instruction each) from
// ctPath at offset and decrypts them with the secret key file skPath. Returns a
// decryptResult as JSON (the vectors base64 as in Run's outputs).
func Decrypt(planJSON, skPath, ctPath string, offset int64, samples int, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	p, setup, _, err := clientPlan(planJSON, optionsJSON, samples)
	if err != nil {
		return "", err
	}
	nOut := p.count("output")
	cts, err := readFrames(ctPath, offset, samples*nOut, setup.params)
	if err != nil {
		return "", err
	}
	sk, hdr, err := readSecretKey(skPath, setup)
	if err != nil {
		return "", err
	}
	c := clientWithSecret(setup, sk)
	res := decryptResult{KeySetID: hdr.KeySetID}
	for s := 0; s < samples; s++ {
		t := time.Now()
		outs, err := c.decryptOutputs(p, cts[s*nOut:(s+1)*nOut])
		if err != nil {
			return "", err
		}
		res.Samples = append(res.Samples, outs)
		res.Seconds = append(res.Seconds, time.Since(t).Seconds())
	}
	data, err := json.Marshal(res)
	return string(data), err
}

// Evaluate (evaluator) -----------------------------------------------------------------

// evaluator is everything the evaluation side holds: the plan, the key store over the
// evaluation key directory, the plaintext cache and the executor (whose io is a ctIO of
// ciphertexts). None of these types has a path to an rlwe.SecretKey or to the client
// (TestEvaluatorReachesNoSecret): the secret key is not in this process's reach even by
// mistake.
type evaluator struct {
	setup *evalSetup
	plan  *plan
	keys  *keyStore
	cache *ptCache
	ex    *executor
}

type evaluateOptions struct {
	PayloadOffset int64  `json:"payload_offset"`
	PlaintextFile string `json:"plaintext_file"`
	// CacheKey: keep the encoded plaintexts (the weights) in this process under this key
	// (the caller's plan and weights digests) for later calls; "" keeps them for this
	// call's samples only.
	CacheKey string `json:"cache_key"`
	// CacheBytes bounds the kept encodings (default 1 GiB; beyond it plaintexts are
	// encoded when used, as Run does).
	CacheBytes *int64 `json:"cache_bytes"`
	// PlaintextStore: a directory for the process's plaintext store (ptstore.go): the
	// plaintexts the cache does not keep are spilled there when first encoded and read back
	// by later calls instead of encoded again (bounded by PlaintextStoreMaxBytes, 0: the
	// store's default).
	PlaintextStore         string `json:"plaintext_store"`
	PlaintextStoreMaxBytes int64  `json:"plaintext_store_max_bytes"`
	GCPercent              *int   `json:"gc_percent"`
	MemoryLimitExtraBytes  int64  `json:"memory_limit_extra_bytes"`
	identity
	commonOptions
}

type sampleStats struct {
	EvalSeconds  float64            `json:"eval_seconds"`
	EncodeSecs   float64            `json:"encode_seconds"`
	OpCounts     map[string]int     `json:"op_counts"`
	OpSeconds    map[string]float64 `json:"op_seconds"`
	Rotations    int                `json:"rotations"`
	KeyLoads     int                `json:"key_loads"`
	Bootstraps   int                `json:"bootstraps"`
	BootSeconds  []float64          `json:"bootstrap_seconds"`
	FusedBlocks  int                `json:"fused_blocks"`
	MaxScaleFix  float64            `json:"max_scale_fix"`
	PeakCtBytes  int64              `json:"peak_ciphertext_bytes"`
	PeakKeyBytes int64              `json:"peak_key_bytes"`
	// the bootstrapping state (bootstate.go): the DFT matrices' encoding inside
	// eval_seconds, how many times this sample encoded them (0: an earlier sample's or
	// call's were used), and eval_seconds without them
	BootMatrixSeconds     float64 `json:"boot_matrix_seconds"`
	BootMatrixBuilds      int     `json:"boot_matrix_builds"`
	BootStateReused       bool    `json:"boot_state_reused"`
	EvalSecondsNoMatrices float64 `json:"eval_seconds_without_matrices"`
}

type evaluateResult struct {
	Outputs        []ctMeta      `json:"outputs"` // sample-major, one per "output" instruction
	Samples        []sampleStats `json:"samples"`
	SetupSeconds   float64       `json:"setup_seconds"`
	KeyLoadSeconds float64       `json:"key_load_seconds"`
	KeyLoadBytes   int64         `json:"key_load_bytes"`
	CacheHit       bool          `json:"cache_hit"`
	CachedBytes    int64         `json:"cached_plaintext_bytes"`
	Seconds        float64       `json:"seconds"`
	// the plaintext store's work in this call (option plaintext_store; nil without it)
	PlaintextStore *ptStoreStats `json:"plaintext_store,omitempty"`
}

// servingKeys keeps the key store of the last evaluation key directory a serving process
// (one that passes a cache key: an evaluation worker holding one plan, key set and
// weights) evaluated with, so that the keys it loaded stay resident for the next request
// instead of being read from disk again. One store, used by one call at a time: a call
// that finds it busy, or asks for another directory, opens its own (and leaves it as the
// kept one when it is done). A key directory is never rewritten in place (an upload gets
// a new directory), so a kept store cannot go stale.
var servingKeys = struct {
	sync.Mutex
	dir  string
	s    *keyStore
	busy bool
}{}

func servingKeyStore(dir string, params ckks.Parameters, keep bool) (*keyStore, error) {
	if !keep {
		return openKeyStore(dir, params)
	}
	servingKeys.Lock()
	if servingKeys.s != nil && servingKeys.dir == dir && !servingKeys.busy && servingKeys.s.params.Equal(&params) {
		servingKeys.busy = true
		s := servingKeys.s
		servingKeys.Unlock()
		return s, nil
	}
	servingKeys.Unlock()
	s, err := openKeyStore(dir, params)
	if err != nil {
		return nil, err
	}
	servingKeys.Lock()
	if !servingKeys.busy {
		servingKeys.dir, servingKeys.s, servingKeys.busy = dir, s, true
	}
	servingKeys.Unlock()
	return s, nil
}

// releaseServingKeys marks the kept store free again once the call that used it is done.
func releaseServingKeys(s *keyStore) {
	servingKeys.Lock()
	if servingKeys.s == s {
		servingKeys.busy = false
	}
	servingKeys.Unlock()
}

// serverCaches keeps the plaintext caches of recent (plan, weights) pairs across Evaluate
// calls of one process (a server): the weights are encoded once.
var serverCaches = struct {
	sync.Mutex
	order []string
	m     map[string]*ptCache
}{m: map[string]*ptCache{}}

const serverCacheEntries = 2

func serverCache(key string, limit int64) (*ptCache, bool) {
	serverCaches.Lock()
	defer serverCaches.Unlock()
	if c, ok := serverCaches.m[key]; ok {
		return c, true
	}
	c := newPtCache(limit)
	serverCaches.m[key] = c
	serverCaches.order = append(serverCaches.order, key)
	if len(serverCaches.order) > serverCacheEntries {
		delete(serverCaches.m, serverCaches.order[0])
		serverCaches.order = serverCaches.order[1:]
	}
	return c, false
}

// Evaluate evaluates a plan on samples sets of input ciphertexts (frames in ctPath from
// the payload_offset option on) with the evaluation keys of evalDir, and writes the output
// ciphertexts as frames to outPath. plaintexts: the plan's plaintext vectors packed as for
// Run (or empty with the plaintext_file option). optionsJSON: evaluateOptions; its
// key_set_id, plan_digest and params_digest, when given, must be the manifest's. Nothing
// here reads a secret key. Returns an evaluateResult as JSON.
func Evaluate(planJSON, evalDir, ctPath string, samples int, plaintexts []byte, outPath, optionsJSON string) (result string, err error) {
	defer recoverError(&err)
	t0 := time.Now()
	var opt evaluateOptions
	if err := decodeOptions(optionsJSON, &opt, &opt.commonOptions); err != nil {
		return "", err
	}
	p, setup, slots, err := loadPlan(planJSON)
	if err != nil {
		return "", err
	}
	if samples < 1 {
		return "", fmt.Errorf("samples must be >= 1, got %d", samples)
	}
	gcPercent := defaultGCPercent
	if opt.GCPercent != nil {
		gcPercent = *opt.GCPercent
	}
	defer withGCPercent(gcPercent)()
	if opt.MemoryLimitExtraBytes > 0 {
		defer withMemoryLimit(goMappedBytes() + opt.MemoryLimitExtraBytes)()
	}
	ptValues, ptFile, err := planPlaintexts(p, plaintexts, opt.PlaintextFile, slots)
	if err != nil {
		return "", err
	}
	if ptFile != nil {
		defer ptFile.close()
	}
	nIn := p.count("input")
	cts, err := readFrames(ctPath, opt.PayloadOffset, samples*nIn, setup.params)
	if err != nil {
		return "", err
	}
	limit := int64(1 << 30)
	if opt.CacheBytes != nil {
		limit = *opt.CacheBytes
	}
	res := evaluateResult{}
	ts := time.Now()
	var store *ptStore
	if opt.PlaintextStore != "" {
		if store, err = openPtStore(opt.PlaintextStore, setup.params, opt.PlaintextStoreMaxBytes, opt.CacheKey); err != nil {
			return "", err
		}
	}
	ev, hit, err := newEvaluator(evalDir, setup, p, ptValues, ptFile, opt.CacheKey, limit, opt.identity, store)
	if err != nil {
		return "", err
	}
	defer releaseServingKeys(ev.keys)
	// a kept key store counts across calls: this call's reads are the difference
	load0, read0 := ev.keys.loadSeconds, ev.keys.readBytes.Load()
	res.CacheHit = hit
	res.SetupSeconds = time.Since(ts).Seconds()
	var outs []*rlwe.Ciphertext
	for s := 0; s < samples; s++ {
		o, ss, err := ev.evaluate(cts[s*nIn : (s+1)*nIn])
		if err != nil {
			if samples > 1 {
				return "", fmt.Errorf("sample %d: %w", s, err)
			}
			return "", err
		}
		outs = append(outs, o...)
		res.Samples = append(res.Samples, ss)
	}
	if res.Outputs, err = writeFrames(outPath, outs); err != nil {
		return "", err
	}
	res.KeyLoadSeconds, res.KeyLoadBytes = ev.keys.loadSeconds-load0, ev.keys.readBytes.Load()-read0
	res.CachedBytes = ev.cache.bytes
	if store != nil {
		ss := store.finish()
		res.PlaintextStore = &ss
	}
	res.Seconds = time.Since(t0).Seconds()
	data, err := json.Marshal(res)
	return string(data), err
}

// newEvaluator opens the evaluation key directory (checking its manifest against want's
// non-empty fields) and builds the executor.
func newEvaluator(evalDir string, setup *evalSetup, p *plan, ptValues map[string][]float64, ptFile *plaintextFile,
	cacheKey string, cacheLimit int64, want identity, store *ptStore) (*evaluator, bool, error) {
	// keys stay resident across calls only where no schedule loads and drops them
	keys, err := servingKeyStore(evalDir, setup.params, cacheKey != "" && !p.hasKeySchedule())
	if err != nil {
		return nil, false, err
	}
	m := keys.manifest
	for _, f := range []struct{ name, have, want string }{
		{"key_set_id", m.KeySetID, want.KeySetID}, {"plan_digest", m.PlanDigest, want.PlanDigest},
		{"params_digest", m.ParamsDigest, want.ParamsDigest},
	} {
		if f.want != "" && f.have != f.want {
			releaseServingKeys(keys)
			return nil, false, fmt.Errorf("evaluation keys %s: manifest %s %.12s... differs from the ciphertexts' %.12s...", evalDir, f.name, f.have, f.want)
		}
	}
	cache, hit := newPtCache(cacheLimit), false
	if cacheKey != "" {
		cache, hit = serverCache(cacheKey, cacheLimit)
	}
	ev := &evaluator{setup: setup, plan: p, keys: keys, cache: cache}
	st := newSampleStats(setup, p)
	ev.ex = newExecutor(setup, keys, p, ptValues, &ctIO{}, st, executorOptions{Cache: cache, Store: store})
	ev.ex.ptFile = ptFile
	return ev, hit, nil
}

func newSampleStats(setup *evalSetup, p *plan) *stats {
	st := &stats{
		LogN: setup.params.LogN(), Slots: setup.params.MaxSlots(), MaxLevel: setup.top,
		OpCounts: map[string]int{}, OpSeconds: map[string]float64{},
		KeyMode: "keep_all", BootstrapSeconds: []float64{}, BootstrapInLevels: []int{},
	}
	if p.hasKeySchedule() {
		st.KeyMode = "scheduled"
	}
	return st
}

// evaluate runs the plan on one sample's input ciphertexts and returns its outputs.
func (ev *evaluator) evaluate(inputs []*rlwe.Ciphertext) ([]*rlwe.Ciphertext, sampleStats, error) {
	st := newSampleStats(ev.setup, ev.plan)
	io := &ctIO{inputs: inputs}
	ev.ex.reset(io, st)
	loads0, enc0 := ev.keys.loads, ev.cache.seconds
	ev.keys.peakBytes, ev.keys.peakCount = ev.keys.residentBytes, 0
	t := time.Now()
	if err := ev.ex.run(); err != nil {
		return nil, sampleStats{}, err
	}
	ss := sampleStats{
		EvalSeconds: time.Since(t).Seconds(), EncodeSecs: ev.cache.seconds - enc0, OpCounts: st.OpCounts, OpSeconds: st.OpSeconds,
		Rotations: st.Rotations, KeyLoads: ev.keys.loads - loads0, Bootstraps: len(st.BootstrapSeconds),
		BootSeconds: st.BootstrapSeconds, FusedBlocks: st.FusedBlocks, MaxScaleFix: st.MaxScaleFix,
		PeakCtBytes: st.PeakCiphertextBytes, PeakKeyBytes: ev.keys.peakBytes,
		BootMatrixSeconds: st.BootMatrixSeconds, BootMatrixBuilds: st.BootMatrixBuilds, BootStateReused: st.BootStateReused,
	}
	ss.EvalSecondsNoMatrices = ss.EvalSeconds - st.BootMatrixSeconds
	if len(io.outputs) != ev.plan.count("output") {
		return nil, ss, fmt.Errorf("%d output ciphertexts for %d output instructions", len(io.outputs), ev.plan.count("output"))
	}
	return io.outputs, ss, nil
}
