"""What a measurement of a pretrained model costs, part by part, against the plain-transformers floor of the same work.

    OMP_NUM_THREADS=1 python perf/eval_cost.py --tofu-dir ../shared/tofu [--quick] [--skip-nf4]
        [--only eval|compare|options] [--model FOLDER [--adapter FOLDER]]

Two measurements of SmolLM2-135M-Instruct as shipped (:func:`hf_unlearn.benchmarks.pretrained.load_smollm2`; nothing
is learned here, and the chat model writes to its token budget on every question, the worst case for generation) or of
the model in ``--model`` (a cached TOFU target answers and stops, as a study's models do) on TOFU's real rows, split as
``hf-unlearn compare --benchmark tofu --num_retain_authors 1 --real_knowledge_size 25`` splits them (40 forget, 20
retain, 40 holdout questions, 25 questions of each real-knowledge set):

* ``eval``: what ``hf-unlearn eval`` measures with forget, retain and holdout files
  (:func:`~hf_unlearn.evaluation.suites.evaluate_benchmark` on :func:`~hf_unlearn.evaluation.suites.
  qa_evaluation_sets`);
* ``compare``: compare's TOFU measurement of one model (:meth:`hf_unlearn.jobs.compare.CompareSetting.measure`, with
  fluency), and the NF4 check of a final model (:func:`hf_unlearn.jobs.compare.nf4_forget_check`).

Each is timed whole, then part by part (each part calls the library the way the measurement does; when the library
changes how it measures, the parts change with it: the study page says which commit each table ran). Per part: seconds,
tokens put through the model (padding included, every forward call counted, each decoding step of a batch too), and
the ratio to a floor measured in the same run on the same tokens: one batched forward (batches of 32 sorted by
length, no LM-head trimming) over the part's sequences, plus one batched forward+backward for the gradient-norm
attack; for generation, transformers' batched greedy ``generate`` (batches of 32 in the data's order) of the same
prompts with the same token budget. ``--quick``: 5 questions per author and 5 per real-knowledge set. Where the
library has the forward membership attacks read the scoring pass (``membership.attack_reads``), the scoring part
keeps their per-token values and the membership part reads the forget answers from it; its floor stays the forward
over the forget and holdout answers that it ran before.

* ``options``: the answers scored as options after one question, on their own: the real-knowledge options (the answer
  and its three perturbed answers, as compare scores them) and the truth ratio's paraphrased and perturbed answers.
  TOFU's rows beside the project have none for the fictitious authors, so the truth ratio is measured on the embedded
  benchmark's forget set (:func:`hf_unlearn.benchmarks.load_split`: ``forget10``, 20 questions, ``forget05`` with
  ``--quick``), tokenized by SmolLM2's chat template like the rest. The floor is one batched forward over every
  (prompt + option) sequence, which is what these parts ran before the prompt was encoded once for its options.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hf_unlearn.benchmarks import load_split  # noqa: E402
from hf_unlearn.benchmarks.pretrained import load_smollm2  # noqa: E402
from hf_unlearn.benchmarks.tofu_target import TofuAuthorSplit, tofu_sets  # noqa: E402
from hf_unlearn.data.examples import tokenize_prompt, tokenize_qa  # noqa: E402
from hf_unlearn.data.loaders import load_tofu_folder  # noqa: E402
from hf_unlearn.data.prompts import prompt_and_completion  # noqa: E402
from hf_unlearn.evaluation.bundle import REAL_KNOWLEDGE_MAX_NEW_TOKENS, qa_membership_auc  # noqa: E402

# The parts of each measurement, each called the way the measurement calls the library.
from hf_unlearn.evaluation.fluency import reference_nll  # noqa: E402
from hf_unlearn.evaluation.membership import ATTACKS, FORWARD_ATTACKS, gradient_norms, membership_scores  # noqa: E402
from hf_unlearn.evaluation.memorization import evaluate_memorization  # noqa: E402
from hf_unlearn.evaluation.metrics import (  # noqa: E402
    answer_probability,
    default_max_new_tokens,
    generate_answers,
    pad_token_id_of,
    reproduction_bound,
)
from hf_unlearn.evaluation.options import option_scores, truth_ratios  # noqa: E402

# The same script measures the library before the one scoring pass (the parts then call what it called).
try:
    from hf_unlearn.evaluation.metrics import GENERATION_BATCH_SIZE
    from hf_unlearn.evaluation.scoring import score_qa_records
except ImportError:
    GENERATION_BATCH_SIZE, score_qa_records = 32, None  # the batch size of generation then
# ... and before the forward attacks read that pass (each ran its own forward over the forget answers then).
try:
    from hf_unlearn.evaluation.membership import attack_reads
except ImportError:
    attack_reads = None
from hf_unlearn.evaluation.suites import evaluate_benchmark, qa_evaluation_sets  # noqa: E402
from hf_unlearn.jobs.compare import CompareSetting, nf4_forget_check  # noqa: E402
from hf_unlearn.objectives.masc.margin import threshold_from_probability


def questions_answers(records: Sequence[dict]) -> tuple[list[str], list[str]]:
    return [r["question"] for r in records], [r["answer"] for r in records]


def run_eval(model: Any, tokenizer: Any, forget: Any, retain: Any, holdout: Any) -> dict:
    sets = qa_evaluation_sets(tokenizer, forget, retain, holdout)
    return evaluate_benchmark(model, tokenizer, "your data", sets=sets)


def eval_generation(model: Any, tokenizer: Any, *sets: Sequence[dict]) -> None:
    for records in sets:
        questions, answers = questions_answers(records)
        generate_answers(
            model, tokenizer, questions, default_max_new_tokens(tokenizer, answers), GENERATION_BATCH_SIZE
        )


def eval_scoring(model: Any, tokenizer: Any, forget: Sequence[dict], retain: Sequence[dict]) -> Any:
    """Probability, memorisation and (forget) the restricted margins from one pass per set; truth ratios. Before
    the one pass (no ``hf_unlearn.evaluation.scoring``): a pass each, as evaluate_unlearning ran them. Returns the
    forget set's scores, with the membership attacks' per-token values where the library keeps them."""
    if score_qa_records is None:
        for records in (forget, retain):
            answer_probability(model, tokenizer, *questions_answers(records))
            evaluate_memorization(model, tokenizer, records)
            truth_ratios(model, tokenizer, records)
        reproduction_bound(model, tokenizer, forget)
        return None
    tau = threshold_from_probability(0.5)
    reads = {"reads": attack_reads(ATTACKS)} if attack_reads is not None else {}
    forget_scores = score_qa_records(model, tokenizer, forget, k=10, tau=tau, **reads)
    truth_ratios(model, tokenizer, forget)
    score_qa_records(model, tokenizer, retain, k=None, tau=tau)
    truth_ratios(model, tokenizer, retain)
    return forget_scores


def membership_texts(tokenizer: Any, records: Sequence[dict]) -> tuple[list[str], list[str]]:
    pairs = [prompt_and_completion(tokenizer, r["question"], r["answer"], None) for r in records]
    return [c for _, c in pairs], [p for p, _ in pairs]


def eval_membership(
    model: Any, tokenizer: Any, forget: Sequence[dict], holdout: Sequence[dict], gradnorm: bool, scored: Any = None
) -> None:
    """The forward attacks (or the gradient norm) on the forget and holdout answers; the forget answers read from
    the scoring pass's ``scored`` where the library does so."""
    for records in (forget, holdout):
        texts, prompts = membership_texts(tokenizer, records)
        if gradnorm:
            gradient_norms(model, tokenizer, texts, 2048, prompts)
        elif attack_reads is not None:
            membership_scores(
                model, tokenizer, texts, 0.4, 8, 2048, prompts=prompts, attacks=FORWARD_ATTACKS, scored=scored
            )
        else:
            membership_scores(model, tokenizer, texts, 0.4, 8, 2048, prompts=prompts, attacks=FORWARD_ATTACKS)


