"""`ladle serve`'s API process reaches the engine's spawn without importing torch: torch's import
(1.5-3 s) there would delay the engine's whole start-up by as much (docs/benchmarks.md, issue 8
start-up)."""

from __future__ import annotations

import subprocess
import sys

API_PROCESS_IMPORTS = """
import sys
from ladle.cli.main import build_parser
build_parser()  # every subcommand's parser, as `ladle serve` builds them
from ladle.config import EngineConfig
from ladle.frontend.client import AsyncEngineClient
from ladle.cli.serve import run_serve
from ladle.entrypoints.openai.server import build_app
from ladle.threads import configure_api_process_threads
EngineConfig.from_kwargs(model="qwen3-0.6b", load_format="dummy", dtype="bf16")
configure_api_process_threads()
loaded = sorted(name for name in ("torch", "triton") if name in sys.modules)
print(",".join(loaded))
"""


def test_the_api_process_spawns_the_engine_without_torch():
    result = subprocess.run(
        [sys.executable, "-c", API_PROCESS_IMPORTS], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
