"""The docs a reader can trust: every committed picture or result under docs/
is linked from some page, every relative link in the pages resolves, every
repo path a page names in backticks (`streamlab/lab/local.py`) exists, and no
page or source cites a tracker ticket instead of saying what it means.

A results file nobody links is a dump nobody can find or date; a link to a
moved or deleted file, or a module named where it no longer lives, is a page
that lies; a ticket number tells a newcomer nothing the code does not. All are
plain file checks, so they run with the unit tests, not after a release."""

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
# The repo's top folders a page names paths under; an inline code span that
# starts with one of them (`services/gateway/lease.py`) is a claim that the
# path exists. Fenced blocks are left out: they hold commands and their
# output, which name files a run writes (a certificate, a results file).
REPO_FOLDERS = ("streamlab", "streamlab_protocol", "services", "tests", "docs", "proxies",
                "scripts", "protos", ".ci")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A ticket cited by number as the reason for something: say what the target or
# the reason is instead.
TICKET = re.compile(r"\bissue[ -]?[0-9]", re.IGNORECASE)


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
    broken = broken_links(ROOT, _doc_pages())
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


def named_paths(page: Path) -> list[str]:
    """Repo paths a page names in inline code: the span's first word, without a
    pytest node id (`::test_x`) or a trailing slash; a glob names no one path."""
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))
    paths = []
    for span in CODE_SPAN.findall(prose):
        if not span.strip():
            continue  # a code span of a space (` `), as a page shows a separator
        word = span.split()[0].split("::", 1)[0].rstrip("/.,:")
        if word.split("/", 1)[0] in REPO_FOLDERS and "/" in word and not set(word) & set("*<>{}…"):
            paths.append(word)
    return paths


def missing_paths(root: Path, pages: list[Path]) -> list[str]:
    return sorted(
        f"{page.relative_to(root)}: `{path}`"
        for page in pages
        for path in named_paths(page)
        if not (root / path).exists())


def ticket_citations(root: Path, places: list[Path]) -> list[str]:
    """`path:line: text` for each line of a text file under `places` (files or
    folders; pictures and other binaries are passed over) that cites a ticket
    by number."""
    files = [f for place in places
             for f in ([place] if place.is_file() else sorted(place.rglob("*")))
             if f.is_file()
             and not any(p in SKIPPED_PARTS for p in f.relative_to(root).parts)]
    cited = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a picture or a compiled file: no prose to cite anything in
        cited += [f"{f.relative_to(root)}:{number}: {line.strip()}"
                  for number, line in enumerate(text.splitlines(), 1) if TICKET.search(line)]
    return cited


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted(DOCS.glob("*.md"))]


def test_every_repo_path_the_docs_name_exists() -> None:
    missing = missing_paths(ROOT, _doc_pages())
    assert not missing, f"paths the docs name that do not exist (moved? say where): {missing}"


def test_no_source_or_page_cites_a_ticket_number() -> None:
    places = [ROOT / "streamlab", ROOT / "services", DOCS, ROOT / "README.md",
              ROOT / "ARCHITECTURE.md"]
    cited = ticket_citations(ROOT, places)
    assert not cited, (
        "say what the target or the reason is, not which ticket asked for it: "
        f"{cited}")


def test_the_path_and_ticket_checks_catch_a_moved_module_and_a_ticket(tmp_path: Path) -> None:
    # As above: both checks find nothing on a tidy tree, so show each one
    # finding its fault. The citations are spliced from parts so that this file
    # passes the same grep it teaches.
    ticket, spelled = "issue" + " 7", "Issue" + "-12"
    (tmp_path / "streamlab" / "lab").mkdir(parents=True)
    (tmp_path / "streamlab" / "lab" / "local.py").write_text(
        f'"""Starts the lab (the order is why, not {ticket})."""\n', encoding="utf-8")
    (tmp_path / "streamlab" / "cli.py").write_text(f"# {spelled} asked for it\n", encoding="utf-8")
    (tmp_path / "streamlab" / "page.css").write_text("a { color: #123456 }\n", encoding="utf-8")
    (tmp_path / "streamlab" / "shot.png").write_bytes(b"\x89PNG\xff " + ticket.encode())
    page = tmp_path / "README.md"
    page.write_text(
        "`streamlab/lab/local.py` and `streamlab/local.py` (moved), "
        "`streamlab/lab/` `streamlab/*.py` `tests/x.py::test_y`, `make up` `a/b.py`\n"
        "```\ncat streamlab/gone.py `streamlab/gone.py`\n```\n", encoding="utf-8")

    assert missing_paths(tmp_path, [page]) == [
        "README.md: `streamlab/local.py`", "README.md: `tests/x.py`"]
    assert ticket_citations(tmp_path, [tmp_path / "streamlab", page]) == [
        f"streamlab/cli.py:1: # {spelled} asked for it",
        f'streamlab/lab/local.py:1: """Starts the lab (the order is why, not {ticket})."""']
