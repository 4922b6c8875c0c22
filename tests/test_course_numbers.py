"""Every figure a notebook's prose states must be backed by that notebook's own code or outputs.

A notebook's text is written once, while its outputs are regenerated whenever the package or a
recipe changes; a sentence like "accuracy climbs to 57%" then quietly goes stale. This test reads
each notebook's markdown, takes the figures that can go stale (decimals, percentages, integers of
100 or more, multipliers) and checks that some value in the same notebook's code cells or stored
outputs, rounded to the precision the text uses, gives that figure. Figures that come from
outside the notebook (a paper's table, a published constant) are listed in ALLOWED with a reason.

What is not read as a figure: code spans and fenced code, link targets, HTML tags, headings'
section numbers, arXiv ids, years (1950-2039 written without a thousands comma: citations and
dates), numbers glued to a name (H100, fp16, SHA-256, v5, #627, C.2) or to letters after them
(2nd), dotted versions (2.9.1) and a decimal right after a tool's name (torch 2.9, SQuAD 1.1).
Whole numbers below 100 without a % sign are not checked: section numbers, "2 layers" and
"10x" are too common to say anything.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

_TABLE_8 = "BERT paper, Table 8 (App. C.2): MNLI / NER fine-tuned / NER feature-based by masking"

# notebook file name -> {figure as written in the markdown: where it comes from instead}
ALLOWED: dict[str, dict[str, str]] = {
    "00_welcome.ipynb": {
        "128": "the tiny preset is Google's BERT-Tiny (Turc et al. 2019): 2 layers, hidden size 128",
        "15%": "BERT paper's masking rate (Devlin et al. 2018, section 3.1)",
        "80%": "BERT paper's share of targets shown as [MASK] (the 80/10/10 rule)",
    },
    "01_corpus_and_tokenizer.ipynb": {
        "30,522": "size of Google's BERT-base uncased vocabulary (vocab.txt)",
        "128": "BERT's first pretraining phase: sequences of 128 tokens (Devlin et al. 2018, App. A.2)",
    },
    "02_masked_lm.ipynb": {
        "84.2": _TABLE_8,
        "95.4": _TABLE_8,
        "94.9": _TABLE_8,
        "84.3": _TABLE_8,
        "94.0": _TABLE_8,
        "8,187": "an exercise's given: the course vocabulary's 8,192 pieces less its 5 special tokens",
    },
    "05_pretraining.ipynb": {
        "110M": "BERT-base's parameter count (Devlin et al. 2018)",
        "127": "the last position of BERT's 128-token sequences (positions 0-127)",
    },
    "06_cls_and_downstream.ipynb": {
        "98%": "the BERT paper's NSP accuracy of its final model (97%-98%, section 3.1)",
        "3.3": "BERT's pretraining corpus: 3.3 billion words (BooksCorpus + Wikipedia)",
    },
    "09_your_own_corpus.ipynb": {
        "2,225": "size of the BBC News data set (Greene & Cunningham 2006)",
        "2e-5": "BERT paper's fine-tuning learning rates (App. A.3: 5e-5 down to 2e-5)",
        "5e-5": "BERT paper's fine-tuning learning rates (App. A.3: 5e-5 down to 2e-5)",
    },
}

# (what, what it becomes): code keeps a mark so that the context in a message still reads
_STRIP = [
    (re.compile(r"```.*?```", re.S), "```…```"),  # fenced code
    (re.compile(r"`[^`\n]*`"), "`…`"),  # code spans
    (re.compile(r"\]\([^)]*\)"), "]"),  # link targets; the link text stays
    (re.compile(r"<[^>\n]+>"), " "),  # HTML tags
    (re.compile(r"^(#+\s*)\d+(?:\.\d+)*\.?", re.M), r"\1"),  # "## 5." and "### 2.1"
    (re.compile(r"\b\d{4}\.\d{4,5}(?:v\d+)?\b"), "arXiv"),  # arXiv ids
]

# digits (with thousands commas), decimals, an exponent, then % or a k/M/B unit or a multiplier
_FIGURE = re.compile(
    r"(?<![A-Za-z0-9_#.,])(?<![A-Za-z]-)"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?(?:[eE](?P<exp>[-+\u2212]?\d+))?"
    r"(?:\s?(?P<pct>%)|(?P<unit>[kKMB])(?![A-Za-z])|[x\u00d7](?![A-Za-z]))?"
    r"(?![A-Za-z0-9_]|\.\d)",
    re.ASCII,
)
# in code and outputs: any number, with an optional k/M/B unit
_VALUE = re.compile(
    r"(\d+(?:,\d{3})*)(\.\d+)?(?:[eE]([-+\u2212]?\d+))?([kKMB](?![A-Za-z]))?", re.ASCII
)
_PLAIN = re.compile(r"\d+(?:\.\d+)?", re.ASCII)  # "[100,200]" also holds 100 and 200
_UNIT = {"k": 3, "K": 3, "M": 6, "B": 9}
_YEAR = re.compile(r"(?:19[5-9]|20[0-3])\d")
_TOOL_BEFORE = re.compile(
    r"(?i)\b(?:python|torch|pytorch|cuda|transformers|tokenizers|numpy|jupyterlab|jupyter"
    r"|ipywidgets|matplotlib|safetensors|snownlp|nbval|pytest|ruff|ubuntu|macos|squad"
    r"|version|release)\s*$"
)


@dataclass
class Figure:
    """A figure as written, and the ways it may be read: (value, decimal places), where the
    places are negative for a round integer (5,700 claims the hundreds: -2) and a percentage is
    read on the percent scale (19% is 19 at 0 places)."""

    text: str
    start: int
    readings: list[tuple[float, int]]

    def backed_by(self, values: set[float]) -> bool:
        return any(_rounds_to(v, m, d) for v in values for m, d in self.readings)


def _rounds_to(value: float, figure: float, places: int) -> bool:
    """Does `value` rounded to `places` give `figure` (rounding halves either way)?"""
    return abs(value - figure) <= 0.5 * 10.0**-places * (1 + 1e-9)


def _exponent(exp: str | None) -> int:
    return int((exp or "0").replace("\u2212", "-"))


def _number(digits: str, frac: str | None, exp: str | None) -> float:
    return float(f"{digits.replace(',', '')}{frac or ''}e{_exponent(exp)}")


def clean_markdown(text: str) -> str:
    for pattern, replacement in _STRIP:
        text = pattern.sub(replacement, text)
    return text


def markdown_figures(text: str) -> list[Figure]:
    """The figures in a markdown cell that the notebook must back (see the module docstring)."""
    text = clean_markdown(text)
    figures = []
    for match in _FIGURE.finditer(text):
        digits, frac, exp, unit = match.group("int", "frac", "exp", "unit")
        raw = _number(digits, frac, exp)
        shift = _UNIT.get(unit or "", 0)
        integer = not frac and not exp and not match.group("pct")
        if integer and raw * 10**shift < 100:
            continue
        if integer and not unit and _YEAR.fullmatch(digits):
            continue
        if frac and _TOOL_BEFORE.search(text[: match.start()]):
            continue
        if integer and raw >= 100:  # 5,700 claims the hundreds only
            plain = digits.replace(",", "")
            places = len(plain.rstrip("0")) - len(plain)
        else:  # 4.8 claims tenths, 1e-4 ten-thousandths
            places = len((frac or ".")[1:]) - _exponent(exp)
        readings = [(raw, places)]
        if shift:
            readings.append((raw * 10**shift, places - shift))
        figures.append(Figure(match.group(0).strip(), match.start(), readings))
    return figures


def values_in(text: str) -> set[float]:
    """Every number in code or output text, in each scale prose may quote it in: as printed,
    times 100 and over 100 (0.19 backs 19%, 19% backs 0.19), and both sides of a k/M/B unit."""
    printed = set()
    for digits, frac, exp, unit in _VALUE.findall(text):
        value = _number(digits, frac, exp)
        printed |= {value, value * 10 ** _UNIT.get(unit, 0)}
    printed |= {float(plain) for plain in _PLAIN.findall(text)}
    return {scaled for v in printed for scaled in (v, v * 100, v / 100)}


def _text(part) -> str:
    return "".join(part) if isinstance(part, list) else part


def _output_text(output: dict) -> str:
    data = output.get("data", {})
    shown_html = re.sub(r"<[^>]+>", " ", _text(data.get("text/html", "")))  # token pictures
    return "\n".join(
        [_text(output.get("text", "")), _text(data.get("text/plain", "")), html.unescape(shown_html)]
    )


def unbacked(cells: list[dict], allowed: dict[str, str] | None = None) -> list[str]:
    """One line per markdown figure that nothing in the notebook backs: the cell's index among
    all cells, the figure and about 60 characters around it."""
    allowed = allowed or {}
    values: set[float] = set()
    for cell in cells:
        if cell["cell_type"] == "code":
            values |= values_in(_text(cell.get("source", "")))
            for output in cell.get("outputs", []):
                values |= values_in(_output_text(output))
    problems = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        source = _text(cell.get("source", ""))
        text = clean_markdown(source)
        for figure in markdown_figures(source):
            if figure.text in allowed or figure.backed_by(values):
                continue
            around = text[max(0, figure.start - 30) : figure.start + len(figure.text) + 30]
            problems.append(f"cell {index}: {figure.text!r} in '...{' '.join(around.split())}...'")
    return problems


def _notebook(markdown: str, printed: str) -> list[dict]:
    return [
        {"cell_type": "markdown", "source": markdown},
        {"cell_type": "code", "source": "", "outputs": [{"output_type": "stream", "text": printed}]},
    ]


@pytest.mark.parametrize(
    ("markdown", "printed", "backed"),
    [
        ("about 56% of pairs", "0.568", False),
        ("57% of pairs", "0.568", True),
        ("2,558,976 parameters", "2558976", True),
        ("a loss of 0.19", "0.190", True),
        ("about 5,700 tokens", "5,723", True),
        ("about 5,700 tokens", "5,780", False),
        ("within 0.01 of the reference", "tol = 0.05", False),
        ("about 19%", "accuracy 0.19", True),
        ("0.19 of them", "19.0%", True),
        ("376k tokens", "376,012 tokens", True),
        ("110M parameters", "110.1M", True),
        ("a rate of 1e-4", "lr=0.0001", True),
        ("a rate of 3e-4", "lr=0.0001", False),
        ("8,192 pieces", "sizes = [1000,8192]", True),
        ("1.5\u00d7 faster", "1.46", True),
        ("0.152 to 0.164", "0.152", False),
    ],
)
def test_matcher(markdown, printed, backed):
    assert (not unbacked(_notebook(markdown, printed))) is backed


def test_noise_is_not_read_as_figures():
    markdown = (
        "## 5. Devlin et al. (2019), (Greene & Cunningham, 2006), articles from 2004\u201305, "
        "arXiv 1810.04805, torch 2.9.1, since torch 2.9, SQuAD 1.1, H100 in fp16, SHA-256, "
        "bert#627, App. C.2, `x = 0.123`, [see here](http://a.b/0.5), <b style='a:0.5'>, "
        "2 layers, 10x, 3rd"
    )
    assert markdown_figures(markdown) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_markdown_figures_are_backed(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    problems = unbacked(cells, ALLOWED.get(path.name, {}))
    if problems:
        pytest.fail(
            f"{path.name}: figures in the text that no code or output of the notebook gives "
            "(fix the text, or add an outside fact to ALLOWED with its source):\n  "
            + "\n  ".join(problems),
            pytrace=False,
        )
