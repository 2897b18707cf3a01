import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One cache of the embedded benchmark's target model for the whole test session, never the user's ~/.cache.
if "HF_UNLEARN_CACHE" not in os.environ:
    import tempfile

    os.environ["HF_UNLEARN_CACHE"] = tempfile.mkdtemp(prefix="hf_unlearn_test_cache_")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

VOCAB = 64
ARCHITECTURES = ("llama", "qwen2", "gpt2")

# Tests that compare floating-point results across runs, processes or code paths (stored trajectories, one process
# against two, a resumed run against an uninterrupted one, batched against one at a time, fused against a plain
# loop). `.ci/run` runs them a second time on torch's other CPU kernel family (`-m numerics`).
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
}


def pytest_collection_modifyitems(config, items):
    for item in items:
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


@pytest.fixture
def forget_examples():
    return [make_example(i) for i in range(8)]


@pytest.fixture
def retain_examples():
    return [make_example(1000 + i) for i in range(16)]


def memorize(model, examples, steps: int = 150, lr: float = 1e-2):
    """Teach a tiny model the answers of ``examples`` (AdamW on answer tokens): something to forget."""
    from hf_unlearn.data import pad_examples

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
    forget = [make_example(i) for i in range(8)]
    retain = [make_example(1000 + i) for i in range(16)]
    model = memorize(make_tiny_model("llama"), forget + retain)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture
def memorized_llama(memorized_llama_state):
    model = make_tiny_model("llama")
    model.load_state_dict(memorized_llama_state)
    return model


def train_on_answers(model, tokenizer, records, steps: int, lr: float, ascent: bool = False):
    """AdamW on the answer tokens of QA ``records`` (gradient ascent with ``ascent``), the whole set as one batch."""
    from hf_unlearn.data import pad_examples, tokenize_qa

    batch = pad_examples([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in records], 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(**batch).loss
        (-loss if ascent else loss).backward()
        optimizer.step()
    return model


@pytest.fixture(scope="session")
def suppressed_setting():
    """The embedded tokenizer and, on forget05 / 20 retain / 10 holdout QA: a target (learned forget + retain), a
    'suppressed' copy (the target after 10 steps of gradient ascent on the forget set) and a reference (learned the
    retain set only). Built once per session."""
    import copy

    from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model

    tokenizer = build_tokenizer()
    forget = list(load_split("forget05").select_columns(["question", "answer"]))
    retain = list(load_split("retain95").select(range(20)).select_columns(["question", "answer"]))
    holdout = list(load_split("holdout").select(range(10)).select_columns(["question", "answer"]))

    def fresh():
        return tiny_model(tokenizer, "llama", hidden_size=48, num_layers=2, num_heads=2)

    target = train_on_answers(fresh(), tokenizer, forget + retain, 150, 1e-2)
    reference = train_on_answers(fresh(), tokenizer, retain, 150, 1e-2)
    suppressed = train_on_answers(copy.deepcopy(target), tokenizer, forget, 10, 3e-3, ascent=True)
    return {
        "tokenizer": tokenizer,
        "forget": forget,
        "retain": retain,
        "holdout": holdout,
        "target": target,
        "suppressed": suppressed,
        "reference": reference,
    }
