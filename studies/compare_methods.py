"""Every unlearning method on the embedded benchmark, side by side: `hf-unlearn compare` with its full grid.

    python studies/compare_methods.py [--output_dir DIR] [any `hf-unlearn compare` option]

Every method at every learning rate of the grid (MASC once per seed at its default rate, stopping itself) and with
3 seeds (`--seeds 0 1 2` unless the command line gives `--seeds`; `hf-unlearn compare` alone runs one); the
region is defined against a model that never trained on the forget set (forget ROUGE-L at most 0.1 above its own,
Min-K% membership AUC within 0.1 of its own, retain ROUGE-L >= 0.95x the target's). Prints one table (runs landing
in the region, time to the region at the best learning rate, grid cost, MASC's single run against each grid) and
writes compare.json, compare.md and compare.png. About 32 minutes on 2 CPU cores (14 methods); with
`--base_model smollm2 --lora_r 16 --num_authors 10` the same comparison on a real pretrained model (hours:
narrow it with --learning_rates, --seeds and --methods).
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn.cli import main  # noqa: E402

if __name__ == "__main__":
    options = sys.argv[1:]
    seeds = [] if "--seeds" in options else ["--seeds", "0", "1", "2"]  # the studies' landing counts: 3 seeds
    sys.exit(main(["compare", *seeds, *options]))
