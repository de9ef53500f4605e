package slotlattigo

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

type bytesWriterTo []byte

func (b bytesWriterTo) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b)
	return int64(n), err
}

// A key file is never written through a link planted at its path (the link is replaced, its
// target untouched), leaves no temporary file behind, and ends with mode 0600.
func TestWriteKeyFileReplacesLinksAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rot_1.key")
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	if err := writeKeyFile(path, bytesWriterTo("key bytes")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(victim); !bytes.Equal(got, []byte("keep")) {
		t.Fatalf("the link's target was written: %q", got)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSymlink != 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v", err, fi.Mode())
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, []byte("key bytes")) {
		t.Fatalf("key file holds %q", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("left behind: %v", entries)
	}
}