def tofu_measure_setting(model: Any, tokenizer: Any, data: dict[str, Any]) -> Any:
    """compare's TOFU setting around one model: the never-trained reference is the same model (same cost)."""
    return CompareSetting(
        target_model=model, tokenizer=tokenizer, reference_model=model, reference_tokenizer=tokenizer,
        forget=None, retain=None, calibration=None, forget_records=data["forget"], retain_eval=data["retain"],
        holdout_records=data["holdout"], reference_ratios=None, peft_config=None, learn_info={}, description={},
        real_knowledge=data["real_knowledge"], measure_fluency=True,
    )  # fmt: skip


def compare_generation_budgets(
    tokenizer: Any, forget: Sequence[dict], retain: Sequence[dict], real: dict[str, Sequence[dict]]
) -> list[tuple[Sequence[dict], int]]:
    budgets = [
        (records, default_max_new_tokens(tokenizer, [r["answer"] for r in records])) for records in (forget, retain)
    ]
    return budgets + [(records, REAL_KNOWLEDGE_MAX_NEW_TOKENS) for records in real.values()]


def compare_generation(model: Any, tokenizer: Any, forget: Sequence[dict], retain: Sequence[dict], real: dict) -> None:
    """forget and retain each at its own budget, the real-knowledge sets together (one loop, as the bundle does;
    before, one per set)."""
    if score_qa_records is None:
        for records, budget in compare_generation_budgets(tokenizer, forget, retain, real):
            generate_answers(model, tokenizer, questions_answers(records)[0], budget)
        return
    for records in (forget, retain):
        questions, answers = questions_answers(records)
        generate_answers(
            model, tokenizer, questions, default_max_new_tokens(tokenizer, answers), GENERATION_BATCH_SIZE
        )
    questions = [r["question"] for records in real.values() for r in records]
    generate_answers(model, tokenizer, questions, REAL_KNOWLEDGE_MAX_NEW_TOKENS, GENERATION_BATCH_SIZE)


