"""A generated block of a Markdown file between two HTML-comment markers: replaced in place when the markers are
there, else added as a new section before `before` (the reproduction scripts' tables in assets/models/README.md)."""
from pathlib import Path


def write_block(path, begin: str, end: str, lines: list, heading: str, before: str = "## What changed (issue 26)"):
    p = Path(path)
    text = p.read_text()
    block = "\n".join([begin, ""] + lines + ["", end])
    if begin in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.replace(before, f"## {heading}\n\n{block}\n\n{before}")
    p.write_text(text)
    return block
