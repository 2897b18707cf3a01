import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One cache of the embedded benchmark's target model for the whole test session, never the user's ~/.cache.
if "HF_UNLEARN_CACHE" not in os.environ:
    import tempfile

    os.environ["HF_UNLEARN_CACHE"] = tempfile.mkdtemp(prefix="hf_unlearn_test_cache_")

# Under pytest-xdist each worker takes its share of the cores (torch would otherwise start a thread per core in every
# worker, and the workers' threads would contend); the processes a test starts inherit it. OMP_NUM_THREADS set by the
# caller wins.
WORKER_THREADS = None
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 and "OMP_NUM_THREADS" not in os.environ:
    WORKER_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)

import pytest  # noqa: E402
import torch  # noqa: E402

if WORKER_THREADS is not None:
    torch.set_num_threads(WORKER_THREADS)
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

VOCAB = 64
ARCHITECTURES = ("llama", "qwen2", "gpt2")

# Tests that compare floating-point results across runs, processes or code paths (stored trajectories, one process
# against two, a resumed run against an uninterrupted one, batched against one at a time, fused against a plain
# loop). `.ci/run` runs them a second time on torch's other CPU kernel family (`-m numerics`). A test of these
# modules that compares no floating-point result is marked `not_numerics` and left out.
NUMERICS_MODULES = {
    "test_reference_trajectories",
    "test_distributed",
    "test_sharded_surgery",
    "test_trainer_gradients",
    "test_surgery",
    "test_margin",
    "test_metrics",
    "test_membership",
    "test_stopping",
    "test_objectives",
    "test_start_model_logits",
}


#: Real TOFU rows beside the project (../shared/tofu, see its README: used from there, never copied into the project);
#: HF_UNLEARN_TOFU_DIR points elsewhere, e.g. when the checkout is not next to it.
TOFU_DIR = os.path.abspath(
    os.environ.get(
        "HF_UNLEARN_TOFU_DIR", os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "shared", "tofu")
    )
)
needs_tofu_rows = pytest.mark.skipif(
    not os.path.isfile(os.path.join(TOFU_DIR, "authors.jsonl")), reason=f"no TOFU rows at {TOFU_DIR}"
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("not_numerics"):
            continue
        if item.module.__name__ in NUMERICS_MODULES or "resume" in item.name:
            item.add_marker(pytest.mark.numerics)


def make_tiny_model(architecture: str = "llama", seed: int = 0, vocab_size: int = VOCAB):
    """A randomly initialised causal LM of a few thousand parameters, no dropout (deterministic training)."""
    torch.manual_seed(seed)
    if architecture == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        return LlamaForCausalLM(config)
    if architecture == "qwen2":
        config = Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        return Qwen2ForCausalLM(config)
    if architecture == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return GPT2LMHeadModel(config)
    raise ValueError(architecture)


def make_example(seed: int, length: int = 12, prompt: int = 6, vocab_size: int = VOCAB) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (length,), generator=generator).tolist()
    return {"input_ids": ids, "attention_mask": [1] * length, "labels": [-100] * prompt + ids[prompt:]}


def make_varied_example(seed: int, vocab_size: int = VOCAB) -> dict:
    """Examples of different lengths and prompt lengths, so answer-token counts differ between (micro-)batches."""
    generator = torch.Generator().manual_seed(seed)
    length = 6 + seed % 9
    prompt = 2 + seed % 4
    ids = torch.randint(1, vocab_size, (length,), generator=generator).tolist()
    return {"input_ids": ids, "attention_mask": [1] * length, "labels": [-100] * prompt + ids[prompt:]}


def unlearn_config(output_dir, **overrides):
    """An UnlearnConfig for tests: on the CPU, no reports, no checkpoints, no progress bars, then ``overrides``."""
    from hf_unlearn import UnlearnConfig

    values = dict(output_dir=str(output_dir), report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True)
    return UnlearnConfig(**{**values, **overrides})


def forget_set() -> list[dict]:
    """The 8 tokenized forget examples most trainer tests unlearn (a fresh list on every call)."""
    return [make_example(i) for i in range(8)]


def retain_set() -> list[dict]:
    """The 16 tokenized retain examples that go with :func:`forget_set`."""
    return [make_example(1000 + i) for i in range(16)]


@pytest.fixture
def forget_examples():
    return forget_set()


@pytest.fixture
def retain_examples():
    return retain_set()


