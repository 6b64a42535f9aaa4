"""`ladle serve --replicas N` without Ray installed: a clear error naming the install command,
before any engine starts; and bad replica counts are rejected with the flag named."""

import sys

from ladle.cli import main


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
