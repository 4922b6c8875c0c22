"""ipywidgets explorers and HTML strips used by the notebooks. Nothing here runs on import.

Each section belongs to one lesson; functions return a widget or HTML to display. The HTML is
rendered by the browser, so any script shows (Chinese characters included).
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import torch

from bertlab.course.viz import MASKING_COLORS
from bertlab.masking import Decision, MaskingConfig, mask_tokens
from bertlab.pairs import IS_NEXT, NOT_NEXT

# --- masked LM (notebooks/02_masked_lm.ipynb) ----------------------------------------------------

def mask_strip_html(tokens, masked_tokens, decisions) -> str:
    """Return HTML for one masked sequence: what the model reads, coloured by decision, label below.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    cells = []
    for token, shown, decision in zip(tokens, masked_tokens, decisions, strict=True):
        decision = int(decision)
        color = "white" if decision in (1, 3) else "black"
        label = html.escape(str(token)) if decision else '<span style="color:#9ca3af">-100</span>'
        cells.append(
            f'<span style="display:inline-block;text-align:center;margin:1px;padding:1px 4px;'
            f'background:{MASKING_COLORS[decision]};color:{color};font-family:monospace">'
            f'{html.escape(str(shown))}<br><span style="color:#111;background:white;font-size:80%">'
            f"{label}</span></span>"
        )
    legend = " ".join(
        f'<span style="background:{c};color:{"white" if i in (1, 3) else "black"};padding:0 4px">'
        f"{name}</span>"
        for i, (c, name) in enumerate(zip(MASKING_COLORS, ("not a target", "→ [MASK]",
                                                             "→ random", "kept"), strict=True))
    )
    return f'<div style="line-height:1.2">{"".join(cells)}</div><div>{legend}</div>'


def masking_explorer(tokenizer, sentences, *, seed: int = 0):
    """Return a widget: a corpus sentence masked live, with sliders for the rate and the split.

    Sliders set `mlm_probability` and the [MASK] / random shares (the kept share is what is left);
    "resample" draws a new mask with the same settings. Each draw is shown as the model's input,
    coloured by decision, with its labels underneath, plus the counts of each case.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    if not sentences:
        raise ValueError("masking_explorer: sentences is empty; pass at least one sentence")
    style = {"description_width": "150px"}
    layout = widgets.Layout(width="480px")
    rate = widgets.FloatSlider(value=0.15, min=0.0, max=1.0, step=0.05,
                               description="mlm_probability", style=style, layout=layout)
    to_mask = widgets.FloatSlider(value=0.8, min=0.0, max=1.0, step=0.05,
                                  description="→ [MASK]", style=style, layout=layout)
    to_random = widgets.FloatSlider(value=0.1, min=0.0, max=0.2, step=0.05,
                                    description="→ random", style=style, layout=layout)
    which = widgets.IntSlider(value=0, min=0, max=len(sentences) - 1, description="sentence",
                              style=style, layout=layout)
    resample = widgets.Button(description="resample", icon="refresh")
    view = widgets.HTML()
    draws = {"n": seed}

    def refresh(*_):
        to_random.max = round(1.0 - to_mask.value, 6)  # the three shares add up to 1
        encoding = tokenizer.encode(sentences[which.value])
        ids = torch.tensor(encoding.ids)
        generator = torch.Generator().manual_seed(draws["n"])
        masking = MaskingConfig(mlm_probability=rate.value, mask_replace_prob=to_mask.value,
                                random_replace_prob=to_random.value)
        masked, _, decisions = mask_tokens(ids, tokenizer, masking, generator=generator,
                                           return_decisions=True)
        shown = [tokenizer.id_to_token(i) for i in masked.tolist()]
        counts = torch.bincount(decisions.long(), minlength=4).tolist()
        kept = round(1.0 - to_mask.value - to_random.value, 2)
        summary = (f"draw {draws['n']}: {sum(counts[1:])} targets out of "
                   f"{sum(counts)} tokens ({counts[Decision.MASK]} [MASK], "
                   f"{counts[Decision.RANDOM]} random, {counts[Decision.KEEP]} kept; "
                   f"kept share setting {kept})")
        view.value = f"<div>{summary}</div>" + mask_strip_html(encoding.tokens, shown,
                                                               decisions.tolist())

    def next_draw(_):
        draws["n"] += 1
        refresh()

    for slider in (rate, to_mask, to_random, which):
        slider.observe(refresh, names="value")
    resample.on_click(next_draw)
    refresh()
    return widgets.VBox([rate, to_mask, to_random, widgets.HBox([which, resample]), view])


# --- NSP data (notebooks/03_nsp_data.ipynb) ------------------------------------------------------

_SEGMENT_COLORS = ("#dbeafe", "#fde2c8")  # segment 0 (A) blue, segment 1 (B) orange


def nsp_pair_html(example, tokenizer, max_tokens: int | None = None) -> str:
    """Return HTML for one NSP example: tokens coloured by segment, token_type_ids underneath.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    ids = list(example.input_ids)
    types = example.token_type_ids
    if max_tokens is not None and len(ids) > max_tokens:
        ids, types = ids[:max_tokens], types[:max_tokens]
    cells = []
    for token_id, segment in zip(ids, types, strict=True):
        token = html.escape(tokenizer.id_to_token(token_id) or "?")
        weight = "bold" if token.startswith("[") else "normal"
        cells.append(
            f'<span style="display:inline-block;text-align:center;margin:1px;padding:1px 3px;'
            f'background:{_SEGMENT_COLORS[segment]};font-family:monospace;font-weight:{weight}">'
            f'{token}<br><span style="color:#666;font-size:80%">{segment}</span></span>'
        )
    label = example.next_sentence_label
    name = "IsNext" if label == IS_NEXT else "NotNext"
    source = (f"B from {html.escape(example.doc_id)}" if label == IS_NEXT
              else f"B from another document (#{example.b_doc_index})")
    more = "" if max_tokens is None or len(example.input_ids) <= max_tokens else " …"
    return (f'<div style="margin:4px 0"><b>{name}</b> (next_sentence_label={label}); '
            f"A from {html.escape(example.doc_id)}, {source}; len(A)={example.a_len}, "
            f"len(B)={example.b_len}, cut={example.tokens_dropped}</div>"
            f'<div style="line-height:1.1">{"".join(cells)}{more}</div>')


