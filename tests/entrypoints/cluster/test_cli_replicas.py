"""`ladle serve --replicas N` without Ray installed: a clear error naming the install command,
before any engine starts; and bad replica counts are rejected with the flag named."""

import sys

from ladle.cli.main import main


def test_replicas_without_ray_says_how_to_install(monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    assert main(["serve", "qwen3-0.6b", "--load-format", "dummy", "--replicas", "2"]) == 2
    error = capsys.readouterr().err
    assert "pip install 'ladle[ray]'" in error and "--replicas" in error


def test_replicas_must_be_positive(capsys):
    import pytest

    pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    assert main(["serve", "qwen3-0.6b", "--load-format", "dummy", "--replicas", "0"]) == 2
    assert "--replicas must be >= 1" in capsys.readouterr().err


def test_server_flags_reach_the_replicas(monkeypatch, capsys):
    """Every `ladle serve` flag a replica applies itself reaches build_replicas (a flag dropped
    on the way would silently do nothing with --replicas)."""
    import pytest

    pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    import ladle.entrypoints.cluster.app as cluster_app

    captured = {}

    def fake_build_replicas(model, **options):
        captured.update(options, model=model)
        raise ValueError("stop before Ray starts")

    monkeypatch.setattr(cluster_app, "build_replicas", fake_build_replicas)
    argv = ["serve", "qwen3-0.6b", "--load-format", "dummy", "--replicas", "2",
            "--ttft-slo", "2s", "--stats-interval", "3", "--disable-log-requests",
            "--routing", "round-robin", "--shutdown-timeout", "7", "--max-queued-requests", "9",
            "--api-key", "k", "--max-model-len", "512", "--response-role", "bot",
            "--return-tokens-as-token-ids",
            "--override-generation-config", '{"temperature": 0.5}']  # fmt: skip
    assert main(argv) == 2
    assert "stop before Ray starts" in capsys.readouterr().err
    assert captured["ttft_slo"] == "2s" and captured["stats_interval"] == 3.0
    assert captured["log_requests"] is False and captured["routing"] == "round-robin"
    assert captured["shutdown_timeout"] == 7.0 and captured["max_queued_requests"] == 9
    assert captured["api_key"] == "k" and captured["max_model_len"] == 512
    assert captured["response_role"] == "bot" and captured["return_tokens_as_token_ids"]
    assert captured["override_generation_config"] == {"temperature": 0.5}  # an engine option


def test_build_app_rejects_bad_server_options_before_ray():
    import pytest

    pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    from ladle.entrypoints.cluster.app import build_app

    dummy = {"model": "qwen3-0.6b", "load_format": "dummy"}
    with pytest.raises(ValueError, match="routing must be one of"):
        build_app(**dummy, routing="random")
    with pytest.raises(ValueError, match="as a duration"):
        build_app(**dummy, ttft_slo="soon")
    with pytest.raises(ValueError, match="ttft_slo must be > 0"):
        build_app(**dummy, ttft_slo=0)
    with pytest.raises(ValueError, match="stats_interval must be >= 0"):
        build_app(**dummy, stats_interval=-1)
    with pytest.raises(ValueError, match="max_queued_requests must be >= 1"):
        build_app(**dummy, max_queued_requests=0)


def test_max_replicas_asks_ray_serve_to_autoscale(monkeypatch, capsys):
    import pytest

    pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    import ladle.entrypoints.cluster.app as cluster_app

    captured = {}

    def fake_build_replicas(model, **options):
        captured.update(options)
        raise ValueError("stop before Ray starts")

    monkeypatch.setattr(cluster_app, "build_replicas", fake_build_replicas)
    base = ["serve", "qwen3-0.6b", "--load-format", "dummy", "--max-num-seqs", "64"]
    assert main([*base, "--max-replicas", "4"]) == 2
    assert captured["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 32,  # half of --max-num-seqs
    }
    assert main([*base, "--replicas", "2", "--max-replicas", "3", "--target-ongoing-requests", "5"])
    assert captured["autoscaling_config"]["min_replicas"] == 2
    assert captured["autoscaling_config"]["target_ongoing_requests"] == 5
    capsys.readouterr()
    assert main([*base, "--replicas", "3", "--max-replicas", "2"]) == 2
    assert "--max-replicas must be >= --replicas" in capsys.readouterr().err
    assert main([*base, "--replicas", "2", "--target-ongoing-requests", "5"]) == 2
    assert "--target-ongoing-requests needs --max-replicas" in capsys.readouterr().err
