package slotlattigo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

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
}

// keyManifest describes a key directory; Q and P identify the parameters the keys belong to.
type keyManifest struct {
	LogN      int           `json:"log_n"`
	Q         []uint64      `json:"q"`
	P         []uint64      `json:"p"`
	Relin     string        `json:"relin,omitempty"`
	RelinSize int           `json:"relin_bytes,omitempty"`
	Rotations []manifestKey `json:"rotations"`
}

type client struct {
	params ckks.Parameters
	sk     *rlwe.SecretKey
	kgen   *rlwe.KeyGenerator
	ecd    *ckks.Encoder
	enc    *rlwe.Encryptor
	dec    *rlwe.Decryptor
}

func newClient(params ckks.Parameters) *client {
	kgen := rlwe.NewKeyGenerator(params)
	sk := kgen.GenSecretKeyNew()
	return &client{
		params: params,
		sk:     sk,
		kgen:   kgen,
		ecd:    newEncoder(params),
		enc:    rlwe.NewEncryptor(params, sk),
		dec:    rlwe.NewDecryptor(params, sk),
	}
}

// writeKeys generates one Galois key per rotation offset (at levels[k] when given, else at
// level keyLevelQ) and, when asked, the relinearisation key, writing each to dir as soon
// as it exists so at most one key is held in client memory. It returns the manifest plus
// generation and write times.
func (c *client) writeKeys(dir string, offsets []int, relin bool, keyLevelQ int, levels map[int]int) (m keyManifest, genSec, writeSec float64, err error) {
	if err = os.MkdirAll(dir, 0o755); err != nil {
		return m, 0, 0, fmt.Errorf("cannot create key directory %s: %w", dir, err)
	}
	m = keyManifest{LogN: c.params.LogN(), Q: c.params.Q(), P: c.params.P(), Rotations: []manifestKey{}}
	write := func(name string, obj io.WriterTo) error {
		t := time.Now()
		defer func() { writeSec += time.Since(t).Seconds() }()
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("cannot write key file: %w", err)
		}
		w := bufio.NewWriterSize(f, 1<<20)
		if _, err = obj.WriteTo(w); err == nil {
			err = w.Flush()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("cannot write key file %s: %w", path, err)
		}
		return nil
	}
	levelP := c.params.MaxLevelP()
	for _, k := range offsets {
		lq := keyLevelQ
		if l, ok := levels[k]; ok {
			lq = l
		}
		evkParams := rlwe.EvaluationKeyParameters{LevelQ: &lq, LevelP: &levelP}
		galEl := c.params.GaloisElement(k)
		t := time.Now()
		gk := c.kgen.GenGaloisKeyNew(galEl, c.sk, evkParams)
		genSec += time.Since(t).Seconds()
		name := fmt.Sprintf("rot_%d.key", k)
		if err = write(name, gk); err != nil {
			return m, genSec, writeSec, err
		}
		m.Rotations = append(m.Rotations, manifestKey{
			K: k, GaloisElement: galEl, File: name, Bytes: gk.BinarySize(),
			LevelQ: gk.LevelQ(), LevelP: gk.LevelP(),
		})
	}
	if relin {
		t := time.Now()
		rlk := c.kgen.GenRelinearizationKeyNew(c.sk)
		genSec += time.Since(t).Seconds()
		if err = write("relin.key", rlk); err != nil {
			return m, genSec, writeSec, err
		}
		m.Relin, m.RelinSize = "relin.key", rlk.BinarySize()
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, manifestName), data, 0o644)
	}
	if err != nil {
		return m, genSec, writeSec, fmt.Errorf("cannot write %s: %w", manifestName, err)
	}
	return m, genSec, writeSec, nil
}

// encrypt encodes a length-slots vector at the top level and the default scale.
func (c *client) encrypt(values []float64) (*rlwe.Ciphertext, error) {
	pt := ckks.NewPlaintext(c.params, c.params.MaxLevel())
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
