#!/usr/bin/env python3
"""The C++ snippets of README.md and docs/ that say they compile (a fence opened as
```cpp compile) are compiled against the public headers (include/ only, as a user's program
would see them): each is written to OUT/<page>_<line>.cc and checked by the compiler
(-fsyntax-only: the whole of C++'s rules, no code generated, nothing linked). Snippets fenced as
plain ```cpp are fragments and are left alone. Prints each failure with the compiler's words;
exits 1 if one fails.

Usage: scripts/compile-doc-snippets.py --cxx COMPILER --out DIR [REPO]   (a ctest: docs_snippets)"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys

OPEN = re.compile(r"^\s*```\s*c(?:pp|\+\+)\s+compile\s*$")
CLOSE = re.compile(r"^\s*```\s*$")


def snippets(page):
    """(first line, text) of each ```cpp compile block of Markdown file `page`."""
    found, lines, start = [], None, 0
    with open(page, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if lines is None and OPEN.match(line):
                lines, start = [], number + 1
            elif lines is not None and CLOSE.match(line):
                found.append((start, "".join(lines)))
                lines = None
            elif lines is not None:
                lines.append(line)
    return found


def pages(root):
    """README.md and every Markdown file under docs/."""
    found = [os.path.join(root, "README.md")]
    for folder, _, files in os.walk(os.path.join(root, "docs")):
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return [p for p in found if os.path.exists(p)]


def compile_one(cxx, root, source):
    """The compiler's complaint about `source`, or None if it compiles."""
    done = subprocess.run([cxx, "-std=c++23", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                           "-Wno-unused-parameter", "-I", os.path.join(root, "include"), source],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    parser.add_argument("--out", required=True)
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    os.makedirs(args.out, exist_ok=True)
    sources = {}
    for page in pages(root):
        name = os.path.relpath(page, root).replace("/", "_").removesuffix(".md")
        for line, text in snippets(page):
            source = os.path.join(args.out, f"{name}_{line}.cc")
            with open(source, "w") as f:
                f.write(f'#line {line} "{os.path.relpath(page, root)}"\n{text}')
            sources[source] = f"{os.path.relpath(page, root)}:{line}"
    with concurrent.futures.ThreadPoolExecutor() as pool:
        complaints = dict(zip(sources, pool.map(lambda s: compile_one(args.cxx, root, s), sources)))
    failed = [s for s, why in complaints.items() if why]
    for source in failed:
        print(f"{sources[source]}: does not compile:\n{complaints[source]}")
    print(f"compile-doc-snippets: {len(sources)} snippets, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
