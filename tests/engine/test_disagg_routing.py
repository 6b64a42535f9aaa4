"""The 1P1D front's choice between splitting a prompt and running it whole (`--disaggregate-
min-prompt TOKENS|auto`): the fixed line, and the measured one (a prompt runs whole when its
prefill at the measured prompt rate fits the ITL budget), through DisaggregatedClient's routing
with stand-ins for the engines."""

from __future__ import annotations

import asyncio

import pytest

from ladle.frontend.disagg_routing import DEFAULT_ITL_BUDGET_S, SplitPolicy
from ladle.protocol.messages import SchedulerStats
from tests.engine.test_disagg_client import PARAMS, client  # noqa: F401 -- the fixture


def stats(rate: float) -> SchedulerStats:
    return SchedulerStats(prefill_tokens_per_s=rate)


def test_parse_fixed_and_auto():
    assert SplitPolicy.parse("0") == SplitPolicy()
    assert SplitPolicy.parse(512).line(None, None) == 512
    assert SplitPolicy.parse("auto").itl_budget_s == DEFAULT_ITL_BUDGET_S
    assert SplitPolicy.parse("AUTO", itl_slo_ms=30.0).itl_budget_s == pytest.approx(0.03)
    for bad in ("-1", "many", None):
        with pytest.raises(ValueError, match="disaggregate-min-prompt"):
            SplitPolicy.parse(bad)


def test_auto_line_follows_the_measured_rate():
    policy = SplitPolicy.parse("auto", itl_slo_ms=20.0)
    assert policy.line(None, None) == 0  # nothing measured: split everything
    assert policy.line(stats(0.0), stats(0.0)) == 0
    # The whole-run engine has not computed a prompt yet: the prefill engine's rate stands in.
    assert policy.line(stats(0.0), stats(50_000.0)) == 1000
    assert policy.line(stats(10_000.0), stats(50_000.0)) == 200  # its own rate, once measured
    assert policy.line(stats(10.0), None) == 1  # never below one token


def test_auto_routes_by_measured_rate(client):  # noqa: F811 -- the fixture
    async def run():
        client.split_policy = SplitPolicy.parse("auto", itl_slo_ms=10.0)
        client.add_request("early", None, [5] * 30, PARAMS)  # nothing measured yet: split
        # 2,000 prompt tokens/s on the prefill engine: a 10 ms budget is a 20-token line.
        client.instance_stats[client.prefill.role] = stats(2000.0)
        client.add_request("short", None, [5] * 19, PARAMS)
        client.add_request("long", None, [5] * 21, PARAMS)
        # The decode engine measured a slower prompt rate of its own: the line drops to 5.
        client.instance_stats[client.decode.role] = stats(500.0)
        client.add_request("short2", None, [5] * 6, PARAMS)
        split = [m.requests[0] for m in client.prefill.sent
                 if m.requests[0].kv_transfer_params is not None]
        assert [r.request_id for r in split] == ["early", "long", "short2"]
        whole = [m.requests[0].request_id for m in client.decode.sent]
        assert whole == ["short"]
        assert (client.num_split, client.num_whole) == (3, 1)

    asyncio.run(run())


def test_cli_builds_the_policy(monkeypatch):
    from ladle.cli import disagg
    from ladle.frontend.admission import AdmissionController
    from ladle.frontend.metrics import ServerMetrics

    monkeypatch.setattr(disagg, "count_cuda_devices", lambda: 0)

    def build(value, text="1P1D", **options):
        return disagg.build_disaggregated_client(
            text, 1, {"model": "m", **options}, ServerMetrics("m"),
            AdmissionController(None, None), None, lambda reason: None, min_prompt_tokens=value,
        )

    assert build("auto", itl_slo_ms=25.0).split_policy.itl_budget_s == pytest.approx(0.025)
    assert build("auto").split_policy.itl_budget_s == DEFAULT_ITL_BUDGET_S
    assert build("300").min_prompt_tokens == 300
    with pytest.raises(ValueError, match="goes with --disaggregate"):
        build("auto", text=None)
