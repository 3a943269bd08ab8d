#!/usr/bin/env python3
"""Checks that includes point down the layers (docs/architecture.md draws them).

Each folder of include/spindle/ and src/ is a layer built as its own library; a file of a
layer may include only the public headers of the layers below it (and its own). The table
below is the one place the order is written; the libraries' links in src/CMakeLists.txt
follow it. Exit status 1 and one line per include that points up or sideways.
"""
import pathlib
import re
import sys

RUNTIME = {"base", "io", "fiber", "sync", "net"}
BELOW = {
    "base": set(),
    "io": {"base"},
    "fiber": {"base", "io"},
    "sync": {"base", "io", "fiber"},
    "net": {"base", "io", "fiber", "sync"},
    "http": {"base"},
    "h1": {"base", "http"},
    "h2": {"base", "http"},
    "server": RUNTIME | {"http", "h1", "h2"},
    "client": RUNTIME | {"http", "h1", "h2"},
    "handlers": RUNTIME | {"http", "h1", "h2", "server"},
    "hook": RUNTIME,
    "pg": RUNTIME,
    "proxy": RUNTIME | {"http", "h1", "h2", "server", "client", "handlers"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"spindle/([a-z0-9_]+)/', re.M)


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    wrong = []
    seen = set()
    for top in (root / "include" / "spindle", root / "src"):
        for layer_dir in sorted(p for p in top.iterdir() if p.is_dir()):
            layer = layer_dir.name
            seen.add(layer)
            if layer not in BELOW:
                wrong.append(f"{layer_dir}: a layer not in scripts/check-layers.py's table")
                continue
            allowed = BELOW[layer] | {layer}
            for path in sorted(layer_dir.rglob("*")):
                if path.suffix not in (".h", ".cc"):
                    continue
                text = path.read_text()
                if re.search(r'^\s*#\s*include\s+"\.\./', text, re.M):
                    wrong.append(f"{path.relative_to(root)}: reaches into another folder by a "
                                 "relative path")
                for used in INCLUDE.findall(text):
                    if used not in allowed:
                        wrong.append(f"{path.relative_to(root)}: includes spindle/{used}/ "
                                     f"({layer} may use only {', '.join(sorted(allowed))})")
    for line in wrong:
        print(line)
    print(f"check-layers: {len(seen)} layers, {len(wrong)} includes out of order")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