def memorize(model, examples, steps: int = 150, lr: float = 1e-2):
    """Teach a tiny model the answers of ``examples`` (AdamW on answer tokens): something to forget."""
    from hf_unlearn.data.pairing import pad_examples

    batch = pad_examples(examples, pad_token_id=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@pytest.fixture(scope="session")
def memorized_llama_state():
    """State dict of a tiny Llama that has memorized forget and retain examples (built once per session)."""
    model = memorize(make_tiny_model("llama"), forget_set() + retain_set())
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture
def memorized_llama(memorized_llama_state):
    model = make_tiny_model("llama")
    model.load_state_dict(memorized_llama_state)
    return model


def answer_nll(logits, labels):
    """Mean next-token NLL of the answer tokens in the logits' own precision (transformers' loss would round a
    float64 model's logits to float32)."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100)


def cpu_independent_init(model, seed: int = 0):
    """Refill every matrix of ``model`` with multiples of 2**-12 drawn as integers, spread like the usual 0.02-std
    init: exact on any CPU (torch's ``normal_`` has vectorised and scalar implementations whose draws differ in the
    last bits). Norm weights (1) and biases (0) stay. For tests whose outcome rests on a trained model's greedy
    text."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                steps = torch.randint(-4096, 4097, param.shape, generator=generator, dtype=torch.int64)
                param.copy_(steps.to(param.dtype) * (0.02 * 3**0.5 / 4096))
    return model


def train_on_answers(model, tokenizer, records, steps: int, lr: float, ascent: bool = False):
    """AdamW on the answer tokens of QA ``records`` (gradient ascent with ``ascent``), the whole set as one batch, in
    the model's own precision."""
    from hf_unlearn.data.examples import tokenize_qa
    from hf_unlearn.data.pairing import pad_examples

    batch = pad_examples([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in records], 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = answer_nll(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                          batch["labels"])  # fmt: skip
        (-loss if ascent else loss).backward()
        optimizer.step()
    return model


def built_once_per_run(name, build, fresh, tmp_path_factory):
    """The models ``build()`` returns, built once per test run: under pytest-xdist the first worker that asks builds
    them and saves their weights, and every other worker waits for it (a file lock) and loads them into ``fresh()``
    models, exactly; in one process, ``build()``."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build()
    from filelock import FileLock

    # the run's own folder, shared by its workers (pytest-N/ above each worker's popen-gwK/)
    path = tmp_path_factory.getbasetemp().parent / f"{name}.pt"
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            models = build()
            torch.save([model.state_dict() for model in models], path)
            return models
    models = []
    for state in torch.load(path):
        model = fresh()
        model.load_state_dict(state)
        models.append(model)
    return models


@pytest.fixture(scope="session")
def suppressed_setting(tmp_path_factory):
    """The embedded tokenizer and, on forget05 / 20 retain / 10 holdout QA: a target (learned forget + retain), a
    'suppressed' copy (the target after 10 steps of gradient ascent on the forget set) and a reference (learned the
    retain set only). Built once per session (under pytest-xdist, once per run: ~80 s)."""
    import copy

    from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model

    tokenizer = build_tokenizer()
    forget = list(load_split("forget05").select_columns(["question", "answer"]))
    retain = list(load_split("retain95").select(range(20)).select_columns(["question", "answer"]))
    holdout = list(load_split("holdout").select(range(10)).select_columns(["question", "answer"]))

    def fresh():
        # float64 and a CPU-independent start: the relearning and audit verdicts rest on greedy text after AdamW
        # steps, which float32 rounding differences between CPU kernels moved across their thresholds. GPT-2, which
        # is float64 throughout (Llama's RMSNorm computes in float32).
        return cpu_independent_init(tiny_model(tokenizer, "gpt2", hidden_size=64, num_layers=2, num_heads=2).double())

    def build():
        target = train_on_answers(fresh(), tokenizer, forget + retain, 300, 1e-2)
        reference = train_on_answers(fresh(), tokenizer, retain, 300, 1e-2)
        suppressed = train_on_answers(copy.deepcopy(target), tokenizer, forget, 10, 1e-3, ascent=True)
        return target, reference, suppressed

    target, reference, suppressed = built_once_per_run("suppressed_setting", build, fresh, tmp_path_factory)
    return {
        "tokenizer": tokenizer,
        "forget": forget,
        "retain": retain,
        "holdout": holdout,
        "target": target,
        "suppressed": suppressed,
        "reference": reference,
    }


def quantized_and_kept(entry: dict) -> tuple[int, int]:
    """One mode's result of the quantization check: how many layers it quantized and how many it kept in full
    precision because bitsandbytes' CPU kernel cannot pack their shape, as the check reports them (which layers
    this CPU's kernel packs is its decision, not the test's)."""
    return entry["quantized_layers"], len(entry.get("kept_in_full_precision", {}).get("modules", {}))


# --- model folders and dataset files as a user has them ------------------------------------------------------------


def save_model_folder(folder, model, tokenizer):
    """A model folder as a user has one: the model and its tokenizer saved side by side. Returns ``folder``."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_model_folder(folder, architecture: str = "llama", **sizes):
    """The embedded benchmark's tokenizer and a random tiny ``architecture`` model of ``sizes`` (hidden_size,
    num_layers, num_heads, ...), saved together in ``folder``. Returns ``(model, tokenizer)``."""
    from hf_unlearn.benchmarks import build_tokenizer, tiny_model

    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, architecture, **sizes)
    save_model_folder(folder, model, tokenizer)
    return model, tokenizer


