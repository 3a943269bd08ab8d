"""The test helpers' own promises, where a broken one would make other tests flaky."""
import socket

from ports import ephemeral_ports
from proxy_support import free_port


def test_free_port_is_below_the_kernels_own_range_bindable_and_never_handed_out_twice():
    low, high = ephemeral_ports()
    assert low < high
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if low > 12000:  # room below the range: the kernel's own picks cannot land on these
        assert all(1024 < p < low for p in ports), [p for p in ports if p >= low]
    for port in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
