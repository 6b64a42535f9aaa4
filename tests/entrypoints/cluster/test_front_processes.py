"""Several front processes without a Ray cluster: /metrics adds up the router counters of every
front process that answers (front_peers.py) and leaves out one that does not; the spec a front
process gets on stdin round-trips; one that exits before serving fails the start, one that keeps
dying is started again a bounded number of times; the default process count; the flag's
checks."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ladle[ray]')")

from ladle.cli.main import main  # noqa: E402
from ladle.entrypoints.cluster import front_processes, routing_metrics  # noqa: E402
from ladle.entrypoints.cluster.front import FrontSettings  # noqa: E402
from ladle.entrypoints.cluster.front_peers import FrontPeers  # noqa: E402
from ladle.entrypoints.cluster.front_processes import (  # noqa: E402
    FrontProcessSpec,
    FrontWorkers,
    default_api_server_count,
)
from ladle.entrypoints.cluster.replica_metrics import sum_metrics  # noqa: E402
from ladle.entrypoints.openai.http_server_options import HttpServerOptions  # noqa: E402


def _samples(text: bytes) -> dict[str, float]:
    lines = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in lines}


def test_metrics_add_up_the_counters_of_every_front_process_that_answers(tmp_path):
    """Three front processes' places in one process (so all serve the same counters): the one
    scraped reports its own plus both others'; once one is gone, its share is left out."""
    routing_metrics.ROUTED_REQUESTS.labels(replica="r-sum").inc(5)
    routing_metrics.ROUTING_DECISIONS.labels(reason="prefix_hit").inc()
    own = _samples(routing_metrics.render_routing_metrics())

    async def scrape() -> tuple[bytes, bytes]:
        peers = [FrontPeers(tmp_path, index, 3) for index in range(3)]
        for peer in peers:
            await peer.start()
        all_three = await peers[1].routing_metrics_text()
        await peers[2].close()
        two_left = await peers[1].routing_metrics_text()
        for peer in peers[:2]:
            await peer.close()
        return all_three, two_left

    all_three, two_left = asyncio.run(scrape())
    summed, summed_two = _samples(all_three), _samples(two_left)
    routed = 'ladle_router_requests_total{replica="r-sum"}'
    assert summed[routed] == 3 * own[routed] and summed_two[routed] == 2 * own[routed]
    hits = 'ladle_router_decisions_total{reason="prefix_hit"}'
    assert summed[hits] == 3 * own[hits]
    assert not any(name.endswith("_created") or "_created{" in name for name in summed)
    assert b"# TYPE ladle_router_requests_total counter" in all_three


def test_sum_metrics_adds_samples_with_the_same_labels_only():
    first = b'# TYPE c counter\nc_total{r="a"} 1.0\nc_total{r="b"} 2.0\n'
    second = b'# TYPE c counter\nc_total{r="a"} 3.0\n# TYPE g gauge\ng 7.0\n'
    assert _samples(sum_metrics([first, second])) == {
        'c_total{r="a"}': 4.0,
        'c_total{r="b"}': 2.0,
        "g": 7.0,
    }


def test_the_spec_a_front_process_reads_round_trips():
    spec = FrontProcessSpec(
        ray_address="10.0.0.1:6379",
        app_name="ladle",
        host="::",
        port=8000,
        count=3,
        peers_dir="/tmp/x",
        settings=FrontSettings("/tok", 16, 4, 2, max_attempts=3),
        options=HttpServerOptions(log_level="warning", max_connections=None),
    )
    assert FrontProcessSpec.from_json(spec.to_json(2)) == (spec, 2)


def test_front_processes_that_die_fail_the_start_and_are_restarted_a_bounded_number_of_times(
    tmp_path, monkeypatch
):
    import sys
    import time

    # Stands in for front_worker: reads its spec, exits 3 without serving.
    monkeypatch.setattr(
        front_processes,
        "WORKER_COMMAND",
        [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"],
    )
    spec = FrontProcessSpec("x:1", "ladle", "127.0.0.1", 0, 2, str(tmp_path),
                            FrontSettings(None, 16, 4, 2), HttpServerOptions())  # fmt: skip
    workers = FrontWorkers(spec)
    workers.start()
    with pytest.raises(RuntimeError, match="front process 1 exited with 3 before serving"):
        asyncio.run(workers.wait_serving(timeout_s=30))
    pids = set(workers.pids)
    for _ in range(front_processes.MAX_RESTARTS + 2):
        for process in workers._processes.values():
            process.wait(30)
        workers.restart_dead()
        pids |= set(workers.pids)
    # The first start, then MAX_RESTARTS more; then it stays down.
    assert len(pids) == 1 + front_processes.MAX_RESTARTS
    workers.stop()
    started = time.monotonic()
    workers.wait_stopped()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("replicas", "cpus", "expected"),
    [(2, 16, 2), (8, 16, 4), (2, 2, 1), (1, 64, 1), (4, 4, 1)],
)
def test_default_count_is_one_per_replica_within_a_quarter_of_the_cores(replicas, cpus, expected):
    assert default_api_server_count(replicas, cpus) == expected


def test_api_server_count_is_checked_before_ray_starts(capsys):
    base = ["serve", "qwen3-0.6b", "--load-format", "dummy", "--replicas", "2"]
    assert main([*base, "--api-server-count", "0"]) == 2
    assert "--api-server-count must be >= 1" in capsys.readouterr().err
    assert main([*base, "--ray-address", "auto", "--api-server-count", "2"]) == 2
    assert "--api-server-count runs the local front" in capsys.readouterr().err
    one_server = ["serve", "qwen3-0.6b", "--load-format", "dummy", "--api-server-count", "2"]
    assert main(one_server) == 2
    assert "in front of --replicas N" in capsys.readouterr().err


@pytest.mark.skipif(not front_processes.can_share_a_port(), reason="SO_REUSEPORT is Linux's")
def test_front_processes_bind_one_port_each_with_a_socket_of_their_own():
    from ladle.entrypoints.cluster.front_server import bind_socket

    first = bind_socket("127.0.0.1", 0, reuse_port=True)
    first.listen()
    port = first.getsockname()[1]
    try:
        second = bind_socket("127.0.0.1", port, reuse_port=True)
        second.listen()
        second.close()
        with pytest.raises(OSError):  # a socket without the option cannot join them
            bind_socket("127.0.0.1", port)
    finally:
        first.close()
