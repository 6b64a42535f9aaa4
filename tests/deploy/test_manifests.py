"""The deployment files in deploy/ parse and carry what their platforms need: the KServe
InferenceService's required fields (v1beta1 schema) and a Ray Serve config whose arguments
build_app accepts."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("name", ["kserve-inferenceservice.yaml", "kserve-disaggregated.yaml"])
def test_kserve_inference_service_is_well_formed(name):
    manifest = yaml.safe_load((DEPLOY / name).read_text())
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1"
    assert manifest["kind"] == "InferenceService"
    assert manifest["metadata"]["name"]
    predictor = manifest["spec"]["predictor"]
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    [container] = predictor["containers"]
    assert container["name"] == "kserve-container"  # the name KServe expects for custom ones
    args = container["args"]
    assert container["command"] == ["ladle"] and args[0] == "serve"
    # Every flag the manifest passes is one `ladle serve` knows.
    from ladle.cli.main import build_parser

    parsed = build_parser().parse_args([*container["command"][1:], *args])
    port = parsed.port
    assert {p["containerPort"] for p in container["ports"]} == {port}
    assert parsed.host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port}
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
    if parsed.disaggregate is not None:  # one GPU per engine
        from ladle.kv_transfer.config import Disaggregation

        instances = Disaggregation.parse(parsed.disaggregate).num_instances
        assert int(resources["limits"]["nvidia.com/gpu"]) == instances


def test_ray_serve_config_matches_build_app():
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ladle[ray]')")
    from ladle.config import EngineConfig
    from ladle.entrypoints.cluster.app import build_replicas

    config = yaml.safe_load((DEPLOY / "ray-serve-config.yaml").read_text())
    [application] = config["applications"]
    assert application["import_path"] == "ladle.entrypoints.cluster.app:app_builder"
    args = dict(application["args"])
    # build_app's keywords are build_replicas's (build_app(model, **options) passes them on).
    build_app_keywords = set(inspect.signature(build_replicas).parameters) - {"engine_options"}
    engine_options = {k: v for k, v in args.items() if k not in build_app_keywords}
    # What is left must be engine options EngineConfig accepts (it names any it does not).
    EngineConfig.from_kwargs(model=args["model"], **engine_options)
    scaling = args["autoscaling_config"]
    assert 1 <= scaling["min_replicas"] <= scaling["max_replicas"]
    assert scaling["target_ongoing_requests"] > 0
