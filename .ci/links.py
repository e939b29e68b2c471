#!/usr/bin/env python3
"""Checks the internal links of the repository's Markdown: every `[text](target)` that is not a
URL names a file that exists and, after `#`, a heading of it (GitHub's anchors); every path in
backticks that starts at a top-level folder or file of the repository exists. Prints each broken
one as FILE:LINE: what, and exits 1 if there is any.

Usage: .ci/links.py [FILE.md ...]   (default: the top-level *.md files and docs/**/*.md)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"`([^`\s]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
PATH_LIKE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*/?$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_code(path: Path) -> list[tuple[int, str]]:
    """The file's lines with their numbers, fenced code blocks left out."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def anchors(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path not in cache:
        seen: dict[str, int] = {}
        found = set()
        for _, line in lines_outside_code(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        cache[path] = found
    return cache[path]


def check_link(md: Path, target: str, cache: dict[Path, set[str]]) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.\-]*:", target):  # https:, mailto:, ...
        return None
    file_part, _, anchor = target.partition("#")
    dest = (md.parent / file_part).resolve() if file_part else md
    if not dest.exists():
        return f"link to {target}: no such file {file_part}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest, cache):
        return f"link to {target}: {dest.relative_to(ROOT)} has no heading #{anchor}"
    return None


def check_code_path(md: Path, text: str, tops: set[str]) -> str | None:
    """A backticked repository path (`capi/src/ffi.rs`, `docs/hal.md`) must exist."""
    path = text.split("::")[0].split(":")[0]
    if not PATH_LIKE.match(path) or "/" not in path.rstrip("/"):
        return None
    if path.split("/")[0] not in tops:
        return None
    if (ROOT / path).exists() or (md.parent / path).exists():
        return None
    return f"`{text}`: no such path in the repository"


def check(md: Path, tops: set[str], cache: dict[Path, set[str]]) -> list[str]:
    problems = []
    kept = dict(lines_outside_code(md))
    # One text, fenced lines blanked, so that a link whose text wraps onto the next line is
    # found too; a problem is reported at the line of its target.
    last = max(kept, default=0)
    text = "\n".join(kept.get(n, "") for n in range(1, last + 1))
    for m in LINK.finditer(text):
        why = check_link(md, m.group(1), cache)
        if why:
            n = text.count("\n", 0, m.start(1)) + 1
            problems.append(f"{md.relative_to(ROOT)}:{n}: {why}")
    for n, line in kept.items():
        for code in CODE.findall(line):
            why = check_code_path(md, code, tops)
            if why:
                problems.append(f"{md.relative_to(ROOT)}:{n}: {why}")
    return problems


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or sorted(
        [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md")]
    )
    tops = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") and p.name != "target"}
    cache: dict[Path, set[str]] = {}
    problems = [p for md in files for p in check(md, tops, cache)]
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} broken internal link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
