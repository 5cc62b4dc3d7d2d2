"""
One benchmark run from two checkouts in turns -- A, B, A, B... -- so both see the same machine
(its speed drifts by a third within minutes, which moves a figure as much as a change does).

    .venv/bin/python bench/interleave.py OLD_TREE NEW_TREE claims [ROUNDS]

Each run is ``python bench/<name>.py`` in that tree with this interpreter and the environment
as given (set BENCH_* to shorten a run). Prints, for every figure of the RESULT lines whose path
names a rate or a percentile (``per_s``, ``p50``, ``p99``, ``mean``), each tree's runs and the
ratio of their means (B / A), then one ``RESULT {json}`` line with all of it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from statistics import mean

FIGURE = re.compile(r"(per_s|p50|p99|mean)")


def leaves(value, path=""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from leaves(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, float(value)


def run(tree: Path, name: str) -> dict:
    done = subprocess.run([sys.executable, f"bench/{name}.py"], cwd=tree, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"{tree}: bench/{name}.py failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    old, new, name = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for turn in range(rounds):
        for label, tree in (("A", old), ("B", new)):
            print(f"round {turn + 1}: {label} {tree}", flush=True)
            runs[label].append(dict(leaves(run(tree, name))))
    figures = {}
    for path in runs["A"][0]:
        if not FIGURE.search(path) or any(path not in r for r in runs["A"] + runs["B"]):
            continue
        a, b = [r[path] for r in runs["A"]], [r[path] for r in runs["B"]]
        figures[path] = {"A": a, "B": b, "B/A": round(mean(b) / mean(a), 3) if mean(a) else None}
        print(f"{path:70s} A {a}  B {b}  B/A {figures[path]['B/A']}")
    print("RESULT " + json.dumps({"bench": f"interleave:{name}", "A": str(old), "B": str(new), "rounds": rounds,
                                  "figures": figures}))


if __name__ == "__main__":
    main()
