"""Soak: steady traffic for a while; the RSS of both processes and the p99 latency stay flat
from the start to the end. CI runs LADLE_SOAK_SECONDS=45 (the default); the long soak is the
same test with a larger value (docs/benchmarks.md records a run)."""

from __future__ import annotations

import asyncio
import os
import time

from tests.entrypoints.server_process import engine_is_idle, wait_until
from tests.reliability.traffic import percentile, rss_bytes, run_clients

SOAK_SECONDS = float(os.environ.get("LADLE_SOAK_SECONDS", "45"))
NUM_WINDOWS = 5
# Allowed growth from the first window to the last. Python's allocator and torch's caching
# make RSS step a little; a leak of a request's worth per request grows without bound.
MAX_RSS_GROWTH_BYTES = 48 * 2**20
# Latency is the noisier signal (other processes share the CPU): only a clear upward trend fails.
MAX_P99_RATIO = 3.0


def test_soak_rss_and_latency_stay_flat(default_server):
    pids = {"api": default_server.pid, "engine": default_server.engine_pid}
    # Warm up first: the first requests fill allocator pools and caches that then stay.
    asyncio.run(run_clients(default_server.base_url, num_requests=40, num_clients=8))
    windows = []
    window_s = SOAK_SECONDS / NUM_WINDOWS
    for index in range(NUM_WINDOWS):
        started = time.monotonic()
        latencies = []
        while time.monotonic() - started < window_s:
            outcomes = asyncio.run(run_clients(default_server.base_url, num_requests=16,
                                               num_clients=8, seed=index))
            assert all(o.status == 200 and o.error is None for o in outcomes), outcomes[:2]
            latencies += [o.latency_s for o in outcomes]
        rss = {name: rss_bytes(pid) for name, pid in pids.items()}
        windows.append((percentile(latencies, 0.99), rss, len(latencies)))
        print(f"\nwindow {index}: {len(latencies)} requests, p99 {windows[-1][0]:.2f}s, "
              f"rss api {rss['api'] / 2**20:.0f} MiB engine {rss['engine'] / 2**20:.0f} MiB")
    first, last = windows[0], windows[-1]
    for name in pids:
        assert last[1][name] - first[1][name] < MAX_RSS_GROWTH_BYTES, (name, windows)
    assert last[0] <= MAX_P99_RATIO * first[0] + 1.0, windows
    assert wait_until(lambda: engine_is_idle(default_server), timeout_s=5)