def nsp_explorer(examples, tokenizer):
    """Return a widget that pages through NSP examples (filter by label, colour by segment).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    chooser = widgets.ToggleButtons(options=["all", "IsNext", "NotNext", "truncated"],
                                    description="show")
    # Thousands of examples: the default ~100 px track skips a hundred per pixel when dragged.
    index = widgets.IntSlider(min=0, max=max(0, len(examples) - 1), description="example",
                              layout=widgets.Layout(width="100%", max_width="800px"))
    view = widgets.HTML()

    def selected():
        kind = chooser.value
        if kind == "IsNext":
            return [e for e in examples if e.next_sentence_label == IS_NEXT]
        if kind == "NotNext":
            return [e for e in examples if e.next_sentence_label == NOT_NEXT]
        if kind == "truncated":
            return [e for e in examples if e.truncated]
        return list(examples)

    def refresh(*_):
        chosen = selected()
        index.max = max(0, len(chosen) - 1)
        if not chosen:
            view.value = "<i>no example of this kind</i>"
            return
        view.value = (f"<div>{index.value + 1} of {len(chosen)}</div>"
                      + nsp_pair_html(chosen[min(index.value, len(chosen) - 1)], tokenizer))

    chooser.observe(refresh, names="value")
    index.observe(refresh, names="value")
    refresh()
    return widgets.VBox([chooser, index, view])


# --- Chinese BERT (notebooks/08_chinese_bert.ipynb) ----------------------------------------------

_WORD_COLORS = ("#dbeafe", "#fde68a")  # consecutive words alternate blue / yellow


def word_strip_html(tokens, word_ids) -> str:
    """Return HTML for a tokenized sentence grouped into words: one box per word, its id below.

    `word_ids` holds one word index per token (None or -1 for [CLS], [SEP] and padding, shown
    grey), e.g. from `bertlab.tokenizer.chinese_word_ids`. Chinese characters show without a
    CJK font for matplotlib.

    Taught in notebooks/08_chinese_bert.ipynb.
    """
    if len(tokens) != len(word_ids):
        raise ValueError(f"word_strip_html: {len(tokens)} tokens but {len(word_ids)} word ids; "
                         f"pass one word id (or None) per token")
    groups: list[tuple[int | None, list[str]]] = []
    for token, word in zip(tokens, word_ids, strict=True):
        word = None if word is None or int(word) < 0 else int(word)
        if groups and word is not None and groups[-1][0] == word:
            groups[-1][1].append(token)
        else:
            groups.append((word, [token]))
    cells = []
    for word, members in groups:
        color = "#e5e7eb" if word is None else _WORD_COLORS[word % 2]
        text = "&#8201;".join(html.escape(str(t)) for t in members)
        below = "" if word is None else str(word)
        cells.append(
            f'<span style="display:inline-block;text-align:center;margin:1px;padding:1px 5px;'
            f'background:{color};font-family:monospace">{text}<br>'
            f'<span style="color:#6b7280;font-size:75%">{below}</span></span>'
        )
    return f'<div style="line-height:1.2">{"".join(cells)}</div>'
