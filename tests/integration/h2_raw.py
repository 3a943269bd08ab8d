"""Raw HTTP/2 ends for adversarial tests: a client that writes any frame in any order (its own
framing and HPACK, so that a test can send what a library refuses to), and a scripted h2c
upstream that answers each request with a script of raw frames. Both answer SETTINGS and PING
as a peer must, note every frame they read, and give windows back unless told not to."""
import socket
import struct
import threading
import time

import hpack

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED, \
    FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, \
    ENHANCE_YOUR_CALM = range(12)

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, \
    MAX_HEADER_LIST_SIZE = range(1, 7)
ENABLE_CONNECT_PROTOCOL = 8


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def settings(*pairs, ack=False):
    return frame(SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v)
                                                          for k, v in pairs))


def window_update(stream, n):
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", n))


def rst(stream, code=CANCEL):
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def data(stream, payload, end=False, pad=None):
    if pad is None:
        return frame(DATA, END_STREAM if end else 0, stream, payload)
    return frame(DATA, (END_STREAM if end else 0) | PADDED, stream,
                 bytes([pad]) + payload + b"\0" * pad)


def ping(payload=b"12345678", ack=False):
    return frame(PING, ACK if ack else 0, 0, payload)


def priority(stream, depends_on, weight=16):
    return frame(PRIORITY, 0, stream, struct.pack(">IB", depends_on, weight))


def goaway(last, code=NO_ERROR):
    return frame(GOAWAY, 0, 0, struct.pack(">II", last, code))


class Stream:
    """What one stream received."""

    def __init__(self):
        self.heads = []  # each head's [(name, value, never_indexed)]
        self.body = b""
        self.ended = False
        self.reset = None  # the RST_STREAM code

    def status(self):
        for head in reversed(self.heads):
            for name, value, _ in head:
                if name == ":status" and not value.startswith("1"):
                    return int(value)
        return None

    def field(self, name):
        for head in self.heads:
            for n, v, _ in head:
                if n == name:
                    return v
        return None

    def never_indexed(self, name):
        return any(n == name and never for head in self.heads for n, v, never in head)

    def done(self):
        return self.ended or self.reset is not None


