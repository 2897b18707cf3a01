"""Split a MASC landing run's token table by whether each answer word is repeated from its own question.

Reads the ``tokens.json`` that ``studies/masc_landing.py`` writes (every answer token of the forget and the
never-seen authors under the stopped model), with the authors from the ``result.json`` beside it, and prints, per
token kind, the mean restricted margin of the tokens whose text the example's question holds (the author's name,
mostly) and of the others. A token counts as repeated when its text, stripped, is not empty and occurs in the
question: the same reading as ``calibration_match="prompt"``'s :func:`hf_unlearn.objectives.margin.prompt_copies`,
on text rather than token ids. Used on docs/studies/masc_landing.md.

    python studies/masc_repeated_words.py --tokens study33/tofu/prompt-s0/tokens.json --tofu_dir ../shared/tofu
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict


def authors_rows(tofu_dir: str, authors: tuple[int, ...]) -> list[dict]:
    """The QA rows of ``authors`` in file order (the order ``tofu_setting`` builds its sets in)."""
    with open(os.path.join(tofu_dir, "authors.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [row for row in rows if row["author"] in authors]


def split_by_repetition(table: list[dict], records: list[dict]) -> dict[tuple[str, str], list[float]]:
    """Margins grouped by (kind, 'repeated' or 'not')."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in table:
        question = records[row["example"]]["question"]
        repeated = bool(row["token"].strip()) and row["token"] in question
        groups[(row["kind"], "repeated" if repeated else "not")].append(row["margin"])
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", required=True, help="tokens.json of a masc_landing run")
    parser.add_argument("--tofu_dir", required=True)
    args = parser.parse_args()
    with open(args.tokens) as f:
        tables = json.load(f)
    with open(os.path.join(os.path.dirname(args.tokens), "result.json")) as f:
        authors = json.load(f)["description"]["authors"]
    sets = {
        "forget (this model)": authors_rows(args.tofu_dir, tuple(authors["forget"])),
        "never-seen (this model)": authors_rows(args.tofu_dir, tuple(authors["holdout"])),
    }
    for name, records in sets.items():
        print(name)
        for (kind, repeated), margins in sorted(split_by_repetition(tables[name], records).items()):
            mean = sum(margins) / len(margins)
            print(f"  {kind:12s} {repeated:9s} {len(margins):5d} tokens, mean margin {mean:+.2f}")


if __name__ == "__main__":
    main()
