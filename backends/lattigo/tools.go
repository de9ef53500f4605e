//go:build tools

package slotlattigo

// The Python wrapper that gopy generates imports gopyh; requiring it here keeps
// github.com/go-python/gopy in go.mod (and go.sum) through `go mod tidy`.
import _ "github.com/go-python/gopy/gopyh"
