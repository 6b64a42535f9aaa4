"""implements(): the scheduler's protocol checks, cached per class, agree with isinstance.

The scheduler asks per request per step whether its proposer is adaptive or drafts in the
worker; a plain isinstance against a runtime-checkable Protocol cost ~70 us each on Python
3.11 (4 ms of a 128-request decode step, scripts/step_host_ops.py).
"""

from __future__ import annotations

import pytest

from ladle.config import SpeculativeConfig
from ladle.core.draft_proposer import (
    AdaptiveDraftProposer,
    WorkerDraftProposer,
    implements,
)
from ladle.spec_decode.ngram import NgramProposer
from ladle.spec_decode.speculator import Speculator


class _Adaptive:
    def propose(self, request, max_num_tokens):
        return []

    def begin_step(self, num_decodes, prefill_backlog=False):
        return True

    def may_draft(self, request):
        return True

    def observe(self, request_id, num_drafted, num_accepted):
        pass

    def release(self, request):
        pass


class _Plain:
    def propose(self, request, max_num_tokens):
        return []


def _speculator() -> Speculator:
    return Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=2))


@pytest.mark.parametrize("protocol", [AdaptiveDraftProposer, WorkerDraftProposer])
@pytest.mark.parametrize("make", [_Adaptive, _Plain, lambda: NgramProposer(2, 4), _speculator])
def test_implements_agrees_with_isinstance(make, protocol):
    proposer = make()
    expected = isinstance(proposer, protocol)
    assert implements(proposer, protocol) is expected
    assert implements(proposer, protocol) is expected  # the cached answer


def test_implements_none_and_the_speculator():
    assert not implements(None, AdaptiveDraftProposer)
    assert implements(_Adaptive(), AdaptiveDraftProposer)
    assert not implements(_Plain(), AdaptiveDraftProposer)
    assert implements(_speculator(), AdaptiveDraftProposer)  # the engine's adaptive proposer
