"""tools/step_functions.py: how many bertlab functions and modules one optimizer step calls.

The course run's code path (the course recipe, tiny on the CPU, one thread, in-process data) on
40 BBC documents with a 300-token vocabulary, so that it takes seconds: what a step calls does
not depend on the corpus's size or the vocabulary's.
"""

from __future__ import annotations

import pytest

from bertlab.readers import load_corpus

# What one step may call at most, so a reader can follow it. Modules are counted, not capped:
# where a function lives follows the tiers (bertlab/README.md), not a budget.
MAX_FUNCTIONS = 45

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_one_step_calls_few_functions(tmp_path, load_tool):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(load_corpus("bbc")[:40]):
        (corpus / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    tool = load_tool("step_functions")
    result = tool.step_functions(["--corpus", str(corpus), "--vocab-size", "300"])
    assert result["functions"] > 0, "no function grew with the steps: the count saw nothing"
    assert result["functions"] <= MAX_FUNCTIONS, (
        f"one optimizer step calls {result['functions']} bertlab functions (at most "
        f"{MAX_FUNCTIONS}) in {result['modules']} modules:\n"
        + tool.format_report(result))
