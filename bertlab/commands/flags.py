"""Flags that several commands share, and the generator of a flag per dataclass field.

`add_encoding_errors` and `add_row_fields` say how text and rows are read (prepare, pretrain,
finetune); `add_dataclass_flags` makes one flag per field of a settings dataclass, its argparse
settings taken from the field's annotation (`_FLAG_KINDS`), so `pretrain` has a flag for every
`TrainConfig` field and model setting without a list kept by hand. `with_flags` adds a
command's flag to each setting an error message names: the library names settings
("TrainConfig.lr must be a positive number"), the CLI's reader gets "TrainConfig.lr (--lr) ...".
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any

from bertlab.errors import flag_of
from bertlab.rows import BAD_ROW_CHOICES

VOCAB_HELP = "when training a tokenizer (default: 8192)"
THREADS_WHY = ("A small model does not split well: on 2 cores beside one busy program, the "
               "demo's first 300 steps took 11x as long with 2 threads as with 1 "
               "(benchmarks/threads.py)")

_ENCODINGS = ("strict", "replace", "ignore")


def add_encoding_errors(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoding-errors", default="strict", choices=_ENCODINGS,
                   help="bytes of the text read that are not UTF-8: strict refuses the file, "
                        "replace reads them as U+FFFD, ignore drops them (default: strict)")


def add_row_fields(p: argparse.ArgumentParser, labels: bool = False) -> None:
    """Add the flags that say how a file of rows (.jsonl, .csv, .tsv, .parquet) is read."""
    p.add_argument("--text-field", default=None, metavar="NAME",
                   help="the field of each row that holds its text (default: text)")
    if labels:
        p.add_argument("--label-field", default=None, metavar="NAME",
                       help="the field of each row that holds its label (default: label)")
    p.add_argument("--doc-field", default=None, metavar="NAME",
                   help="consecutive rows with the same value of this field form one document, "
                        "in order (default: each row is a document)")
    p.add_argument("--on-bad-row", default=None, choices=BAD_ROW_CHOICES,
                   help="a row that is not JSON or whose field is missing, not text or empty: "
                        "error stops there, naming it; skip skips it and counts it "
                        "(default: error)")


# ---------------------------------------------------------------------------------------------
# The flags generated from the dataclasses: one per model setting and per TrainConfig field


def _optional(kind: type):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


# The argparse settings of a generated flag, by its field's annotation (as typing.get_type_hints
# resolves it: `int | None` and `Optional[int]` are one key). "none" reads as None for the
# optional numbers; a bool gets --x / --no-x. A field whose type is missing here stops
# build_parser with a TypeError naming it: add its type here.
_FLAG_KINDS: dict[Any, dict[str, Any]] = {
    bool: {"action": argparse.BooleanOptionalAction},
    bool | None: {"action": argparse.BooleanOptionalAction},  # absent: the default, None
    int: {"type": int, "metavar": "INT"},
    int | None: {"type": _optional(int), "metavar": "INT"},
    float: {"type": float, "metavar": "FLOAT"},
    float | None: {"type": _optional(float), "metavar": "FLOAT"},
    str: {"type": str, "metavar": "STR"},
    str | None: {"type": _optional(str), "metavar": "STR"},
    tuple[float, float]: {"nargs": 2, "type": float, "metavar": ("B1", "B2")},
}


def _flag_kind(cls: type, f: dataclasses.Field, hints: dict[str, Any]) -> dict[str, Any]:
    """Return the argparse settings of field `f`'s flag; raise TypeError for an unmapped type."""
    kind = _FLAG_KINDS.get(hints[f.name])
    if kind is None:
        shown = f.type if isinstance(f.type, str) else repr(f.type)
        raise TypeError(f"{cls.__name__}.{f.name} has type {shown}, which has no command-line "
                        f"flag kind; add it to _FLAG_KINDS in bertlab/commands/flags.py (annotation -> "
                        f"argparse settings), or leave the field out of the flags")
    return kind


def add_dataclass_flags(group: argparse._ArgumentGroup, cls: type, names: Sequence[str] | None,
                         defaults: dict[str, Any], aliases: dict[str, str] | None = None) -> None:
    # One flag per field (or per field in `names`); absent flags stay absent (SUPPRESS), so only
    # what the user typed overrides the dataclass defaults. Every type is looked up first: a
    # field without a flag kind raises TypeError before any flag is added.
    hints = typing.get_type_hints(cls)
    chosen = [f for f in dataclasses.fields(cls) if names is None or f.name in names]
    kinds = [_flag_kind(cls, f, hints) for f in chosen]
    for f, kind in zip(chosen, kinds, strict=True):
        flags = [flag_of(f.name)]
        if aliases and f.name in aliases:
            flags.append(aliases[f.name])
        help_text = f.metadata.get("help", f.name.replace("_", " "))
        group.add_argument(*flags, default=argparse.SUPPRESS, dest=f.name,
                           help=f"{help_text} (default: {defaults.get(f.name)})", **kind)


# A setting as a message names it: "TrainConfig.lr", "grad_accum=2", "max_steps", or, for a name
# without an underscore, only with its owner or a value ("lr=0.1"). Its value runs to a space,
# comma, semicolon or colon; a flag already given after it is kept as it is.
_OWNERS = r"(?:TrainConfig|BertConfig|MaskingConfig|LoaderOptions|FinetuneConfig|StreamOptions)"
_SETTING = re.compile(
    rf"(?<![\w.=/-])(?P<owner>{_OWNERS}\.)?(?P<name>[a-z][a-z0-9]*(?:_[a-z0-9]+)*)"
    rf"(?P<value>=(?:'[^']*'|\([^)]*\)|[^\s,;:)]+))?(?! \(--)")


def with_flags(parser: argparse.ArgumentParser) -> Callable[[str], str]:
    """Return what turns a library message into the command's: each setting it names that
    `parser` has a flag for gets the flag after it, "TrainConfig.lr (--lr)"."""
    flags = {a.dest: a.option_strings[0] for a in parser._actions
             if a.option_strings and a.dest != "help"}

    def words(message: str) -> str:
        done: set[str] = set()

        def add(match: re.Match) -> str:
            name = match["name"]
            named = match["owner"] or match["value"] or "_" in name
            # Once per setting, and not where the message names the flag itself already.
            if not named or name not in flags or name in done or flags[name] in message:
                return match.group(0)
            done.add(name)
            return f"{match.group(0)} ({flags[name]})"
        return _SETTING.sub(add, message)
    return words
