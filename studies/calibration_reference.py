"""How far the stopping rule's never-seen reference (the calibration authors) sits from the membership attack's
(the holdout authors), per TOFU split (issue 32): under the target and under the never-trained model, the Min-K%
(k = 0.4) mean of each author set's answers and the Min-K% AUC of each pair (``membership_auc``: the first set as
members, 0.5 = indistinguishable, near 0 = the first set reads far more familiar).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/calibration_reference.py --tofu_dir ../shared/tofu \
        [--author_offset 5] [--num_calibration_authors 2] --output reference.json

``--adapter DIR`` reads a stopped run too (``studies/masc_landing.py`` saves it in ``OUTPUT/adapter``). The target and
the never-trained model come from compare's cache (``hf-unlearn compare --benchmark tofu`` or
``studies/masc_landing.py`` learn them).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from hf_unlearn.cli.arguments import CompareArguments
from hf_unlearn.evaluation.bundle import qa_attack_scores, qa_membership_auc
from hf_unlearn.jobs.compare_setups import tofu_setting

PAIRS = (("forget", "holdout"), ("forget", "calibration"), ("calibration", "holdout"))


def min_k_mean(model: Any, tokenizer: Any, records: list[dict]) -> float:
    return statistics.mean(qa_attack_scores(model, tokenizer, records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tofu_dir", required=True)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--num_calibration_authors", type=int, default=2)
    parser.add_argument("--num_holdout_authors", type=int, default=2)
    parser.add_argument("--output", required=True)
    parser.add_argument("--adapter", default=None, help="Also read the target with this LoRA adapter (a stopped run).")
    parser.add_argument(
        "--base", action="store_true", help="Also read the pretrained model the target was fine-tuned from."
    )
    args = parser.parse_args()
    cli = CompareArguments(
        benchmark="tofu", tofu_dir=args.tofu_dir, author_offset=args.author_offset,
        num_calibration_authors=args.num_calibration_authors, num_holdout_authors=args.num_holdout_authors,
    )  # fmt: skip
    setting = tofu_setting(cli)
    records = {
        "forget": [dict(r) for r in setting.forget_records],
        "calibration": [dict(r) for r in setting.calibration_records],
        "holdout": [dict(r) for r in setting.holdout_records],
    }
    result: dict[str, Any] = {"split": setting.description["authors"]}
    models = [
        ("target", setting.target_model, setting.tokenizer),
        ("never_trained", setting.reference_model, setting.reference_tokenizer),
    ]
    if args.base:
        from hf_unlearn.benchmarks.pretrained import load_smollm2

        models.append(("base", *load_smollm2()))
    if args.adapter:  # last: the adapter is injected into the target's modules in place
        models.append(("unlearned", None, setting.tokenizer))
    for label, model, tokenizer in models:
        if model is None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(setting.target_model, args.adapter)
        model.eval()
        row = {f"min_k_mean_{name}": min_k_mean(model, tokenizer, rs) for name, rs in records.items()}
        for members, non_members in PAIRS:
            row[f"auc_{members}_vs_{non_members}"] = qa_membership_auc(
                model, tokenizer, records[members], records[non_members]
            )
        result[label] = row
        print(label, json.dumps(row), flush=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