def compare_scoring(model: Any, tokenizer: Any, forget: Sequence[dict], retain: Sequence[dict]) -> Any:
    """The answers' probability; the forget set's pass keeps the Min-K% attack's token log-probabilities where the
    library reads them there (returned)."""
    if attack_reads is None:
        for records in (forget, retain):
            answer_probability(model, tokenizer, *questions_answers(records))
        return None
    scored = score_qa_records(model, tokenizer, forget, reads=attack_reads(["min_k"]))
    answer_probability(model, tokenizer, *questions_answers(retain))
    return scored


def compare_membership(
    model: Any, tokenizer: Any, forget: Sequence[dict], holdout: Sequence[dict], scored: Any = None
) -> None:
    if attack_reads is None:
        qa_membership_auc(model, tokenizer, forget, holdout)
    else:
        qa_membership_auc(model, tokenizer, forget, holdout, member_scores=scored)


def compare_options(model: Any, tokenizer: Any, real: dict[str, Sequence[dict]]) -> None:
    for records in real.values():
        option_scores(model, tokenizer, records, "answer", batch_size=32, show_progress=False)


def paraphrase_pairs(records: Sequence[dict]) -> list[tuple[str, str]]:
    return [(r["question"], o) for r in records for o in [r["paraphrased_answer"], *r["perturbed_answer"]]]


def compare_forget_answers(model: Any, tokenizer: Any, forget: Sequence[dict]) -> list[str]:
    questions, answers = questions_answers(forget)
    return generate_answers(
        model, tokenizer, questions, default_max_new_tokens(tokenizer, answers), GENERATION_BATCH_SIZE
    )


def compare_fluency(model: Any, tokenizer: Any, forget: Sequence[dict], answers: Sequence[str]) -> None:
    reference_nll(model, tokenizer, questions_answers(forget)[0], answers)


def nf4_check(model: Any, tokenizer: Any, forget: Any, measured: dict) -> dict:
    return nf4_forget_check(model, tokenizer, forget, measured)


class ForwardMeter:
    """Counts the tokens every forward call of ``model`` puts through it (``input_ids.numel()``), while active."""

    def __init__(self, model: Any) -> None:
        self.tokens = 0
        self.handle = model.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.tokens += ids.numel()


def timed(meters: Sequence[ForwardMeter], function: Callable[[], Any]) -> tuple[float, int]:
    before = sum(m.tokens for m in meters)
    start = time.perf_counter()
    function()
    return time.perf_counter() - start, sum(m.tokens for m in meters) - before


