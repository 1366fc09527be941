"""The documents: the docs site builds with ``mkdocs build --strict`` (mkdocs.yml makes a page
missing from the navigation, a broken link and a missing anchor warnings, which --strict turns
into failures), and every link from README.md into docs/ names a page and an anchor that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 400


def slug(heading: str) -> str:
    """A heading's anchor as GitHub (and MkDocs' toc) makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            seen.add(slug(m.group(1)))
    return seen


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages and all(f": {name}" in nav for name in pages), pages


def test_readme_links_into_docs_resolve_on_github() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    into_docs = [link for link in links if link.startswith("docs/")]
    assert len(into_docs) > 10, links
    for link in into_docs:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}: no such file"
        if anchor:
            assert anchor in anchors(target), f"README links to {link}: no such heading"
    assert not [link for link in links if link.startswith(("/", "#"))], links


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    for command in ("scripts/demo", "scripts/test"):
        assert f"```\n{command}\n```" in README.read_text()
