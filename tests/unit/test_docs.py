"""The docs a reader can trust: every committed picture or result under docs/
is linked from some page, and every relative link in the pages resolves.

A results file nobody links is a dump nobody can find or date; a link to a
moved or deleted file is a page that lies. Both are plain file checks, so
they run with the unit tests, not after a release."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Artifacts, not prose: what a bench, a profiler or a screenshot wrote.
ARTIFACT_SUFFIXES = {".png", ".json", ".txt", ".svg"}
# Markdown links and images: [text](target) / ![alt](target "title").
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# Folders that hold no page of the project: virtual environments, tools,
# run directories and caches (all of them dot-folders) and vendored packages.
SKIPPED_PARTS = {"node_modules", "__pycache__"}


def _pages(root: Path) -> list[Path]:
    """Every .md of the project, outside dot-folders and vendored trees."""
    pages = []
    for path in root.rglob("*.md"):
        parts = path.relative_to(root).parts
        if any(p.startswith(".") or p in SKIPPED_PARTS for p in parts):
            continue
        pages.append(path)
    return pages


def _relative_targets(page: Path) -> list[tuple[str, Path]]:
    """(link as written, file it points at) for each relative link of a page."""
    targets = []
    for raw in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", raw) or raw.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor on the same page
        path = raw.split("#", 1)[0].split("?", 1)[0]
        if path:
            targets.append((raw, (page.parent / path).resolve()))
    return targets


def unlinked_artifacts(root: Path, docs: Path) -> list[str]:
    linked = {target for page in _pages(root) for _, target in _relative_targets(page)}
    return sorted(
        str(path.relative_to(root))
        for path in docs.rglob("*")
        if path.suffix in ARTIFACT_SUFFIXES and path.is_file() and path.resolve() not in linked)


def broken_links(root: Path, pages: list[Path]) -> list[str]:
    return sorted(
        f"{page.relative_to(root)}: ({raw})"
        for page in pages
        for raw, target in _relative_targets(page)
        if not target.exists())


def test_every_artifact_under_docs_is_linked_from_a_page() -> None:
    unlinked = unlinked_artifacts(ROOT, DOCS)
    assert not unlinked, (
        "files under docs/ that no page links (link them where they are explained, "
        f"or git rm them): {unlinked}")


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted(DOCS.glob("*.md"))]
    broken = broken_links(ROOT, pages)
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_checks_catch_an_unlinked_file_and_a_dangling_link(tmp_path: Path) -> None:
    # The two checks above pass on a tidy tree, which a check that finds
    # nothing would too: show each one finding its fault in a small tree.
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    (docs / "results" / "linked.json").write_text("{}", encoding="utf-8")
    (docs / "results" / "orphan.png").write_bytes(b"")
    (docs / "shot.png").write_bytes(b"")
    (tmp_path / ".venv").mkdir()  # a page in a dot-folder links nothing of ours
    (tmp_path / ".venv" / "x.md").write_text("![](../docs/results/orphan.png)", encoding="utf-8")
    page = docs / "page.md"
    page.write_text(
        "[ok](page.md) [raw](results/linked.json#top) [web](https://x.org/a.png)\n"
        "[gone](results/gone.json) [anchor](#here)\n", encoding="utf-8")
    (tmp_path / "README.md").write_text('![shot](docs/shot.png "title")\n', encoding="utf-8")

    assert unlinked_artifacts(tmp_path, docs) == ["docs/results/orphan.png"]
    assert broken_links(tmp_path, [page]) == ["docs/page.md: (results/gone.json)"]
