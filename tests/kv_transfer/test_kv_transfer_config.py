"""--kv-transfer-config (vLLM's keys) and --disaggregate xPyD: what is accepted, and refusals
that name the field."""

from __future__ import annotations

import pytest

from ladle.config import EngineConfig
from ladle.kv_transfer.config import Disaggregation, KVTransferConfig


def test_roles_and_vllm_keys():
    config = KVTransferConfig.from_dict(
        {"kv_role": "kv_both", "kv_connector": "LadleConnector", "kv_rank": 0,
         "kv_parallel_size": 2, "kv_ip": "127.0.0.1", "kv_port": 14579,
         "kv_connector_extra_config": {"hold_timeout_s": 5}}
    )
    assert config.is_producer and config.is_consumer and config.hold_timeout_s == 5.0
    producer = EngineConfig.from_kwargs("m", kv_transfer_config={"kv_role": "kv_producer"})
    assert producer.cache.kv_transfer.is_producer and not producer.cache.kv_transfer.is_consumer


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"kv_role": "kv_producer", "kv_connector": "NixlConnector"}, "vLLM connector"),
        ({"kv_role": "kv_producer", "kv_connector": "Foo"}, "unknown"),
        ({"kv_role": "producer"}, "kv_role"),
        ({"kv_role": "kv_consumer", "kv_bogus": 1}, "kv_bogus"),
        ({"kv_role": "kv_consumer", "kv_buffer_device": "tpu"}, "kv_buffer_device"),
        ({"kv_role": "kv_consumer", "kv_connector_extra_config": {"hold_timeout_s": 0}},
         "hold_timeout_s"),
    ],
)
def test_refusals_name_the_field(options, named):
    with pytest.raises(ValueError, match=named):
        EngineConfig.from_kwargs("m", kv_transfer_config=options)


def test_disaggregate_spelling():
    assert Disaggregation.parse("1P1D").num_instances == 2
    assert Disaggregation.parse("1p1d") == Disaggregation(1, 1)
    with pytest.raises(ValueError, match="xPyD"):
        Disaggregation.parse("P1D1")
    assert Disaggregation.parse(" 2P3D ") == Disaggregation(2, 3)
    assert Disaggregation.parse("2P3D").num_instances == 5
    with pytest.raises(ValueError, match="at least 1"):
        Disaggregation.parse("0P1D")


def test_more_engines_than_gpus_is_refused(monkeypatch):
    from ladle.cli import disagg

    monkeypatch.setattr(disagg, "count_cuda_devices", lambda: 2)
    # Prefill engines first (GPUs 0..x-1), then the decode engines.
    assert disagg.instance_devices(2, "cuda") == ["cuda:0", "cuda:1"]
    assert disagg.instance_devices(3, "cpu") is None
    with pytest.raises(ValueError, match="3 engines need 3 GPUs .* has 2"):
        disagg.instance_devices(3, "auto")
