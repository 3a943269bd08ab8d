// A Go net/http WebSocket server behind spindle in the tests, over HTTP/1.1 (Upgrade, through
// Hijack) and h2c (prior knowledge; RFC 8441 extended CONNECT when started with
// GODEBUG=http2xconnect=1, which makes Go announce SETTINGS_ENABLE_CONNECT_PROTOCOL). Each
// connection echoes every message, and obeys a few text commands:
//
//	"info"     a text message: JSON of the request the upgrade came on (method, protocol,
//	           host, path, the X-Forwarded-* fields, Via, the HTTP version)
//	"big N"    a binary message of N bytes (i mod 251 each)
//	"pause N"  reads nothing for N milliseconds (the tunnel's window fills)
//	"reset"    ends the stream with RST_STREAM (HTTP/2) or closes the socket (HTTP/1.1)
//
// When the client ends its side without a close frame (END_STREAM, FIN), it sends the text
// "eof" and ends its own side. Each WebSocket that ends prints a line saying how:
// {"ended": "close"|"eof"|"reset"|"broken", "over": "HTTP/2.0"|"HTTP/1.1"}. Usage: go-ws [h1|h2c|both]; prints {"address": "127.0.0.1:PORT"}
// once listening. Built by scripts/install-go-ws.sh (the standard library only).
package main

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// frame is one WebSocket frame as read.
type frame struct {
	opcode  byte
	payload []byte
}

// readFrame reads one client frame (masked, RFC 6455 5.2), unmasked.
func readFrame(r io.Reader) (frame, error) {
	var head [2]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return frame{}, err
	}
	n := uint64(head[1] & 0x7f)
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return frame{}, err
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	} else if n == 127 {
		var ext [8]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return frame{}, err
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	var mask [4]byte
	if head[1]&0x80 != 0 {
		if _, err := io.ReadFull(r, mask[:]); err != nil {
			return frame{}, err
		}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return frame{}, io.ErrUnexpectedEOF
	}
	for i := range payload {
		payload[i] ^= mask[i%4]
	}
	return frame{head[0] & 0x0f, payload}, nil
}

// writeFrame writes one unmasked server frame and flushes it.
func writeFrame(w io.Writer, flush func(), opcode byte, payload []byte) error {
	head := []byte{0x80 | opcode}
	switch n := len(payload); {
	case n < 126:
		head = append(head, byte(n))
	case n < 65536:
		head = append(head, 126, byte(n>>8), byte(n))
	default:
		head = append(head, 127)
		head = binary.BigEndian.AppendUint64(head, uint64(n))
	}
	if _, err := w.Write(append(head, payload...)); err != nil {
		return err
	}
	flush()
	return nil
}

// info is what the upstream understood of the request that opened the WebSocket.
func info(r *http.Request) []byte {
	text, _ := json.Marshal(map[string]string{
		"method": r.Method, "protocol": r.Header.Get(":protocol"), "host": r.Host,
		"path": r.URL.RequestURI(), "proto": r.Proto,
		"x-forwarded-for":        r.Header.Get("X-Forwarded-For"),
		"x-forwarded-proto":      r.Header.Get("X-Forwarded-Proto"),
		"x-forwarded-host":       r.Header.Get("X-Forwarded-Host"),
		"via":                    r.Header.Get("Via"),
		"x-request-id":           r.Header.Get("X-Request-Id"),
		"sec-websocket-key":      r.Header.Get("Sec-WebSocket-Key"),
		"sec-websocket-protocol": r.Header.Get("Sec-WebSocket-Protocol"),
	})
	return text
}

// echo runs one WebSocket: messages back as they came, and the commands above. Returns how it
// ended (the connection is to end abruptly unless "close" or "eof").
func echo(r *http.Request, in io.Reader, out io.Writer, flush func()) string {
	how := run(r, in, out, flush)
	line, _ := json.Marshal(map[string]string{"ended": how, "over": r.Proto})
	fmt.Println(string(line))
	return how
}

func run(r *http.Request, in io.Reader, out io.Writer, flush func()) string {
	for {
		f, err := readFrame(in)
		if err == io.EOF {
			writeFrame(out, flush, 1, []byte("eof"))
			return "eof"
		}
		if err != nil {
			return "broken"
		}
		text := string(f.payload)
		switch {
		case f.opcode == 8:
			writeFrame(out, flush, 8, f.payload)
			return "close"
		case f.opcode == 9:
			err = writeFrame(out, flush, 10, f.payload)
		case f.opcode == 1 && text == "info":
			err = writeFrame(out, flush, 1, info(r))
		case f.opcode == 1 && text == "reset":
			return "reset"
		case f.opcode == 1 && strings.HasPrefix(text, "big "):
			n, _ := strconv.Atoi(text[4:])
			big := make([]byte, n)
			for i := range big {
				big[i] = byte(i % 251)
			}
			err = writeFrame(out, flush, 2, big)
		case f.opcode == 1 && strings.HasPrefix(text, "pause "):
			ms, _ := strconv.Atoi(text[6:])
			time.Sleep(time.Duration(ms) * time.Millisecond)
			err = writeFrame(out, flush, 1, []byte("resumed"))
		default:
			err = writeFrame(out, flush, f.opcode, f.payload)
		}
		if err != nil {
			return "broken"
		}
	}
}

// overHTTP2 answers an extended CONNECT (RFC 8441) with 200, then the stream is the WebSocket.
func overHTTP2(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Sec-WebSocket-Protocol", r.Header.Get("Sec-WebSocket-Protocol"))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	if how := echo(r, r.Body, w, func() { rc.Flush() }); how != "close" && how != "eof" {
		panic(http.ErrAbortHandler) // RST_STREAM
	}
}

// overHTTP1 answers an Upgrade with 101 (the key proved), then the socket is the WebSocket.
func overHTTP1(w http.ResponseWriter, r *http.Request) {
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(buf, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"+
		"Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n", base64.StdEncoding.EncodeToString(sum[:]))
	if p := r.Header.Get("Sec-WebSocket-Protocol"); p != "" {
		fmt.Fprintf(buf, "Sec-WebSocket-Protocol: %s\r\n", p)
	}
	buf.WriteString("\r\n")
	buf.Flush()
	if how := echo(r, buf.Reader, conn, func() {}); how == "close" || how == "eof" {
		if tcp, ok := conn.(*net.TCPConn); ok {
			tcp.CloseWrite()
			io.Copy(io.Discard, conn)
		}
	}
}

func main() {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect && r.Header.Get(":protocol") == "websocket":
			overHTTP2(w, r)
		case strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
			overHTTP1(w, r)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Write(info(r))
		}
	})
	mode := "both"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	var protocols http.Protocols
	protocols.SetHTTP1(mode != "h2c")
	protocols.SetUnencryptedHTTP2(mode != "h1")
	server := &http.Server{Handler: handler, Protocols: &protocols}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("{\"address\": \"%s\"}\n", listener.Addr())
	server.Serve(listener)
}
