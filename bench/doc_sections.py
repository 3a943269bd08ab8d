"""docs/benchmarks.md is a reference made of sections, each written by the tool that measures
it (`make bench`: bench/report.py; `make goals`: bench/goals_chart.py; `make soak`:
bench/soak_proxy.py). A tool replaces its own section, between its markers, and leaves the rest
of the page as it is, so a run brings the page up to date instead of adding a dated section:

  <!-- make goals: begin (written by bench/goals_chart.py; edits here are lost) -->
  ...
  <!-- make goals: end -->

A page without the section gets it at its end.
"""
import os
import re


def _markers(name):
    """The begin and end markers of section `name`, as regular expressions."""
    begin = re.compile(r"<!-- " + re.escape(name) + r": begin\b[^>]*-->")
    end = re.compile(r"<!-- " + re.escape(name) + r": end -->")
    return begin, end


def write_section(path, name, writer, lines):
    """Writes `lines` (a list of Markdown lines) as section `name` of the page at `path`,
    replacing that section if the page has it, else adding it at the end; the rest of the page
    is kept byte for byte. Raises ValueError if the page has the section's begin marker without
    its end, or either twice: a page a tool cannot read safely is not rewritten."""
    try:
        with open(path) as f:
            page = f.read()
    except FileNotFoundError:
        page = ""
    begin, end = _markers(name)
    starts, ends = list(begin.finditer(page)), list(end.finditer(page))
    if len(starts) > 1 or len(ends) > 1 or len(starts) != len(ends):
        raise ValueError(f"{path}: section {name!r} has {len(starts)} begin and {len(ends)} end "
                         "markers; expected one of each or none")
    block = (f"<!-- {name}: begin (written by {writer}; edits here are lost) -->\n"
             + "\n".join(lines).strip("\n") + f"\n<!-- {name}: end -->")
    if starts:
        if ends[0].start() < starts[0].end():
            raise ValueError(f"{path}: section {name!r} ends before it begins")
        page = page[:starts[0].start()] + block + page[ends[0].end():]
    else:
        page = (page.rstrip("\n") + "\n\n" if page.strip() else "") + block + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(page)


def chart_link(alt, chart, page):
    """A Markdown image of `chart` as a link relative to `page`'s folder."""
    return f"![{alt}]({os.path.relpath(chart, os.path.dirname(os.path.abspath(page)))})"
