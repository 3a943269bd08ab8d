#!/usr/bin/env python3
"""The docs hold what they say. Two checks over README.md, tests/README.md and docs/ (ctests):

  links      every relative link resolves: the file or folder it names exists, and its #anchor
             is a heading (or an id) of the Markdown file it points into. Links to the web are
             not followed. (docs_links)
  snippets   every C++ snippet fenced as ```cpp compile compiles against the public headers
             alone (include/, as a user's program sees them): each is written to
             OUT/<page>_<line>.cc and checked by the compiler (-fsyntax-only: all of C++'s
             rules, no code generated, nothing linked). A plain ```cpp fence is a fragment and
             is left alone. (docs_snippets)

Each prints what fails (FILE:LINE and why) and exits 1 if anything does.

Usage: scripts/check-docs.py links [REPO]
       scripts/check-docs.py snippets --cxx COMPILER --out DIR [REPO]"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys

# A fence: three or more backticks (and no backtick after them) or tildes.
FENCE = re.compile(r"^\s{0,3}(`{3,}(?=[^`]*$)|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_TARGET = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
HTML_ID = re.compile(r"<[a-z]+\s[^>]*?(?:id|name)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
SNIPPET_OPEN = re.compile(r"^\s*```\s*c(?:pp|\+\+)\s+compile\s*$")
SNIPPET_CLOSE = re.compile(r"^\s*```\s*$")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks, inline code blanked."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            opened = FENCE.match(line)
            if fence is None and opened:
                fence = opened.group(1)
                continue
            if fence is not None:
                # Closed by a fence of the same character, at least as long, with nothing after.
                if opened and opened.group(1)[0] == fence[0] and \
                        len(opened.group(1)) >= len(fence) and not line.strip(" `~\n"):
                    fence = None
                continue
            yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line.rstrip("\n"))


def slug(heading):
    """GitHub's anchor for a heading's text: links and markup reduced to their words, lower
    case, punctuation dropped but for '-' and '_', spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path, cache={}):
    """The anchors a Markdown file offers: its headings' slugs (repeats numbered -1, -2, ...,
    as GitHub does) and the ids of its HTML elements."""
    if path not in cache:
        found, seen = set(), {}
        for _, line in prose_lines(path):
            heading = HEADING.match(line)
            if heading:
                base = slug(heading.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
            found.update(HTML_ID.findall(line))
        cache[path] = found
    return cache[path]


def targets(line):
    """The link targets written on one line of prose."""
    found = INLINE_LINK.findall(line) + HTML_TARGET.findall(line)
    reference = REFERENCE.match(line)
    if reference:
        found.append(reference.group(1))
    return found


def broken(root, page, target):
    """Why `target`, a link on Markdown file `page`, does not resolve; None if it does."""
    if SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    path = re.sub(r"%20", " ", path)
    if path:
        base = root if path.startswith("/") else os.path.dirname(page)
        resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
        if not os.path.exists(resolved):
            return f"no file {os.path.relpath(resolved, root)}"
    else:
        resolved = page
    if anchor and resolved.endswith(".md") and anchor.lower() not in anchors(resolved):
        return f"no heading #{anchor} in {os.path.relpath(resolved, root)}"
    return None


def pages(root):
    """README.md, tests/README.md and every Markdown file under docs/."""
    found = [os.path.join(root, "README.md"), os.path.join(root, "tests", "README.md")]
    for folder, _, files in os.walk(os.path.join(root, "docs")):
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return [p for p in found if os.path.exists(p)]


def check_links(root):
    """Prints every broken link; 1 if there is one (or no link at all), else 0."""
    checked, failures = 0, []
    for page in pages(root):
        for number, line in prose_lines(page):
            for target in targets(line):
                checked += 1
                why = broken(root, page, target)
                if why:
                    failures.append(f"{os.path.relpath(page, root)}:{number}: ({target}) {why}")
    for failure in failures:
        print(failure)
    print(f"check-docs links: {checked} links, {len(failures)} broken")
    return 1 if failures or checked == 0 else 0


def snippets(page):
    """(first line, text) of each ```cpp compile block of Markdown file `page`."""
    found, lines, start = [], None, 0
    with open(page, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if lines is None and SNIPPET_OPEN.match(line):
                lines, start = [], number + 1
            elif lines is not None and SNIPPET_CLOSE.match(line):
                found.append((start, "".join(lines)))
                lines = None
            elif lines is not None:
                lines.append(line)
    return found


def compile_one(cxx, root, source):
    """The compiler's complaint about `source`, or None if it compiles."""
    done = subprocess.run([cxx, "-std=c++23", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                           "-Wno-unused-parameter", "-I", os.path.join(root, "include"), source],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr


def check_snippets(root, cxx, out):
    """Compiles every ```cpp compile snippet; prints each failure; 1 if one fails, else 0."""
    os.makedirs(out, exist_ok=True)
    sources = {}
    for page in pages(root):
        name = os.path.relpath(page, root).replace("/", "_").removesuffix(".md")
        for line, text in snippets(page):
            source = os.path.join(out, f"{name}_{line}.cc")
            with open(source, "w") as f:
                f.write(f'#line {line} "{os.path.relpath(page, root)}"\n{text}')
            sources[source] = f"{os.path.relpath(page, root)}:{line}"
    with concurrent.futures.ThreadPoolExecutor() as pool:
        complaints = dict(zip(sources, pool.map(lambda s: compile_one(cxx, root, s), sources)))
    failed = [s for s, why in complaints.items() if why]
    for source in failed:
        print(f"{sources[source]}: does not compile:\n{complaints[source]}")
    print(f"check-docs snippets: {len(sources)} snippets, {len(failed)} failed")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("check", choices=["links", "snippets"])
    parser.add_argument("--cxx", default=os.environ.get("CXX", "c++"))
    parser.add_argument("--out", help="where the snippets are written (snippets)")
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_intermixed_args()
    root = os.path.abspath(args.root)
    if args.check == "links":
        return check_links(root)
    if not args.out:
        parser.error("snippets needs --out DIR")
    return check_snippets(root, args.cxx, args.out)


if __name__ == "__main__":
    sys.exit(main())
