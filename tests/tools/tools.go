//go:build tools

// Package tools pins the test tools spindle builds with the Go toolchain: h2spec, the HTTP/2
// conformance suite (scripts/install-h2spec.sh builds it from here, with these versions).
package tools

import (
	_ "github.com/summerwind/h2spec/config"
	_ "github.com/summerwind/h2spec/spec"
	_ "github.com/spf13/cobra" // h2spec's command line
)
