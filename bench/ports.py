"""Ports for servers a test or a benchmark starts on 127.0.0.1."""
import os
import random
import socket


def ephemeral_ports():
    """The kernel's range for ports it picks itself (a bind to port 0, an outgoing connection)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(n) for n in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def worker_share(first, end):
    """The part of ports [first, end) that is this process's to hand out: all of them, or under
    pytest-xdist (make check) the worker's own slice, so that two workers never pick one port
    in the moment between a pick and its bind."""
    try:
        worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
        count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        return first, end
    size = (end - first) // max(count, 1)
    return first + worker * size, first + (worker + 1) * size


_handed_out = set()
_rng = random.Random()


def free_port():
    """A port on 127.0.0.1 that nothing holds now, for a server a test or a benchmark starts next.

    It is taken below the kernel's ephemeral range: a port found free there can be given to the
    next outgoing connection or bind to port 0 before the server binds it (CI once saw
    "Address already in use" so). Below the range only an explicit bind can take it, and this
    process never hands the same port out twice."""
    low, _ = ephemeral_ports()
    first = 10000
    if low - first < 2000:  # no room below the range on this machine: the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    first, low = worker_share(first, low)
    for _ in range(1000):
        port = _rng.randrange(first, low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {first} and {low}")
