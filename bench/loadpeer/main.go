// The other ends of bench/hard_loads.py: an upstream that answers late, big or after reading a
// big body, and clients that read slowly. The standard library only. Built by the script.
//
//	loadpeer upstream -listen 127.0.0.1:9000
//	    GET /plaintext        "Hello, World!"
//	    GET /delay/MS         "Hello, World!" after MS milliseconds
//	    GET /bytes/N          N bytes (Content-Length)
//	    POST /upload          reads the body, answers its length
//	loadpeer slowclients -url http://127.0.0.1:8080/bytes/1048576 -connections 200
//	    -rate 262144 -seconds 10
//	    each connection asks for the URL again and again on one keep-alive connection and reads
//	    the answer at RATE bytes a second (a small receive buffer, so that the kernel does not
//	    read ahead for it); prints one JSON line: responses, bytes, errors
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: loadpeer upstream|slowclients [flags]")
	}
	switch os.Args[1] {
	case "upstream":
		upstream(os.Args[2:])
	case "slowclients":
		slowClients(os.Args[2:])
	default:
		log.Fatalf("loadpeer: no mode %q", os.Args[1])
	}
}

var hello = []byte("Hello, World!")

func upstream(args []string) {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:9000", "address")
	threads := fs.Int("threads", 1, "GOMAXPROCS")
	fs.Parse(args)
	runtime.GOMAXPROCS(*threads)
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = 'a' + byte(i%26)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /plaintext", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(hello)
	})
	mux.HandleFunc("GET /delay/{ms}", func(w http.ResponseWriter, r *http.Request) {
		ms, err := strconv.Atoi(r.PathValue("ms"))
		if err != nil || ms < 0 || ms > 60000 {
			http.Error(w, "bad delay", http.StatusBadRequest)
			return
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		w.Header().Set("Content-Type", "text/plain")
		w.Write(hello)
	})
	mux.HandleFunc("GET /bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.PathValue("n"))
		if err != nil || n < 0 || n > len(big) {
			http.Error(w, "bad size", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(big[:n])
	})
	mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, "body failed", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%d\n", n)
	})
	server := &http.Server{Addr: *listen, Handler: mux, IdleTimeout: 300 * time.Second}
	log.Fatal(server.ListenAndServe())
}

type tally struct {
	Responses int64 `json:"responses"`
	Bytes     int64 `json:"bytes"`
	Errors    int64 `json:"errors"`
}

func slowClients(args []string) {
	fs := flag.NewFlagSet("slowclients", flag.ExitOnError)
	target := fs.String("url", "", "http URL to GET")
	connections := fs.Int("connections", 100, "connections")
	rate := fs.Int("rate", 256<<10, "bytes a second each connection reads")
	seconds := fs.Float64("seconds", 10, "how long")
	fs.Parse(args)
	u, err := url.Parse(*target)
	if err != nil || u.Scheme != "http" {
		log.Fatalf("slowclients: an http URL is needed, not %q", *target)
	}
	request := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.RequestURI(), u.Host)
	end := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	var total tally
	var wg sync.WaitGroup
	for i := 0; i < *connections; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := oneSlowClient(u.Host, request, *rate, end)
			atomic.AddInt64(&total.Responses, t.Responses)
			atomic.AddInt64(&total.Bytes, t.Bytes)
			atomic.AddInt64(&total.Errors, t.Errors)
		}()
	}
	wg.Wait()
	json.NewEncoder(os.Stdout).Encode(total)
}

// oneSlowClient reads in slices of rate/20 bytes every 50 ms until the end time, then
// finishes the response it is reading (a response cut short would count as an error).
func oneSlowClient(host, request string, rate int, end time.Time) (t tally) {
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Errors++
		return
	}
	defer conn.Close()
	tcp := conn.(*net.TCPConn)
	tcp.SetReadBuffer(16 << 10)
	slice := rate / 20
	if slice < 1 {
		slice = 1
	}
	reader := bufio.NewReaderSize(&pacedReader{conn: tcp, slice: slice}, 4096)
	for time.Now().Before(end) {
		if _, err := io.WriteString(conn, request); err != nil {
			t.Errors++
			return
		}
		length, err := readHead(reader)
		if err != nil {
			t.Errors++
			return
		}
		n, err := io.CopyN(io.Discard, reader, length)
		t.Bytes += n
		if err != nil {
			t.Errors++
			return
		}
		t.Responses++
	}
	return
}

// pacedReader hands out at most `slice` bytes per 50 ms.
type pacedReader struct {
	conn  *net.TCPConn
	slice int
	next  time.Time
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if wait := time.Until(p.next); wait > 0 {
		time.Sleep(wait)
	}
	p.next = time.Now().Add(50 * time.Millisecond)
	if len(b) > p.slice {
		b = b[:p.slice]
	}
	return p.conn.Read(b)
}

// readHead reads a response head and returns its Content-Length (required here).
func readHead(r *bufio.Reader) (int64, error) {
	status, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if !strings.HasPrefix(status, "HTTP/1.1 200") {
		return 0, fmt.Errorf("status %q", strings.TrimSpace(status))
	}
	length := int64(-1)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(name, "content-length") {
			length, err = strconv.ParseInt(strings.TrimSpace(value), 10, 64)
			if err != nil {
				return 0, err
			}
		}
	}
	if length < 0 {
		return 0, fmt.Errorf("no Content-Length")
	}
	return length, nil
}
