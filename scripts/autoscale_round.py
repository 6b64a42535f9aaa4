"""A live autoscaling run (issue 13): build_app with Ray Serve's autoscaling config on ongoing
requests per replica, an idle start, a burst of load, then idle again; the replica count is
sampled from `serve.status()` throughout, so scale-up and scale-down are observed, not assumed.

    python scripts/autoscale_round.py --out /tmp/autoscale     # ~4 min on 2 CPU cores

Writes autoscale.json: the config, the timeline [(seconds, running replicas, status)], when the
second replica ran after the load began and when the deployment was back to one after it ended,
and how many requests completed (every one must).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import ray
from ray import serve

from ladle.entrypoints.cluster.app import build_app
from ladle.entrypoints.cluster.front import ENGINE_DEPLOYMENT_NAME

AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 2,  # per replica: 8 streams in flight ask for 4, capped at 2
    "upscale_delay_s": 3,
    "downscale_delay_s": 15,
    "look_back_period_s": 3,
}


def replica_counts() -> tuple[int, str]:
    """(running replicas, status such as UPSCALING or HEALTHY) of the engine deployment."""
    status = serve.status().applications["ladle"].deployments[ENGINE_DEPLOYMENT_NAME]
    return int(status.replica_states.get("RUNNING", 0)), str(status.status.value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=8, help="concurrent clients under load")
    parser.add_argument("--max-load-s", type=float, default=240.0)
    parser.add_argument("--load-after-scale-up-s", type=float, default=20.0)
    parser.add_argument("--max-idle-s", type=float, default=120.0)
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    timeline: list[tuple[float, int, str]] = []
    stop_sampling = threading.Event()
    started = time.monotonic()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(
            autoscaling_config=AUTOSCALING, max_num_seqs=16, max_model_len=1024, stats_interval=0
        )
        serve.run(app, name="ladle", route_prefix="/", blocking=False)
        base_url = f"http://127.0.0.1:{port}"
        while httpx.get(f"{base_url}/health", timeout=30).status_code != 200:
            time.sleep(0.5)
        started = time.monotonic()

        def sample() -> None:
            while not stop_sampling.wait(0.5):
                running, status = replica_counts()
                timeline.append((round(time.monotonic() - started, 1), running, status))

        threading.Thread(target=sample, daemon=True).start()
        time.sleep(5)  # idle: one replica
        load_began = time.monotonic() - started
        stop_load = threading.Event()
        completed = [0] * options.streams
        failed: list[str] = []

        def client(index: int) -> None:
            with httpx.Client(base_url=base_url, timeout=300) as http:
                while not stop_load.is_set():
                    answer = http.post(
                        "/v1/completions",
                        json={
                            "model": "SmolLM2-135M-Instruct",
                            "prompt": f"Client {index} asks: tell a story about the number",
                            "max_tokens": 24,
                            "temperature": 0,
                            "stream": True,
                        },
                    )
                    if answer.status_code != 200 or "[DONE]" not in answer.text:
                        failed.append(f"{answer.status_code}: {answer.text[:200]}")
                    else:
                        completed[index] += 1

        clients = [threading.Thread(target=client, args=(i,)) for i in range(options.streams)]
        for thread in clients:
            thread.start()
        scaled_up_at = None
        while time.monotonic() - started - load_began < options.max_load_s:
            if scaled_up_at is None and timeline and timeline[-1][1] >= 2:
                scaled_up_at = timeline[-1][0]
            if scaled_up_at is not None and timeline[-1][0] - scaled_up_at >= (
                options.load_after_scale_up_s
            ):
                break
            time.sleep(0.5)
        stop_load.set()
        for thread in clients:
            thread.join()
        load_ended = time.monotonic() - started
        scaled_down_at = None
        while time.monotonic() - started - load_ended < options.max_idle_s:
            if timeline and timeline[-1][0] > load_ended and timeline[-1][1] == 1:
                scaled_down_at = timeline[-1][0]
                break
            time.sleep(0.5)
        stop_sampling.set()
        report = {
            "autoscaling_config": AUTOSCALING,
            "streams": options.streams,
            "load_began_s": round(load_began, 1),
            "scaled_up_at_s": scaled_up_at,
            "scale_up_after_load_s": None
            if scaled_up_at is None
            else round(scaled_up_at - load_began, 1),
            "load_ended_s": round(load_ended, 1),
            "scaled_down_at_s": scaled_down_at,
            "scale_down_after_load_s": None
            if scaled_down_at is None
            else round(scaled_down_at - load_ended, 1),
            "requests_completed": sum(completed),
            "requests_failed": len(failed),
            "failures": failed[:5],
            "timeline": timeline,
        }
        (options.out / "autoscale.json").write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report.items() if k != "timeline"}, indent=1))
        ok = scaled_up_at is not None and scaled_down_at is not None and not failed
        return 0 if ok else 1
    finally:
        stop_sampling.set()
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
