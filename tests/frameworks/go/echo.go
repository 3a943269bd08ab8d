// A Go net/http server behind spindle in the tests: it answers every request with what it
// understood of it, as JSON, and prints the same as a line (the fields
// tests/integration/test_framework_upstreams.py compares with what the gateway judged). An upgrade to WebSocket is accepted (101, through Hijack) and
// the same JSON sent as one text message. Usage: echo NAME; prints {"address": "127.0.0.1:PORT"}
// once listening. Built by scripts/install-go-echo.sh (the standard library only).
package main

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
)

type understood struct {
	Framework       string            `json:"framework"`
	Method          string            `json:"method"`
	Host            string            `json:"host"`
	Path            string            `json:"path"`
	Query           string            `json:"query"`
	Authorization   *string           `json:"authorization"`
	BasicUser       *string           `json:"basic_user"`
	User            *string           `json:"user"`
	Role            *string           `json:"role"`
	Cookies         map[string]string `json:"cookies"`
	RequestID       *string           `json:"request_id"`
	ForwardedFor    *string           `json:"forwarded_for"`
	ForwardedHost   *string           `json:"forwarded_host"`
	ForwardedProto  *string           `json:"forwarded_proto"`
	ForwardedURI    *string           `json:"forwarded_uri"`
	ForwardedMethod *string           `json:"forwarded_method"`
	Fields          [][2]string       `json:"fields"`
}

// field is the field's first value, as Header.Get reads it, or nil.
func field(r *http.Request, name string) *string {
	if _, ok := r.Header[http.CanonicalHeaderKey(name)]; !ok {
		return nil
	}
	v := r.Header.Get(name)
	return &v
}

// printed serialises the lines of concurrent requests.
var printed sync.Mutex

// report prints what was understood of `r` as a line, and returns it as JSON.
func report(r *http.Request) []byte {
	text, _ := json.Marshal(describe(r))
	printed.Lock()
	os.Stdout.Write(append(text, '\n'))
	printed.Unlock()
	return text
}

func describe(r *http.Request) understood {
	u := understood{Framework: os.Args[1], Method: r.Method, Host: r.Host, Path: r.URL.Path,
		Query: r.URL.RawQuery, Cookies: map[string]string{}}
	u.Authorization = field(r, "Authorization")
	if user, _, ok := r.BasicAuth(); ok {
		u.BasicUser = &user
	}
	u.User, u.Role = field(r, "X-User"), field(r, "X-Role")
	for _, c := range r.Cookies() {
		if _, seen := u.Cookies[c.Name]; !seen {
			u.Cookies[c.Name] = c.Value // the first of a name, as r.Cookie(name) gives it
		}
	}
	u.RequestID = field(r, "X-Request-Id")
	u.ForwardedFor, u.ForwardedHost = field(r, "X-Forwarded-For"), field(r, "X-Forwarded-Host")
	u.ForwardedProto = field(r, "X-Forwarded-Proto")
	u.ForwardedURI, u.ForwardedMethod = field(r, "X-Forwarded-Uri"), field(r, "X-Forwarded-Method")
	for name, values := range r.Header {
		for _, v := range values {
			u.Fields = append(u.Fields, [2]string{name, v})
		}
	}
	return u
}

// upgrade answers a WebSocket handshake with 101, then the JSON as one text frame.
func upgrade(w http.ResponseWriter, r *http.Request) {
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	payload := report(r)
	frame := []byte{0x81, byte(len(payload))}
	if len(payload) >= 126 {
		frame = []byte{0x81, 126, byte(len(payload) >> 8), byte(len(payload))}
	}
	fmt.Fprintf(buf, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"+
		"Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]))
	buf.Write(frame)
	buf.Write(payload)
	buf.Flush()
}

func main() {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			upgrade(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(report(r))
	})
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("{\"address\": \"%s\"}\n", listener.Addr())
	http.Serve(listener, handler)
}
