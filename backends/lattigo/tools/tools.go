//go:build tools

// Package tools pins the code generators used by ../build.sh: gopy v0.4.10 (which wraps
// the backend for Python) and goimports, both built against golang.org/x/tools v0.39.0
// (the x/tools that gopy itself pins does not compile with recent Go releases).
package tools

import (
	_ "github.com/go-python/gopy"
	_ "golang.org/x/tools/cmd/goimports"
)