def write_qa_files(root):
    """The embedded benchmark's forget05 (``forget.json``) and 20 retain95 records (``retain.jsonl``) as local
    files in the TOFU schema (question, answer, ... columns), as a user would have them."""
    from hf_unlearn.benchmarks import load_split

    load_split("forget05").to_json(root / "forget.json")
    load_split("retain95").select(range(20)).to_json(root / "retain.jsonl")
    return root


def write_hub_repo(root, configs: dict[str, dict[str, list[dict]]]) -> str:
    """A dataset repository folder laid out as on the Hub: one JSON-lines file per config and split, and a README
    whose YAML ``configs`` section maps them."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, rows in splits.items():
            path = root / config / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            lines += [f"  - split: {split}", f"    path: {config}/{split}.jsonl"]
    lines += ["---", ""]
    (root / "README.md").write_text("\n".join(lines))
    return str(root)


# --- independent reference computations -----------------------------------------------------------------------------
# Plain torch on one unpadded sequence at a time and rouge_score itself: what a test compares a library value with,
# never the library's own batched code.


def _logits(model, input_ids):
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(input_ids)], device=device)).logits[0].float().cpu()


def hand_answer_log_probs(model, example) -> list[float]:
    """Log-probability of each answer token (label not -100) of one tokenized example: the token at t + 1 scored
    by the softmax of the logits at t, from a plain forward on the unpadded sequence (puts ``model`` in eval)."""
    log_probs = torch.log_softmax(_logits(model, example["input_ids"]), dim=-1)
    labels = example["labels"]
    return [log_probs[t - 1, labels[t]].item() for t in range(1, len(labels)) if labels[t] != -100]


def hand_answer_probability(model, example) -> float:
    """TOFU's answer probability ``P(a | q) ** (1 / |a|)`` = exp(mean answer-token log-probability)."""
    values = hand_answer_log_probs(model, example)
    return math.exp(sum(values) / len(values))


def hand_margins(model, example, k: int) -> list[float]:
    """MASC's restricted margin (arXiv 2606.02920, §3) of each answer token at beta = 1 with self-competitors: the
    target's logit minus the log-sum-exp of the k highest other logits at that position."""
    logits = _logits(model, example["input_ids"])
    labels = example["labels"]
    margins = []
    for t in range(1, len(labels)):
        if labels[t] == -100:
            continue
        row = logits[t - 1].tolist()
        others = sorted((v for i, v in enumerate(row) if i != labels[t]), reverse=True)[:k]
        top = others[0]
        margins.append(row[labels[t]] - (top + math.log(sum(math.exp(v - top) for v in others))))
    return margins


def hand_greedy(model, tokenizer, prompt_ids, max_new_tokens: int) -> str:
    """Greedy decoding by hand: the argmax of a full forward pass per new token (no cache, no padding), stopping
    at EOS; the new tokens decoded without special tokens and stripped."""
    new: list[int] = []
    for _ in range(max_new_tokens):
        token = int(_logits(model, list(prompt_ids) + new)[-1].argmax())
        if token == tokenizer.eos_token_id:
            break
        new.append(token)
    return tokenizer.decode(new, skip_special_tokens=True).strip()


def hand_rouge_l(prediction: str, reference: str, measure: str) -> float:
    """ROUGE-L (``recall`` or ``fmeasure``) from rouge_score itself, Porter stemming on (TOFU's and MUSE's
    setting)."""
    from rouge_score import rouge_scorer

    scores = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(reference, prediction)
    return getattr(scores["rougeL"], measure)
