"""One line of a `ladle bench --json` file's figures, then one line per rank profile
(`--profile-ranks`): the device round scripts' summary lines. Exits 1 when the file is missing
or unreadable (the run failed), so a script can say so instead.

    python3 scripts/bench_json_summary.py RESULT.json NAME
"""

from __future__ import annotations

import json
import sys

KEYS = ("tokens_per_s", "decode_ms_per_token", "itl_ms_p50", "itl_ms_p90", "ttft_ms_p50",
        "startup_s", "first_token_s_median")


def main() -> int:
    path, name = sys.argv[1], sys.argv[2]
    try:
        with open(path) as file:
            data = json.load(file)
    except (OSError, ValueError):
        return 1
    print(name, " ".join(f"{key}={data[key]}" for key in KEYS if key in data))
    for rank, profile in enumerate(data.get("rank_profiles") or []):
        if profile is None:
            print(f"  rank {rank}: profile window not reached")
            continue
        print(f"  rank {rank}: wall {profile['wall_ms_per_step']} ms/step, busy "
              f"{profile['busy_fraction']}, computing {profile.get('compute_busy_fraction')}, "
              f"collectives {profile['collective_ms_per_step']} ms/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