class Peer:
    """One end of a connection: reads frames on a thread of its own."""

    def __init__(self, sock, auto_window=True):
        self.sock = sock
        self.auto_window = auto_window
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 1 << 24
        self.streams = {}
        self.frames = []  # (kind, flags, stream, payload) in order
        self.goaway = None  # (last stream, code, debug)
        self.closed = False
        self.error = None
        self.cond = threading.Condition()
        self.block = None  # (stream, flags, bytes) of a header block being gathered
        self.write_lock = threading.Lock()
        # Our send windows, as the peer's SETTINGS and WINDOW_UPDATEs say.
        self.peer_initial_window = 65535
        self.send_windows = {0: 65535}

    def start(self):
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, *frames):
        with self.write_lock:
            try:
                self.sock.sendall(b"".join(frames))
                return True
            except OSError:
                return False

    def send_window(self, sid):
        return self.send_windows.setdefault(sid, self.peer_initial_window)

    def upload(self, sid, body, end=True, seconds=30, pad=None):
        """Sends `body` on `sid` within the peer's windows (each frame padded with `pad` bytes
        if given); False if they stayed shut."""
        at = 0
        extra = 0 if pad is None else pad + 1
        while True:
            with self.cond:
                room = lambda: min(self.send_window(sid), self.send_windows[0]) - extra  # noqa
                # (Our side goes on after the peer's ended; not after a reset, nor the peer's
                # whole answer to a request of ours.)
                over = lambda: self.stream(sid).reset is not None or (  # noqa: E731
                    isinstance(self, Client) and self.stream(sid).ended)
                if not self.wait(lambda: room() > 0 or over(), seconds):
                    return False
                if over():
                    return False
                n = min(room(), 16384 - extra, len(body) - at)
                self.send_windows[sid] -= n + extra
                self.send_windows[0] -= n + extra
            last = at + n >= len(body)
            self.send(data(sid, body[at:at + n], end=end and last, pad=pad))
            at += n
            if last:
                return True

    def stream(self, sid):
        return self.streams.setdefault(sid, Stream())

    def encode(self, fields, sensitive=()):
        """An HPACK block of `fields` (names in `sensitive` never indexed)."""
        return self.encoder.encode([hpack.NeverIndexedHeaderTuple(n, v) if n in sensitive
                                    else (n, v) for n, v in fields])

    def wait(self, check, seconds=10):
        """Waits until check() (under the lock) or the connection closed; check()'s last value."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while True:
                result = check()
                if result or self.closed:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    return result
                self.cond.wait(left)

    def wait_done(self, sid, seconds=10):
        self.wait(lambda: self.stream(sid).done(), seconds)
        return self.stream(sid)

    def kinds(self, kind, sid=None):
        with self.cond:
            return [f for f in self.frames if f[0] == kind and (sid is None or f[2] == sid)]

    def _read(self):
        buffer = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                buffer = self._preface(buffer)
                if buffer is None:
                    buffer = b""
                    continue
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    sid = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    payload = buffer[9:9 + length]
                    buffer = buffer[9 + length:]
                    with self.cond:
                        self.frames.append((kind, flags, sid, payload))
                        self._on_frame(kind, flags, sid, payload)
                        self.cond.notify_all()
        except (OSError, hpack.HPACKError) as e:
            self.error = e
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()

    def _preface(self, buffer):
        return buffer

    def _on_frame(self, kind, flags, sid, payload):
        if kind == SETTINGS and not flags & ACK:
            for at in range(0, len(payload) - 5, 6):
                key, value = struct.unpack(">HI", payload[at:at + 6])
                if key == INITIAL_WINDOW_SIZE:
                    for sid_ in self.send_windows:
                        if sid_ != 0:
                            self.send_windows[sid_] += value - self.peer_initial_window
                    self.peer_initial_window = value
            self.send(settings(ack=True))
        elif kind == WINDOW_UPDATE:
            n = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            self.send_windows[sid] = self.send_window(sid) + n
        elif kind == PING and not flags & ACK:
            self.send(ping(payload, ack=True))
        elif kind == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            self.goaway = (last & 0x7FFFFFFF, code, payload[8:])
        elif kind == RST_STREAM:
            if self.stream(sid).reset is None:  # (the first: more may follow)
                self.stream(sid).reset = struct.unpack(">I", payload)[0]
        elif kind == DATA:
            body = payload
            if flags & PADDED:
                body = payload[1:len(payload) - payload[0]]
            self.on_data(sid, body, flags & END_STREAM, len(payload))
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                block = payload
                if flags & PADDED:
                    block = block[1:len(block) - block[0]]
                if flags & PRIORITY_FLAG:
                    block = block[5:]
                self.block = (sid, flags, block)
            else:
                self.block = (self.block[0], self.block[1], self.block[2] + payload)
            if flags & END_HEADERS:
                sid, first_flags, block = self.block
                self.block = None
                fields = [(n, v, isinstance(t, hpack.NeverIndexedHeaderTuple))
                          for t in self.decoder.decode(block, raw=False) for n, v in [t]]
                self.on_head(sid, fields, first_flags & END_STREAM)

    def on_data(self, sid, body, end, flow):
        s = self.stream(sid)
        s.body += body
        if end:
            s.ended = True
        if self.auto_window and flow and self.gives_back(sid):
            self.send(window_update(0, flow), *([] if end else [window_update(sid, flow)]))

    def gives_back(self, sid):
        """Whether the windows of DATA on `sid` are given back as it arrives."""
        return True

    def on_head(self, sid, fields, end):
        s = self.stream(sid)
        s.heads.append(fields)
        if end:
            s.ended = True

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Client(Peer):
    """A client connection to 127.0.0.1:`port`: preface and SETTINGS (`settings_pairs`) sent."""

    def __init__(self, port, settings_pairs=(), auto_window=True, timeout=30):
        super().__init__(socket.create_connection(("127.0.0.1", port), timeout=timeout),
                         auto_window)
        self.start()
        self.send(PREFACE, settings(*settings_pairs))

    def head(self, sid, path, method="GET", extra=(), end=True, authority="gateway.test",
             sensitive=(), flags=0):
        fields = [(":method", method), (":scheme", "http"), (":authority", authority),
                  (":path", path), *extra]
        block = self.encode(fields, sensitive)
        if len(block) <= 16384:
            return frame(HEADERS, (END_STREAM if end else 0) | END_HEADERS | flags, sid, block)
        # (Past the default SETTINGS_MAX_FRAME_SIZE: CONTINUATIONs.)
        pieces = [block[at:at + 16384] for at in range(0, len(block), 16384)]
        return frame(HEADERS, (END_STREAM if end else 0) | flags, sid, pieces[0]) + b"".join(
            frame(CONTINUATION, END_HEADERS if n == len(pieces) - 1 else 0, sid, p)
            for n, p in enumerate(pieces) if n > 0)

    def get(self, sid, path, **kw):
        self.send(self.head(sid, path, **kw))
        return self.wait_done(sid)


def fetch(port, path, method="GET", body=b"", extra=(), seconds=20):
    """One request on a new connection: its Stream (whole body read)."""
    c = Client(port)
    try:
        c.send(c.head(1, path, method=method, end=not body, extra=extra))
        if body:
            for at in range(0, len(body), 16384):
                c.send(data(1, body[at:at + 16384], end=at + 16384 >= len(body)))
        return c.wait_done(1, seconds)
    finally:
        c.close()


class UpstreamConnection(Peer):
    """One connection of a ScriptedUpstream."""

    def __init__(self, sock, upstream):
        super().__init__(sock, upstream.auto_window)
        self.upstream = upstream
        self.preface_seen = False
        self.held = b""
        self.send(settings(*upstream.settings_pairs))
        if upstream.connection_window > 65535:
            self.send(window_update(0, upstream.connection_window - 65535))
        upstream.connections.append(self)  # (before a script, on the reader's thread, looks)
        self.start()

    def gives_back(self, sid):
        return self.upstream.gives_back(self, sid)

    def _preface(self, buffer):
        if self.preface_seen:
            return buffer
        self.held += buffer
        if len(self.held) < len(PREFACE):
            return None
        assert self.held.startswith(PREFACE)
        self.preface_seen = True
        rest, self.held = self.held[len(PREFACE):], b""
        return rest

    def on_head(self, sid, fields, end):
        super().on_head(sid, fields, end)
        if len(self.stream(sid).heads) == 1:
            self.upstream.note(self, sid)
            threading.Thread(target=self.upstream.script, args=(self, sid),
                             daemon=True).start()

    def answer(self, sid, status=200, body=b"", fields=(), end=True, sensitive=()):
        block = self.encode([(":status", str(status)), *fields], sensitive)
        frames = [frame(HEADERS, END_HEADERS | (END_STREAM if end and not body else 0), sid,
                        block)]
        if body:
            frames.append(data(sid, body, end=end))
        self.send(*frames)


class ScriptedUpstream:
    """An h2c upstream on a free port; `script(conn, sid)` answers each request (on a thread of
    its own, once the request's head came)."""

    def __init__(self, script, settings_pairs=((MAX_CONCURRENT_STREAMS, 1000),),
                 auto_window=True, connection_window=65535,
                 gives_back=lambda conn, sid: True):
        self.script = script
        self.connection_window = connection_window
        self.gives_back = gives_back
        self.settings_pairs = settings_pairs
        self.auto_window = auto_window
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.connections = []
        self.seen = []  # (conn, sid) in the order heads came
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def note(self, conn, sid):
        with self.lock:
            self.seen.append((conn, sid))

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            sock.settimeout(None)
            UpstreamConnection(sock, self)

    def stop(self):
        self.listener.close()
        for c in self.connections:
            c.close()
