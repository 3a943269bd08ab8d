#!/usr/bin/env python3
"""Every relative link of README.md and docs/ resolves: the file or folder it names exists, and
its #anchor is a heading (or an id) of the Markdown file it points into. Links to the web are
not followed. Prints each broken link as FILE:LINE; exits 1 if there is one.

Usage: scripts/check-doc-links.py [REPO]   (a ctest: docs_links)"""
import os
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_TARGET = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
HTML_ID = re.compile(r"<[a-z]+\s[^>]*?(?:id|name)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


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
                if line.strip().startswith(fence):
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
    """README.md and every Markdown file under docs/."""
    found = [os.path.join(root, "README.md")]
    for folder, _, files in os.walk(os.path.join(root, "docs")):
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return [p for p in found if os.path.exists(p)]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
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
    print(f"check-doc-links: {checked} links, {len(failures)} broken")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
