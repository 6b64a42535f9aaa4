"""The C kernels are built on the user's machine from files shipped in the wheel: every source
and header the build reads must match the package-data patterns (an installed wheel without a
header falls back to the slow torch path without saying why)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from ladle.kernels.cpu_native import build

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_the_build_reads_ships_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["ladle"]
    here = Path(build.__file__).parent
    for name in (*build.SOURCES, *build.HEADERS):
        assert (here / name).is_file(), name
        relative = (here / name).relative_to(ROOT / "src" / "ladle").as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative
    # Every header the sources include is one the build hashes (so an edit rebuilds the library).
    included = {
        line.split('"')[1]
        for name in build.SOURCES
        for line in (here / name).read_text().splitlines()
        if line.startswith('#include "')
    }
    assert included <= set(build.HEADERS), included - set(build.HEADERS)