def forward_floor(model: Any, sequences: Sequence[Sequence[int]], pad_id: int, backward: bool = False) -> None:
    """One batched forward (or forward+backward of the summed loss) over ``sequences``, 32 a batch by length."""
    ordered = sorted(sequences, key=len)
    for start in range(0, len(ordered), 32):
        batch = ordered[start : start + 32]
        length = max(len(s) for s in batch)
        ids = torch.tensor([list(s) + [pad_id] * (length - len(s)) for s in batch])
        mask = torch.tensor([[1] * len(s) + [0] * (length - len(s)) for s in batch])
        if backward:
            model.zero_grad(set_to_none=True)
            labels = ids.masked_fill(mask == 0, -100)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode():
                model(input_ids=ids, attention_mask=mask)


def generate_floor(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """transformers' batched greedy ``generate``, 32 prompts a batch in the given order, left-padded."""
    pad_id = pad_token_id_of(tokenizer)
    with torch.inference_mode():
        for start in range(0, len(prompts), 32):
            batch = prompts[start : start + 32]
            length = max(len(p) for p in batch)
            ids = torch.tensor([[pad_id] * (length - len(p)) + list(p) for p in batch])
            mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in batch])
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                pad_token_id=pad_id, eos_token_id=tokenizer.eos_token_id, use_cache=True,
            )  # fmt: skip


