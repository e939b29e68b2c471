"""Tests of links.py on a repository made up in a temporary folder."""

from __future__ import annotations

import importlib.util
import tempfile
import unittest
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("links", Path(__file__).with_name("links.py"))
assert SPEC is not None and SPEC.loader is not None
links = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(links)


class LinksTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.root = Path(self.dir.name)
        (self.root / "docs").mkdir()
        (self.root / "src").mkdir()
        (self.root / "src" / "lib.rs").write_text("")
        (self.root / "docs" / "guide.md").write_text("# Guide\n\n## The `sim` command: how\n")
        links.ROOT = self.root

    def tearDown(self) -> None:
        self.dir.cleanup()

    def problems(self, text: str) -> list[str]:
        md = self.root / "README.md"
        md.write_text(text)
        tops = {p.name for p in self.root.iterdir()}
        return links.check(md, tops, {})

    def test_links_anchors_and_paths_that_resolve_pass(self) -> None:
        text = (
            "# Top\n\nSee [top](#top), [guide](docs/guide.md#the-sim-command-how),\n"
            "[web](https://example.invalid/x#y), `src/lib.rs`, `src/lib.rs:12`, `not/a/top.rs`.\n"
            "```\n[in code](nowhere.md) `src/gone.rs`\n```\n"
        )
        self.assertEqual(self.problems(text), [])

    def test_each_broken_link_anchor_and_path_is_named(self) -> None:
        text = "# Top\n\n[a](#nope) [b](docs/guide.md#nah) [c](docs/gone.md) `src/gone.rs`\n"
        found = self.problems(text)
        self.assertEqual(len(found), 4, found)
        self.assertIn("README.md:3: link to #nope: README.md has no heading #nope", found)
        self.assertTrue(any("docs/guide.md has no heading #nah" in p for p in found), found)
        self.assertTrue(any("no such file docs/gone.md" in p for p in found), found)
        self.assertTrue(any("`src/gone.rs`: no such path" in p for p in found), found)

    def test_a_link_whose_text_wraps_onto_the_next_line_is_checked(self) -> None:
        text = "# Top\n\nSee [the wrapped\nguide](docs/gone.md) and [fine\ntext](#top).\n"
        self.assertEqual(
            self.problems(text), ["README.md:4: link to docs/gone.md: no such file docs/gone.md"]
        )

    def test_repeated_headings_get_numbered_anchors(self) -> None:
        text = "# Top\n\n## Notes\n\n## Notes\n\n[second](#notes-1) [third](#notes-2)\n"
        self.assertEqual(len(self.problems(text)), 1)


if __name__ == "__main__":
    unittest.main()
