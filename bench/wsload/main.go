// wsload: a WebSocket echo load for make bench. Each of -c connections opens a WebSocket,
// over HTTP/1.1 (GET with Upgrade) or over HTTP/2 in cleartext (RFC 8441 extended CONNECT,
// one stream per connection), then keeps -depth messages of -size bytes in flight, each echoed
// back, for -d. Prints one JSON line: messages echoed, bytes, errors. The gateway in front
// moves bytes only, so the upstream may echo the frames as they come.
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

var (
	addr     = flag.String("addr", "127.0.0.1:8080", "gateway address")
	path     = flag.String("path", "/ws", "request path")
	proto    = flag.String("proto", "h1", "h1 or h2 (cleartext, prior knowledge)")
	conns    = flag.Int("c", 50, "connections")
	size     = flag.Int("size", 64, "message payload bytes")
	depth    = flag.Int("depth", 4, "messages in flight per connection")
	duration = flag.Duration("d", 5*time.Second, "how long")
)

// frame is one masked binary client frame of `size` bytes.
func frame(size int) []byte {
	var b bytes.Buffer
	b.WriteByte(0x82)
	switch {
	case size < 126:
		b.WriteByte(0x80 | byte(size))
	case size < 65536:
		b.WriteByte(0x80 | 126)
		binary.Write(&b, binary.BigEndian, uint16(size))
	default:
		b.WriteByte(0x80 | 127)
		binary.Write(&b, binary.BigEndian, uint64(size))
	}
	b.Write([]byte{1, 2, 3, 4})
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i) ^ []byte{1, 2, 3, 4}[i%4]
	}
	b.Write(payload)
	return b.Bytes()
}

type counters struct{ messages, bytes, errors atomic.Int64 }

func key() string {
	k := make([]byte, 16)
	rand.Read(k)
	return base64.StdEncoding.EncodeToString(k)
}

// duplex is what a WebSocket runs over: a connection, or an HTTP/2 stream.
type duplex interface {
	io.Reader
	io.Writer
}

func openH1() (duplex, error) {
	c, err := net.Dial("tcp", *addr)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: bench\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", *path, key())
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || len(line) < 12 || line[9:12] != "101" {
		return nil, fmt.Errorf("handshake: %q %v", line, err)
	}
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if l == "\r\n" {
			break
		}
	}
	return struct {
		io.Reader
		io.Writer
	}{r, c}, nil
}

// h2stream carries one extended CONNECT stream's DATA both ways.
type h2stream struct {
	fr     *http2.Framer
	conn   net.Conn
	mu     sync.Mutex
	in     chan []byte
	buf    []byte
	window int64
	cond   *sync.Cond
}

func (s *h2stream) Read(p []byte) (int, error) {
	for len(s.buf) == 0 {
		b, ok := <-s.in
		if !ok {
			return 0, io.EOF
		}
		s.buf = b
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

func (s *h2stream) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		s.mu.Lock()
		for s.window <= 0 {
			s.cond.Wait()
		}
		n := len(p)
		if int64(n) > s.window {
			n = int(s.window)
		}
		if n > 16384 {
			n = 16384
		}
		s.window -= int64(n)
		err := s.fr.WriteData(1, false, p[:n])
		s.mu.Unlock()
		if err != nil {
			return written, err
		}
		p = p[n:]
		written += n
	}
	return written, nil
}

func openH2() (duplex, error) {
	c, err := net.Dial("tcp", *addr)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(c, 64<<10)
	fr := http2.NewFramer(w, bufio.NewReader(c))
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	fr.WriteWindowUpdate(0, 1<<30)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "CONNECT"}, {":protocol", "websocket"},
		{":scheme", "http"}, {":path", *path}, {":authority", "bench"},
		{"sec-websocket-version", "13"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	s := &h2stream{fr: fr, conn: c, in: make(chan []byte, 64), window: 65535}
	s.cond = sync.NewCond(&s.mu)
	// The server's SETTINGS must allow extended CONNECT before the HEADERS go.
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			fr.WriteSettingsAck()
			if v, ok := sf.Value(http2.SettingInitialWindowSize); ok {
				s.window = int64(v)
			}
			break
		}
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(),
		EndHeaders: true})
	w.Flush()
	status := make(chan string, 1)
	dec := hpack.NewDecoder(4096, nil)
	go func() {
		defer close(s.in)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.HeadersFrame:
				fields, _ := dec.DecodeFull(f.HeaderBlockFragment())
				for _, h := range fields {
					if h.Name == ":status" {
						status <- h.Value
					}
				}
			case *http2.DataFrame:
				data := append([]byte(nil), f.Data()...)
				if len(data) > 0 {
					s.mu.Lock()
					fr.WriteWindowUpdate(1, uint32(len(data)))
					fr.WriteWindowUpdate(0, uint32(len(data)))
					w.Flush()
					s.mu.Unlock()
					s.in <- data
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 1 {
					s.mu.Lock()
					s.window += int64(f.Increment)
					s.cond.Broadcast()
					s.mu.Unlock()
				}
			case *http2.SettingsFrame:
				if !f.IsAck() {
					s.mu.Lock()
					fr.WriteSettingsAck()
					w.Flush()
					s.mu.Unlock()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					s.mu.Lock()
					fr.WritePing(true, f.Data)
					w.Flush()
					s.mu.Unlock()
				}
			case *http2.GoAwayFrame, *http2.RSTStreamFrame:
				return
			}
		}
	}()
	select {
	case st := <-status:
		if st != "200" {
			return nil, fmt.Errorf("extended CONNECT answered %s", st)
		}
	case <-time.After(5 * time.Second):
		return nil, fmt.Errorf("no answer to the extended CONNECT")
	}
	return struct {
		io.Reader
		io.Writer
	}{s, flushing{s, w}}, nil
}

type flushing struct {
	s *h2stream
	w *bufio.Writer
}

func (f flushing) Write(p []byte) (int, error) {
	n, err := f.s.Write(p)
	f.s.mu.Lock()
	f.w.Flush()
	f.s.mu.Unlock()
	return n, err
}

func run(c *counters, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	var d duplex
	var err error
	if *proto == "h2" {
		d, err = openH2()
	} else {
		d, err = openH1()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		c.errors.Add(1)
		return
	}
	msg := frame(*size)
	back := make([]byte, len(msg))
	burst := bytes.Repeat(msg, *depth)
	for {
		select {
		case <-stop:
			return
		default:
		}
		if _, err := d.Write(burst); err != nil {
			c.errors.Add(1)
			return
		}
		for i := 0; i < *depth; i++ {
			if _, err := io.ReadFull(d, back); err != nil {
				c.errors.Add(1)
				return
			}
			c.messages.Add(1)
			c.bytes.Add(int64(len(back)))
		}
	}
}

func main() {
	flag.Parse()
	var c counters
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < *conns; i++ {
		wg.Add(1)
		go run(&c, stop, &wg)
	}
	time.Sleep(*duration)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	json.NewEncoder(os.Stdout).Encode(map[string]int64{"messages": c.messages.Load(),
		"bytes": c.bytes.Load(), "errors": c.errors.Load()})
}
