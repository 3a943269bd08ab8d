"""The statistics the benchmarks' verdicts rest on (bench/http_compare.py): a goal such as
"at most 0.9x h2o" is judged from the interval median_interval gives, so the interval must
hold the true median as often as it says, and be no wider than that needs."""
import math
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from http_compare import median_interval, ratio_text  # noqa: E402


def binomial_below(n, k):
    """P(Binomial(n, 1/2) < k)."""
    return sum(math.comb(n, i) for i in range(k)) / 2 ** n


def test_the_interval_covers_the_median_at_least_as_often_as_it_says_and_no_more_than_needed():
    for n in range(5, 41):
        values = list(range(n))
        _, low, high = median_interval(values)
        k = low + 1  # values are their own ranks: the interval is [k-th, (n-k+1)-th]
        assert high == n - k
        # The true median lies outside only if k or more values fall on one side of it.
        assert 1 - 2 * binomial_below(n, k) >= 0.9, n
        # One rank narrower would promise less than 90% (down to [min, max] for small n).
        if k + 1 <= n - k:
            assert 1 - 2 * binomial_below(n, k + 1) < 0.9 or k == 1, n


def test_the_interval_holds_a_skewed_distributions_median_nine_times_in_ten():
    rng = random.Random(24)
    true_median = math.log(2)  # of the exponential distribution with rate 1
    for n in (5, 8, 12, 20):
        trials = 4000
        held = 0
        for _ in range(trials):
            _, low, high = median_interval([rng.expovariate(1.0) for _ in range(n)])
            held += low <= true_median <= high
        assert held / trials >= 0.885, (n, held / trials)


def test_too_few_rounds_give_no_interval_and_the_text_says_only_the_range():
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None
    a = {"cpu_us_per_request": 2.0, "round_cpu_us": [2.0, 2.2, 1.8]}
    b = {"cpu_us_per_request": 2.5, "round_cpu_us": [2.5, 2.0, 2.5]}
    assert ratio_text(a, b) == "0.80x (rounds 0.72-1.10)"
    a["round_cpu_us"] = [1.0, 1.1, 0.9, 1.0, 1.2]
    b["round_cpu_us"] = [1.0, 1.0, 1.0, 1.0, 1.0]
    assert ratio_text(a, b) == "0.80x (rounds 0.90-1.20; paired 1.00, 90% 0.90-1.20)"


def test_the_segment_count_grows_by_the_segments_sent_on_loopback():
    # bench's `segments/req` (tls_compare.tcp_segments_sent): the Tcp OutSegs counter, not
    # another column of /proc/net/snmp. Forty one-byte writes without Nagle, each read before
    # the next is sent, are at least forty segments (other traffic on the machine may add any
    # number, so there is no upper bound).
    import socket
    from tls_compare import tcp_segments_sent
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                before = tcp_segments_sent()
                for _ in range(40):
                    client.sendall(b"x")
                    assert server.recv(1) == b"x"
                after = tcp_segments_sent()
    assert after - before >= 40
