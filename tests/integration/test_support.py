"""The test helpers' own promises, where a broken one would make other tests flaky."""
import socket

import pytest

from ports import ephemeral_ports, worker_share
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


def test_each_xdist_worker_picks_from_a_slice_of_its_own(monkeypatch):
    low, _ = ephemeral_ports()
    if low < 12000:
        pytest.skip("no room below the kernel's range here: free_port takes the kernel's pick")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        slices.append(worker_share(10000, low))
        ports = [free_port() for _ in range(50)]
        assert all(slices[-1][0] <= p < slices[-1][1] for p in ports), (slices[-1], ports)
    assert all(a[1] <= b[0] for a, b in zip(slices, slices[1:])), slices
    assert slices[0][0] == 10000 and low - slices[-1][1] < 4
