#!/usr/bin/env python3
"""Checks that includes and links point down the layers (docs/architecture.md draws them).

Each folder of include/spindle/ and src/ is a layer built as a library (the runtime's four as
one); a file of a layer may include only the public headers of the layers below it (and its
own). The gateway, proxy/, is rooms that stack the same way: each folder of src/proxy/ is one
(proxy/<room>, its library spindle_proxy_<room>), a public header of include/spindle/proxy/ is
the room's that holds the .cc of its name, and a room reaches a private header of one below it
as "proxy/<room>/x.h". The table below is the one place the order is written; the libraries'
links in src/CMakeLists.txt follow it: a library links no layer its own may not use, and every
layer its files include. A weak symbol is a link no include shows (a layer reaching one it may not
use, found or not at link time): none is declared. Exit status 1 and one line per include,
link or weak symbol out of order.
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
}
# The gateway's rooms, from the ground up. middlewares/ (one class per middleware kind, the
# route's chain compiled once) is the request's next step, under the gateway that runs it.
PROXY_ROOMS = ["config", "parts", "request", "middlewares", "gateway"]
_under = RUNTIME | {"http", "h1", "h2", "server", "client", "handlers"}
for _room in PROXY_ROOMS:
    BELOW[f"proxy/{_room}"] = set(_under)
    _under = _under | {f"proxy/{_room}"}
WEAK = re.compile(r"\bgnu::weak\b|__attribute__\s*\(\(\s*weak\b|^\s*#\s*pragma\s+weak\b", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s+"spindle/([a-z0-9_]+)/([^"]+)"', re.M)
PRIVATE = re.compile(r'^\s*#\s*include\s+"proxy/([a-z0-9_]+)/', re.M)
GLOB = re.compile(r"file\(GLOB(?:_RECURSE)?\s+(\w+)([^)]*)\)")
FOLDER = re.compile(r"/(\w+)/\*\.cc")
LIBRARY = re.compile(r"add_library\((\w+)\s+(STATIC|INTERFACE)\s*(?:\$\{(\w+)\})?")
LINK = re.compile(r"target_link_libraries\((\w+)\s+(?:PUBLIC|PRIVATE|INTERFACE)([^)]*)\)")


def libraries(cmake):
    """From src/CMakeLists.txt: each library's layers (None for a bundle of other libraries)
    and the spindle libraries it links."""
    text = re.sub(r"#[^\n]*", "", cmake)
    globs = {var: set(FOLDER.findall(args)) for var, args in GLOB.findall(text)}
    named = re.findall(r"^spindle_layer\((\w+)\)", text, re.M)
    layers = {f"spindle_{name}": {name} for name in named}
    for room in re.findall(r"^spindle_room\((\w+)\)", text, re.M):
        layers[f"spindle_proxy_{room}"] = {f"proxy/{room}"}
    for name, kind, var in LIBRARY.findall(text):
        if name.startswith("spindle_") or kind == "INTERFACE":
            layers.setdefault(name, None if kind == "INTERFACE" else globs.get(var, set()))
    links = {name: set() for name in layers}
    for name, args in LINK.findall(text):
        if name in links:
            links[name] |= {arg for arg in args.split() if arg in layers}
    return layers, links


def check_links(root, included):
    """One line per library that links a layer its own may not use, or does not link (even
    through others) a layer its files include."""
    layers, links = libraries((root / "src" / "CMakeLists.txt").read_text())

    def reach(name):  # every layer a library brings, through what it links (loops and all)
        found, todo, seen = set(), [name], set()
        while todo:
            lib = todo.pop()
            if lib not in seen:
                seen.add(lib)
                found |= layers[lib] or set()
                todo += links[lib]
        return found

    wrong = []
    for name, own in layers.items():
        if own is None:
            continue
        allowed = set().union(*(BELOW.get(layer, set()) | {layer} for layer in own))
        for dep in sorted(links[name]):
            if not reach(dep) <= allowed:
                wrong.append(f"src/CMakeLists.txt: {name} links {dep} "
                             f"({', '.join(sorted(reach(dep) - allowed))} beyond what "
                             f"{', '.join(sorted(own))} may use)")
        missing = set().union(*(included.get(layer, set()) for layer in own)) - reach(name)
        if missing:
            wrong.append(f"src/CMakeLists.txt: {name} does not link "
                         f"{', '.join(sorted(missing))}, which its files include")
    # (A room of the table not made yet has no folder, and wants no library.)
    made = {layer for layer in BELOW if (root / "src" / layer).is_dir()}
    unbuilt = made - set().union(*(own for own in layers.values() if own))
    wrong += [f"src/CMakeLists.txt: no library builds {layer}/" for layer in sorted(unbuilt)]
    return wrong


def folders(root):
    """Each layer's (or room's) folders and the files of them it holds: (layer, [paths]), and
    one line for each file of proxy/ that is in no room."""
    found, wrong = [], []
    rooms = {}  # a public header of include/spindle/proxy/ by the room of its .cc
    proxy_src = root / "src" / "proxy"
    for room_dir in sorted(p for p in proxy_src.iterdir() if p.is_dir()):
        for source in room_dir.glob("*.cc"):
            rooms[source.stem + ".h"] = f"proxy/{room_dir.name}"
    for top in (root / "include" / "spindle", root / "src"):
        for layer_dir in sorted(p for p in top.iterdir() if p.is_dir()):
            files = sorted(p for p in layer_dir.rglob("*") if p.suffix in (".h", ".cc"))
            if layer_dir.name != "proxy":
                found.append((layer_dir.name, layer_dir, files))
                continue
            for path in files:
                room = (rooms.get(path.name) if top.name == "spindle" else
                        f"proxy/{path.parent.name}" if path.parent.parent == proxy_src else None)
                if room is None:
                    where = ("has no .cc of its name in a room of src/proxy/"
                             if top.name == "spindle" else "lies in no room of src/proxy/")
                    wrong.append(f"{path.relative_to(root)}: {where}")
                else:
                    found.append((room, path.parent, [path]))
    return found, rooms, wrong


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    found, rooms, wrong = folders(root)
    seen = set()
    included = {}
    for layer, layer_dir, files in found:
        seen.add(layer)
        if layer not in BELOW:
            wrong.append(f"{layer_dir}: a layer not in scripts/check-layers.py's table")
            continue
        allowed = BELOW[layer] | {layer}
        for path in files:
            text = path.read_text()
            if re.search(r'^\s*#\s*include\s+"\.\./', text, re.M):
                wrong.append(f"{path.relative_to(root)}: reaches into another folder by a "
                             "relative path")
            if WEAK.search(text):
                wrong.append(f"{path.relative_to(root)}: declares a weak symbol (a link "
                             "the includes do not show)")
            uses = [rooms.get(header, f"proxy/{header}") if used == "proxy" else used
                    for used, header in INCLUDE.findall(text)]
            uses += [f"proxy/{room}" for room in PRIVATE.findall(text)]
            for used in uses:
                included.setdefault(layer, set()).add(used)
                if used not in allowed:
                    wrong.append(f"{path.relative_to(root)}: includes {used}/ "
                                 f"({layer} may use only {', '.join(sorted(allowed))})")
    includes_wrong = len(wrong)
    wrong += check_links(root, included)
    for line in wrong:
        print(line)
    print(f"check-layers: {len(seen)} layers and rooms, {includes_wrong} includes (or weak "
          f"symbols, or files outside a room) and {len(wrong) - includes_wrong} links out of order")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
