"""Ray Serve for the offline GPU machines, under the 64 MiB a device call carries (issue 13).

Ray's cp312 wheel is 79 MB; without what a Serve deployment never loads (its Java jars, RLlib,
the dashboard's JavaScript source maps) and LZMA-compressed (pip reads ZIP_LZMA wheels), it is
32.7 MB. Beside it go the `serve` extra's dependencies that the device image lacks (numpy,
aiohttp, grpcio's base, pyyaml ... are there already; see the device's KINDS.md), 49 MB in all:

    pip download "ray[serve]==2.60.0" --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux2014_x86_64 -d /tmp/rayw
    python scripts/slim_ray_wheel.py /tmp/rayw /work/main/.whl_ray

On the device: `pip install --no-index --no-deps --target /tmp/site .whl/*.whl .whl_ray/*.whl`.
Tested here with a bare python3.12 venv holding only the device's packages: ray.init, a Serve
app of two deployments behind FastAPI, an HTTP answer.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

# The serve extra's dependencies missing from the device image (the rest it has).
CARRIED = (
    "jsonschema", "jsonschema_specifications", "referencing", "rpds_py", "opentelemetry_proto",
    "opentelemetry_sdk", "opentelemetry_semantic_conventions",
    "opentelemetry_exporter_prometheus", "mmh3", "aiohttp_cors", "grpcio_reflection", "grpcio",
    "protobuf", "opencensus", "opencensus_context", "google_api_core", "google_auth",
    "googleapis_common_protos", "proto_plus", "pyasn1", "pyasn1_modules", "cryptography", "cffi",
    "pycparser", "smart_open", "watchfiles", "colorful", "httptools", "websockets",
    "python_dotenv",
)  # fmt: skip


def _dropped(name: str) -> bool:
    return name.startswith(("ray/jars/", "ray/rllib/")) or name.endswith(".map")


def slim(source: Path, target: Path) -> None:
    """Repack `source` without the dropped files, LZMA-compressed, with a RECORD that matches."""
    with zipfile.ZipFile(source) as wheel_in:
        record = next(n for n in wheel_in.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_LZMA) as wheel_out:
            for info in wheel_in.infolist():
                if _dropped(info.filename) or info.filename == record:
                    continue
                data = wheel_in.read(info.filename)
                entry = zipfile.ZipInfo(info.filename, info.date_time)
                entry.external_attr = info.external_attr  # keeps the binaries executable
                entry.compress_type = zipfile.ZIP_LZMA
                wheel_out.writestr(entry, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                lines.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
            lines.append(f"{record},,")
            wheel_out.writestr(record, "\n".join(lines) + "\n")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    downloads, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    [ray_wheel] = downloads.glob("ray-*.whl")
    slim(ray_wheel, out / ray_wheel.name)
    for name in CARRIED:
        matches = list(downloads.glob(f"{name}-[0-9]*.whl"))
        if len(matches) != 1:
            raise SystemExit(f"expected one {name} wheel in {downloads}, found {len(matches)}")
        shutil.copy2(matches[0], out)
    total = sum(path.stat().st_size for path in out.glob("*.whl"))
    print(f"{out}: {len(CARRIED) + 1} wheels, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
