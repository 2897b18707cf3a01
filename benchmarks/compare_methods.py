"""Every unlearning method on the embedded benchmark, side by side: `hf-unlearn compare` with its full grid.

    python benchmarks/compare_methods.py [--output_dir DIR] [any `hf-unlearn compare` option]

Prints the table (reached target, time to target, grid cost, steps, metrics at the selected checkpoint, time
relative to MASC) and writes compare.json, compare.md and compare.png. About 3 minutes on 2 CPU cores; with
`--base_model smollm2 --lora_r 16 --num_authors 10` the same comparison on a real pretrained model (slow).
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
