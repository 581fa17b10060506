"""wrk's report, read by the decide benchmarks: units converted, refusals and socket errors stop
the benchmark instead of counting as fast answers."""

from __future__ import annotations

import pytest

from benchmarks.loadgen import parse_wrk

REPORT = """Running 15s test @ http://127.0.0.1:18411/v1/decide
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    20.27ms   18.57ms 218.62ms   93.71%
    Req/Sec   453.57    173.18     0.93k    69.13%
  Latency Distribution
     50%  850.00us
     75%   21.76ms
     90%   30.66ms
     99%    1.10s
  6755 requests in 15.01s, 8.65MB read
Requests/sec:    449.95
Transfer/sec:    590.11KB
"""


def test_the_report_is_read_with_its_units() -> None:
    load = parse_wrk(REPORT, 8)
    assert load.client == "wrk" and load.connections == 8 and load.requests == 6755
    assert load.seconds == pytest.approx(15.01)
    assert load.p50_ms == pytest.approx(0.85) and load.p99_ms == pytest.approx(1100.0)
    assert load.rps == pytest.approx(6755 / 15.01)


def test_refused_requests_stop_the_benchmark() -> None:
    refused = REPORT.replace("Requests/sec", "  Non-2xx or 3xx responses: 12\nRequests/sec")
    with pytest.raises(SystemExit, match="12 requests were refused"):
        parse_wrk(refused, 8)
    broken = REPORT.replace(
        "Requests/sec", "  Socket errors: connect 0, read 3, write 0, timeout 0\nRequests/sec"
    )
    with pytest.raises(SystemExit, match="read 3"):
        parse_wrk(broken, 8)
