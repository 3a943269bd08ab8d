"""Writes a benchmark's figures as JSON, making the folder first: bench/results/ is not in git,
so a fresh clone has none, and a run by hand would otherwise lose its figures at the end."""
import json
import os


def write_results(path, data, indent=2):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=indent)
