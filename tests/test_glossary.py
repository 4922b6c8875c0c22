"""notebooks/GLOSSARY.md: one entry per course term, each naming the notebook and section that
define it, and every link into it resolving.

Reads the notebooks as JSON and never runs them. An entry is a list item of the form

    - <a id="anchor"></a>**name / other name (note)**: a sentence or two. (notebook NN, "heading")

grouped under one `## NN · ...` heading per notebook, in course order.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
GLOSSARY = NOTEBOOK_DIR / "GLOSSARY.md"
README = ROOT / "README.md"

_ENTRY = re.compile(
    r'^<a id="(?P<anchor>[a-z][a-z0-9-]*)"></a>\*\*(?P<name>.+?)\*\*:? (?P<text>.+) '
    r'\(notebook (?P<notebook>\d\d), "(?P<section>[^"]+)"\)$', re.S)
_GROUP = re.compile(r"^## (\d\d) · ", re.M)
_LINK = re.compile(r"\]\((?:notebooks/)?GLOSSARY\.md#([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


@dataclass(frozen=True)
class Entry:
    anchor: str
    names: tuple[str, ...]
    notebook: str
    section: str
    group: str | None  # the notebook of the `## NN · ...` heading the entry sits under


def _plain(text: str) -> str:
    """Lower case, without markdown emphasis or code marks, whitespace collapsed."""
    return " ".join(re.sub(r"[`*_]", "", text).lower().split())


def _notebook_path(number: str) -> Path | None:
    found = sorted(NOTEBOOK_DIR.glob(f"{number}_*.ipynb"))
    return found[0] if found else None


def _markdown_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def _headings(path: Path) -> set[str]:
    text = _FENCE.sub("", "\n".join(_markdown_cells(path)))
    return {_plain(m) for m in re.findall(r"^#{1,6} +(.+?) *$", text, re.M)}


def _mentions(markdown: str, name: str) -> bool:
    """Whether `name` occurs in the plain markdown, as written or as a simple plural."""
    name = _plain(name)
    forms = {name, name + "s", name + "es"}
    if name.endswith("y"):
        forms.add(name[:-1] + "ies")
    return any(form in markdown for form in forms)


def parse_entries(text: str) -> list[Entry]:
    """Every list item of the glossary, in order, as an Entry; an item that does not have the
    entry's form raises ValueError naming it."""
    entries, group = [], None
    items = re.split(r"\n(?=- |#|\n)", text)
    for item in items:
        item = item.strip()
        heading = _GROUP.match(item)
        if heading:
            group = heading.group(1)
        if not item.startswith("- "):
            continue
        match = _ENTRY.match(" ".join(item[2:].split()))
        if not match:
            raise ValueError(f"GLOSSARY.md: this item is not an entry of the glossary's form: "
                             f"{item[:80]!r}")
        names = re.sub(r"\([^)]*\)", "", match["name"])
        names = tuple(n.strip() for n in names.split(" / ") if n.strip())
        entries.append(Entry(match["anchor"], names, match["notebook"], match["section"], group))
    return entries


def _glossary_links() -> list[tuple[str, str]]:
    """(where, anchor) for every link to a GLOSSARY.md anchor in the notebooks and the README."""
    links = [("README.md", a) for a in _LINK.findall(README.read_text(encoding="utf-8"))]
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        for cell in _markdown_cells(path):
            links += [(path.name, a) for a in _LINK.findall(cell)]
    return links


@pytest.fixture(scope="module")
def entries() -> list[Entry]:
    assert GLOSSARY.is_file(), "notebooks/GLOSSARY.md is missing"
    return parse_entries(GLOSSARY.read_text(encoding="utf-8"))


def test_the_glossary_holds_the_course_terms_once_each(entries):
    assert len(entries) >= 30, f"the glossary has only {len(entries)} entries"
    anchors = [e.anchor for e in entries]
    twice = sorted({a for a in anchors if anchors.count(a) > 1})
    assert not twice, f"anchors used twice: {twice}"
    must = {"target", "perturbation", "ignore-index", "whole-word-masking", "row-seed",
            "segment-ids", "isnext", "nsp", "sop", "pooler", "cls-vector", "mlm-head", "plateau",
            "the-bar", "recipe", "twins", "probe", "spread", "fine-tuning", "tf-idf", "mfu",
            "flops", "bf16", "checkpoint", "shard", "muon", "gradient-accumulation", "loss-sum"}
    assert must <= set(anchors), f"the glossary lacks {sorted(must - set(anchors))}"


def test_every_entry_cites_a_notebook_section_that_uses_the_term(entries):
    wrong = []
    for e in entries:
        path = _notebook_path(e.notebook)
        if path is None:
            wrong.append(f"{e.anchor}: notebook {e.notebook} does not exist")
            continue
        if _plain(e.section) not in _headings(path):
            wrong.append(f"{e.anchor}: {path.name} has no heading {e.section!r}")
        markdown = _plain("\n".join(_markdown_cells(path)))
        if not any(_mentions(markdown, name) for name in e.names):
            wrong.append(f"{e.anchor}: {path.name}'s markdown never mentions "
                         f"{' / '.join(e.names)!r}")
    assert not wrong, "\n".join(wrong)


def test_entries_sit_under_their_notebook_in_course_order(entries):
    misplaced = [f"{e.anchor} (notebook {e.notebook}) sits under {e.group}" for e in entries
                 if e.group != e.notebook]
    assert not misplaced, "\n".join(misplaced)
    order = [e.notebook for e in entries]
    assert order == sorted(order), "the glossary's notebook groups are not in course order"


def test_every_link_into_the_glossary_resolves(entries):
    links = _glossary_links()
    assert len(links) >= 5, f"only {len(links)} links point into the glossary"
    anchors = {e.anchor for e in entries}
    broken = [f"{where}: #{anchor}" for where, anchor in links if anchor not in anchors]
    assert not broken, "these links name no glossary entry:\n" + "\n".join(broken)


def test_the_welcome_notebook_and_the_readme_link_the_glossary():
    welcome = "\n".join(_markdown_cells(_notebook_path("00")))
    assert "](GLOSSARY.md)" in welcome, "notebook 00 does not link GLOSSARY.md"
    assert "](notebooks/GLOSSARY.md)" in README.read_text(encoding="utf-8"), \
        "README.md does not link notebooks/GLOSSARY.md"


def test_the_parser_refuses_an_item_that_is_not_an_entry():
    good = '## 02 · Masked LM\n\n- <a id="x"></a>**term**: says what. (notebook 02, "Title")\n'
    assert parse_entries(good) == [Entry("x", ("term",), "02", "Title", "02")]
    with pytest.raises(ValueError, match="not an entry"):
        parse_entries(good + '- **term**: no anchor and no notebook\n')
