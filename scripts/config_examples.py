#!/usr/bin/env python3
"""The YAML examples of the documentation: every ```yaml block of the given Markdown files.

As a program: writes each one to OUT_DIR/<doc>-<n>.yaml (the seed corpus of the configuration
fuzz driver, `make fuzz`). The integration tests load every one of them with check-config.

    scripts/config_examples.py OUT_DIR docs/configuration.md [more.md ...]
"""
import os
import re
import sys

BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)


def examples(markdown_path):
    """The YAML blocks of one Markdown file, in order."""
    with open(markdown_path, encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    count = 0
    for doc in sys.argv[2:]:
        name = os.path.splitext(os.path.basename(doc))[0]
        for i, text in enumerate(examples(doc)):
            with open(os.path.join(out, f"{name}-{i}.yaml"), "w", encoding="utf-8") as f:
                f.write(text)
            count += 1
    print(f"config_examples: {count} examples written to {out}")


if __name__ == "__main__":
    main()
