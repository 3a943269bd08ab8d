// A Go net/http h2c upstream behind spindle in the tests (issue 70): /early answers at once
// without reading the request body, so Go's HTTP/2 server ends the stream with
// RST_STREAM(NO_ERROR) after its answer (RFC 9113 8.1); /sha reads the whole body and answers
// its SHA-256 and length; /stats answers how many connections were accepted and how many POSTs
// /early got. Usage: go-h2c-early; prints {"address": "127.0.0.1:PORT"} once listening. Built
// by scripts/install-go-echo.sh (the standard library only).
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
)

func main() {
	var connections, early atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/early", func(w http.ResponseWriter, r *http.Request) {
		early.Add(1)
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte("early"))
	})
	mux.HandleFunc("/sha", func(w http.ResponseWriter, r *http.Request) {
		sum := sha256.New()
		n, err := io.Copy(sum, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %d", hex.EncodeToString(sum.Sum(nil)), n)
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d %d", connections.Load(), early.Load())
	})
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	server.Protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge only
	server.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			connections.Add(1)
		}
	}
	fmt.Printf("{\"address\": \"%s\"}\n", listener.Addr())
	server.Serve(listener)
}