def qa_sequences(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[list[int]]:
    return [tokenize_qa(tokenizer, q, a)["input_ids"] for q, a in pairs]


def completion_sequences(tokenizer: Any, records: Sequence[dict]) -> list[list[int]]:
    """The membership attack's tokens: the prompt with special tokens, the answer after it without."""
    sequences = []
    for r in records:
        prompt, completion = prompt_and_completion(tokenizer, r["question"], r["answer"], None)
        sequences.append(tokenizer(prompt)["input_ids"] + tokenizer(completion, add_special_tokens=False)["input_ids"])
    return sequences


def option_pairs(records: Sequence[dict]) -> list[tuple[str, str]]:
    return [(r["question"], option) for r in records for option in [r["answer"], *r["perturbed_answer"]]]


def add_part(
    rows: list[dict[str, Any]],
    meters: Sequence[ForwardMeter],
    name: str,
    work: Callable[[], Any],
    floor_work: Callable[[], Any],
) -> None:
    """Time ``work`` (counting its tokens) and ``floor_work``, the floor of the same tokens; a row of the table."""
    seconds, tokens = timed(meters, work)
    floor, _ = timed([], floor_work)
    rows.append(row(name, seconds, tokens, floor))


def row(name: str, seconds: float, tokens: int, floor: float | None) -> dict[str, Any]:
    return {"part": name, "seconds": seconds, "tokens": tokens, "floor": floor}


def print_table(title: str, rows: list[dict[str, Any]], total: float) -> None:
    print(f"\n### {title}: {total:.1f} s measured whole\n")
    print("| part | seconds | tokens | floor s | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        floor = f"{r['floor']:.1f}" if r["floor"] else "-"
        ratio = f"{r['seconds'] / r['floor']:.2f}x" if r["floor"] else "-"
        print(f"| {r['part']} | {r['seconds']:.1f} | {r['tokens']} | {floor} | {ratio} |")
    parts = sum(r["seconds"] for r in rows if r["part"] != "NF4 check")
    floors = [r["floor"] for r in rows if r["floor"] and r["part"] != "NF4 check"]
    print(f"| sum of parts | {parts:.1f} | | {sum(floors):.1f} | {parts / sum(floors):.2f}x |")


def load_data(tofu_dir: str, quick: bool) -> dict[str, Any]:
    authors = load_tofu_folder(tofu_dir)["authors"]
    split = TofuAuthorSplit.in_order(authors["author"], 2, 1, 2, 2)
    sets = tofu_sets(tofu_dir, split, 5 if quick else None)
    size = 5 if quick else 25
    real = {name: sets[name].select(range(min(size, len(sets[name])))) for name in ("real_authors", "world_facts")}
    return {
        "forget": sets["forget"],
        "retain": sets["retain"].shuffle(seed=0).select(range(min(60, len(sets["retain"])))),
        "holdout": sets["holdout"],
        "real_knowledge": real,
        "truth_ratio": list(load_split("forget05" if quick else "forget10")),
    }


def measure_eval(model: Any, tokenizer: Any, data: dict[str, Any], meters: list[ForwardMeter]) -> None:
    """``hf-unlearn eval`` with forget, retain and holdout files."""
    forget, retain, holdout = (list(data[name]) for name in ("forget", "retain", "holdout"))
    pad_id = pad_token_id_of(tokenizer)
    total, _ = timed(meters, lambda: run_eval(model, tokenizer, *(data[n] for n in ("forget", "retain", "holdout"))))
    rows = []
    prompts = []
    for records in (forget, retain):
        prompts.append([tokenize_prompt(tokenizer, r["question"]) for r in records])
    seconds, tokens = timed(meters, lambda: eval_generation(model, tokenizer, forget, retain))
    floor, _ = timed([], lambda: [
        generate_floor(model, tokenizer, p, default_max_new_tokens(tokenizer, [r["answer"] for r in recs]))
        for p, recs in zip(prompts, (forget, retain), strict=True)
    ])  # fmt: skip
    rows.append(row("generation (forget, retain)", seconds, tokens, floor))
    qa = qa_sequences(tokenizer, [(r["question"], r["answer"]) for r in forget + retain])
    scored: dict[str, Any] = {}  # the scoring part's forget scores, which the membership part reads
    add_part(
        rows,
        meters,
        "teacher-forced scoring (forget, retain)",
        lambda: scored.update(forget=eval_scoring(model, tokenizer, forget, retain)),
        lambda: forward_floor(model, qa, pad_id),
    )
    members = completion_sequences(tokenizer, forget + holdout)
    add_part(
        rows,
        meters,
        "membership, forward attacks (forget, holdout)",
        lambda: eval_membership(model, tokenizer, forget, holdout, gradnorm=False, scored=scored["forget"]),
        lambda: forward_floor(model, members, pad_id),
    )
    add_part(
        rows,
        meters,
        "membership, gradient norm (forward+backward)",
        lambda: eval_membership(model, tokenizer, forget, holdout, gradnorm=True),
        lambda: forward_floor(model, members, pad_id, backward=True),
    )
    print_table("hf-unlearn eval (forget, retain, holdout)", rows, total)
    # The floor of the whole evaluation: the answers generated once, one forward+backward over every sequence.
    backward, _ = timed([], lambda: forward_floor(model, qa + members, pad_id, backward=True))
    whole = rows[0]["floor"] + backward
    print(f"\nwhole evaluation {total:.1f} s against generate + one forward+backward over every sequence "
          f"{whole:.1f} s ({rows[0]['floor']:.1f} + {backward:.1f}): {total / whole:.2f}x")  # fmt: skip


def measure_compare(model: Any, tokenizer: Any, data: dict[str, Any], meters: list[ForwardMeter], nf4: bool) -> None:
    """compare's TOFU measurement of one model (with fluency) and the NF4 check."""
    forget, retain, holdout = (list(data[name]) for name in ("forget", "retain", "holdout"))
    real = {name: list(records) for name, records in data["real_knowledge"].items()}
    pad_id = pad_token_id_of(tokenizer)
    setting = tofu_measure_setting(model, tokenizer, data)
    total, _ = timed(meters, lambda: setting.measure(model))
    rows = []
    seconds, tokens = timed(meters, lambda: compare_generation(model, tokenizer, forget, retain, real))
    floor, _ = timed([], lambda: [
        generate_floor(model, tokenizer, [tokenize_prompt(tokenizer, r["question"]) for r in recs], budget)
        for recs, budget in compare_generation_budgets(tokenizer, forget, retain, real)
    ])  # fmt: skip
    rows.append(row("generation (forget, retain, real knowledge)", seconds, tokens, floor))
    qa = qa_sequences(tokenizer, [(r["question"], r["answer"]) for r in forget + retain])
    scored: dict[str, Any] = {}
    add_part(
        rows,
        meters,
        "teacher-forced scoring (forget, retain)",
        lambda: scored.update(forget=compare_scoring(model, tokenizer, forget, retain)),
        lambda: forward_floor(model, qa, pad_id),
    )
    members = completion_sequences(tokenizer, forget + holdout)
    add_part(
        rows,
        meters,
        "membership, Min-K% (forget, holdout)",
        lambda: compare_membership(model, tokenizer, forget, holdout, scored["forget"]),
        lambda: forward_floor(model, members, pad_id),
    )
    options = qa_sequences(tokenizer, [p for records in real.values() for p in option_pairs(records)])
    add_part(
        rows,
        meters,
        "real-knowledge options",
        lambda: compare_options(model, tokenizer, real),
        lambda: forward_floor(model, options, pad_id),
    )
    answers = compare_forget_answers(model, tokenizer, forget)
    fluency = qa_sequences(tokenizer, [(r["question"], a) for r, a in zip(forget, answers, strict=True) if a.strip()])
    add_part(
        rows,
        meters,
        "fluency NLL (never-trained model)",
        lambda: compare_fluency(model, tokenizer, forget, answers),
        lambda: forward_floor(model, fluency, pad_id),
    )
    if nf4:
        measured = setting.measure(model, with_fluency=False)["forget"]
        seconds, _ = timed([], lambda: nf4_check(model, tokenizer, data["forget"], measured))
        rows.append(row("NF4 check", seconds, 0, None))
    print_table("compare --benchmark tofu: one measurement", rows, total)


def measure_options(model: Any, tokenizer: Any, data: dict[str, Any], meters: list[ForwardMeter]) -> None:
    """The answers scored as options after one question: the real-knowledge options and the truth ratio's."""
    real = {name: list(records) for name, records in data["real_knowledge"].items()}
    pad_id = pad_token_id_of(tokenizer)
    rows: list[dict[str, Any]] = []
    options = qa_sequences(tokenizer, [p for records in real.values() for p in option_pairs(records)])
    add_part(
        rows,
        meters,
        "real-knowledge options (answer + 3 perturbed)",
        lambda: compare_options(model, tokenizer, real),
        lambda: forward_floor(model, options, pad_id),
    )
    paraphrased = qa_sequences(tokenizer, paraphrase_pairs(data["truth_ratio"]))
    add_part(
        rows,
        meters,
        f"truth ratio (embedded forget set, {len(data['truth_ratio'])} q: paraphrased + 3 perturbed)",
        lambda: truth_ratios(model, tokenizer, data["truth_ratio"]),
        lambda: forward_floor(model, paraphrased, pad_id),
    )
    total = sum(r["seconds"] for r in rows)
    print_table("options scored after their question", rows, total)


def load_model(folder: str | None, adapter: str | None) -> tuple[Any, Any]:
    """SmolLM2 as shipped, or the model in ``folder`` (float32) with the LoRA ``adapter`` on it, merged."""
    if folder is None:
        return load_smollm2()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model, AutoTokenizer.from_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tofu-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tofu"))
    parser.add_argument("--quick", action="store_true", help="5 questions per author and per real-knowledge set")
    parser.add_argument("--skip-nf4", action="store_true")
    parser.add_argument("--only", choices=("eval", "compare", "options"), default=None)
    parser.add_argument(
        "--model",
        default=None,
        help="a model folder to measure instead of SmolLM2 as shipped (e.g. a cached TOFU target: a fine-tuned model "
        "answers and stops, so its generation costs what a study's does), with --adapter a LoRA output on it",
    )
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model, args.adapter)
    model.eval()
    data = load_data(args.tofu_dir, args.quick)
    meters = [ForwardMeter(model)]
    print(f"{torch.get_num_threads()} thread(s); forget {len(data['forget'])}, retain {len(data['retain'])}, "
          f"holdout {len(data['holdout'])}, real knowledge "
          + ", ".join(f"{k} {len(v)}" for k, v in data["real_knowledge"].items()))  # fmt: skip
    if args.only in (None, "eval"):
        measure_eval(model, tokenizer, data, meters)
    if args.only in (None, "compare"):
        measure_compare(model, tokenizer, data, meters, nf4=not args.skip_nf4)
    if args.only in (None, "options"):
        measure_options(model, tokenizer, data, meters)


if __name__ == "__main__":
    main()
