"""The research scripts under benchmarks/ are not part of the ladle package; their tests import
them by module name from that folder, as the scripts import each other when run."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
