"""Write the model card (README.md) of each shipped model in models/ from its MANIFEST.json.

A card says what the MANIFEST records (recipe, steps, corpus and its digest, the validation
scores beside the bar, how to load the folder), so a MANIFEST that changes gets its card again
here; tests/test_card.py checks that every card in models/ matches its MANIFEST.

Usage: python tools/model_cards.py [models/course-tiny ...]     (default: every models/*)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertlab.export import write_manifest_card

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", type=Path,
                   help="model folders holding a MANIFEST.json (default: every one in models/)")
    args = p.parse_args(argv)
    folders = args.folders or sorted(m.parent for m in (ROOT / "models").glob("*/MANIFEST.json"))
    for folder in folders:
        if not (folder / "MANIFEST.json").is_file():
            print(f"error: {folder} has no MANIFEST.json; pass a folder from models/ (nothing "
                  f"was written)", file=sys.stderr)
            return 2
    for folder in folders:
        shown = folder.resolve()
        shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else folder
        print(f"wrote {write_manifest_card(folder, shown.as_posix())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
