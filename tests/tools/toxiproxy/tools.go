//go:build tools

// Package tools pins Toxiproxy, Shopify's fault-injection TCP proxy, for the fault tests
// (scripts/install-toxiproxy.sh builds its server from here, with these versions). A module of
// its own: its dependencies do not move those of the tools in tests/tools (h2spec).
package tools

import _ "github.com/Shopify/toxiproxy/v2/cmd/server"
