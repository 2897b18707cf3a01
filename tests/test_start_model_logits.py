"""The start model's logits computed once per example (issue 55): the shared prefix run once, the LM head only where
an answer token is predicted, the head's inputs kept per example. Each value must equal the plain full forward's."""

import pytest
import torch
from conftest import ARCHITECTURES, make_tiny_model, unlearn_config
from peft import LoraConfig, get_peft_model
from transformers import Gemma2Config, Gemma2ForCausalLM

from hf_unlearn import UnlearnTrainer
from hf_unlearn.data.pairing import pad_examples
from hf_unlearn.objectives.registry import FORGET_OBJECTIVES, METHODS
from hf_unlearn.training.reference import adapters_disabled, frozen_copy
from hf_unlearn.training.start_model_logits import StartModelLogits, read_positions, start_model_is_constant

PREFIX = 10  # the leading tokens every row shares, as a chat template's system prompt


def prefixed_examples(count: int, seed: int = 0, prefix: int = PREFIX) -> list[dict]:
    """Rows that share ``prefix`` leading tokens, of different lengths and question lengths."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randint(1, 64, (prefix,), generator=generator).tolist()
    rows = []
    for i in range(count):
        rest = torch.randint(1, 64, (6 + 3 * (i % 4),), generator=generator).tolist()
        question = 2 + i % 3
        ids = shared + rest
        rows.append({"input_ids": ids, "labels": [-100] * (prefix + question) + ids[prefix + question :]})
    return rows


def lora_model(architecture: str, **lora):
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, **lora)
    return get_peft_model(make_tiny_model(architecture), config)


def full_forward(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_equal_to_the_full_forward_first_and_kept(architecture):
    """On padded rows of mixed lengths sharing a prefix: the first call (prefix run once, head from the first answer
    position) and the second (head over the kept inputs only) give the plain forward's logits where they are read."""
    model = lora_model(architecture)
    batch = pad_examples(prefixed_examples(4), pad_token_id=0)
    with adapters_disabled(model) as start:
        want = full_forward(start, batch)
    start_logits = StartModelLogits(lambda: adapters_disabled(model), budget_bytes=2**20)
    read = read_positions(batch["labels"])
    first = start_logits(batch)
    assert (start_logits.row_forwards, start_logits.head_only, start_logits.verified) == (4, 1, True)
    again = start_logits(batch)
    assert (start_logits.row_forwards, start_logits.forwards, start_logits.head_only) == (4, 0, 2)
    # Beyond the budget the batch's own forward runs (shared prefix once, head from the first answer position).
    unkept = StartModelLogits(lambda: adapters_disabled(model), budget_bytes=0)
    batched = unkept(batch)
    assert (unkept.forwards, unkept.row_forwards) == (1, 0)
    torch.testing.assert_close(batched[read], want[read], rtol=1e-5, atol=1e-5)
    assert first.shape == again.shape == want.shape
    torch.testing.assert_close(first[read], want[read], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[read], want[read], rtol=1e-5, atol=1e-5)
    # The adapters change the model: the start model's logits are not the trained model's.
    assert not torch.allclose(full_forward(model, batch)[read], want[read], atol=1e-3)


def test_rows_in_another_batch_and_budget():
    """A row is found again in a batch of other rows and another padding length; a row beyond the budget runs the
    start model again, and a budget of 0 keeps nothing."""
    model = make_tiny_model("llama")
    start = frozen_copy(model).eval()
    rows = prefixed_examples(6)
    start_logits = StartModelLogits(lambda: _yield(start), budget_bytes=2**20)
    start_logits(pad_examples(rows[:4], 0))
    mixed = pad_examples([rows[3], rows[1]], 0)  # both seen, padded to another length
    got = start_logits(mixed)
    assert (start_logits.head_only, start_logits.row_forwards) == (2, 4)
    read = read_positions(mixed["labels"])
    torch.testing.assert_close(got[read], full_forward(start, mixed)[read], rtol=1e-5, atol=1e-5)
    start_logits(pad_examples([rows[1], rows[5]], 0))  # one row not seen: that row alone runs the start model
    assert (start_logits.row_forwards, start_logits.head_only, start_logits.forwards) == (5, 3, 0)

    tight = StartModelLogits(lambda: _yield(start), budget_bytes=1)
    tight(pad_examples(rows[:2], 0))
    tight(pad_examples(rows[:2], 0))
    assert (tight.forwards, tight.row_forwards, tight.head_only, tight.kept) == (2, 0, 0, {})
    none = StartModelLogits(lambda: _yield(start), budget_bytes=0)
    none(pad_examples(rows[:2], 0))
    none(pad_examples(rows[:2], 0))
    assert (none.forwards, none.head_only, none.kept) == (2, 0, {})


def test_a_rows_value_does_not_depend_on_the_batch_that_first_brought_it():
    """A resumed run starts with nothing kept and meets its rows in other batches than the uninterrupted run did:
    each row's logits are the same bits whichever batch (other rows, other padding) first brought it, so the
    resumed run trains on what the uninterrupted one did."""
    start = frozen_copy(make_tiny_model("llama")).eval()
    rows = prefixed_examples(6)
    later = pad_examples([rows[3], rows[1]], 0)
    uninterrupted = StartModelLogits(lambda: _yield(start), budget_bytes=2**20)
    uninterrupted(pad_examples(rows[:5], 0))
    resumed = StartModelLogits(lambda: _yield(start), budget_bytes=2**20)
    assert torch.equal(uninterrupted(later), resumed(later))
    again = StartModelLogits(lambda: _yield(start), budget_bytes=2**20)
    again(pad_examples([rows[5], rows[1], rows[3]], 0))
    assert torch.equal(uninterrupted(later), again(later))


def test_the_same_tokens_with_other_answer_positions_are_not_taken_for_a_kept_row():
    """Continuation scoring draws a forget row's scored tokens anew each epoch: the same token ids with other labels
    are another row (their logits are read elsewhere)."""
    start = frozen_copy(make_tiny_model("qwen2")).eval()
    rows = prefixed_examples(3)
    start_logits = StartModelLogits(lambda: _yield(start), budget_bytes=2**20)
    start_logits(pad_examples(rows, 0))
    cut = [{**row, "labels": [-100] * 3 + row["labels"][3:-2] + [-100, -100]} for row in rows]
    cut[0]["labels"] = [-100] * (len(rows[0]["labels"]) - 3) + rows[0]["input_ids"][-3:]
    batch = pad_examples(cut, 0)
    got = start_logits(batch)
    assert start_logits.row_forwards == 6  # each of the three cut rows is a new row
    read = read_positions(batch["labels"])
    torch.testing.assert_close(got[read], full_forward(start, batch)[read], rtol=1e-5, atol=1e-5)


def test_a_model_that_transforms_its_logits_keeps_nothing():
    """Gemma 2 soft-caps its logits after the LM head: the head's inputs would not give them, so none are kept and
    every call runs the start model (and still returns its logits)."""
    config = Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, final_logit_softcapping=0.5, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    start = Gemma2ForCausalLM(config).eval()
    batch = pad_examples(prefixed_examples(3), 0)
    start_logits = StartModelLogits(lambda: _yield(start), budget_bytes=2**20)
    start_logits(batch)
    got = start_logits(batch)
    assert (start_logits.verified, start_logits.forwards, start_logits.row_forwards, start_logits.kept) == (
        False, 2, 1, {},
    )  # fmt: skip
    read = read_positions(batch["labels"])
    torch.testing.assert_close(got[read], full_forward(start, batch)[read], rtol=1e-5, atol=1e-5)


def test_a_start_model_that_moves_is_not_kept():
    """LoRA alone leaves the start model (adapters off) constant; LoRA that trains the base's biases does not."""
    assert start_model_is_constant(lora_model("llama"), separate_reference=False)
    assert not start_model_is_constant(lora_model("gpt2", bias="all"), separate_reference=False)
    assert start_model_is_constant(make_tiny_model("llama"), separate_reference=True)


# MASC in its calibrated mode (with a calibration set), where the rival KL reads the start model.
CALIBRATED = {"masc": {"masc_threshold": "calibration"}}

REFERENCE_READERS = sorted(
    name
    for name, objective in FORGET_OBJECTIVES.items()
    if not (objective.needs_hidden_states or objective.needs_refusal or objective.needs_alternate)
    and objective.needs_reference(unlearn_config("unused", method=name))
) + ["masc"]  # MASC's calibrated mode: the rival KL and the retain KL (the preference objectives read the start
# model through the same call, on their paired batch too)


@pytest.mark.parametrize("method", REFERENCE_READERS)
def test_training_equals_the_start_model_run_every_time(tmp_path, method):
    """Every objective that reads the start model's logits trains to the same weights whether they come from one
    full forward per batch (the code before issue 55) or from the shared prefix, the trimmed head and the kept
    inputs; the kept ones are read from the second epoch on."""
    rows = prefixed_examples(8)
    retain = prefixed_examples(8, seed=1)

    def trained(plain: bool):
        model = lora_model("llama")
        args = unlearn_config(
            tmp_path / f"{method}-{plain}", method=method, per_device_train_batch_size=4, num_train_epochs=3,
            learning_rate=1e-2, probe_interval=0, stop_at_target=False, seed=0, **CALIBRATED.get(method, {}),
        )  # fmt: skip
        calibration = prefixed_examples(8, seed=2) if method == "masc" else None
        trainer = UnlearnTrainer(
            model=model, args=args, train_dataset=rows, retain_dataset=retain, calibration_dataset=calibration
        )
        if plain:
            trainer.start_model_logits = StartModelLogits(
                lambda: trainer._reference_mode(trainer.model), budget_bytes=0, may_trim=False
            )
        trainer.train()
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        return weights, trainer.start_model_logits

    plain, _ = trained(plain=True)
    kept, start_logits = trained(plain=False)
    assert start_logits.head_only > 0
    for name, value in plain.items():
        torch.testing.assert_close(kept[name], value, rtol=1e-4, atol=1e-5, msg=name)


def _yield(model):
    from contextlib import nullcontext

    return nullcontext(model)


WINDOWED_METHODS = sorted(
    method
    for method, (forget, _retain) in METHODS.items()
    if not (
        FORGET_OBJECTIVES[forget].needs_refusal
        or FORGET_OBJECTIVES[forget].needs_alternate
        or FORGET_OBJECTIVES[forget].needs_hidden_states  # RMU: the whole sequence, no LM head window
    )
)


def without_dropout(model):
    """``model`` with every dropout probability (modules and config) set to 0."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = model.config
    for key, value in config.to_dict().items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float) and value > 0:
            setattr(config, key, 0.0)
    return model


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("method", WINDOWED_METHODS)
def test_training_forward_from_the_answer_window_equals_the_whole_one(tmp_path, architecture, method):
    """The training forward runs its LM head only from the batch's first predicted answer token, and the rows'
    shared leading tokens once (issue 55 part 3): on padded rows of mixed lengths sharing a prefix, every method's
    loss and gradients equal those of the forward over the whole sequence, the head saw fewer positions and the
    model fewer tokens."""
    args = unlearn_config(
        tmp_path,
        method=method,
        per_device_train_batch_size=4,
        probe_interval=0,
        stop_at_target=False,
        seed=0,
        **CALIBRATED.get(method, {}),
    )
    calibration = prefixed_examples(8, seed=2) if method == "masc" else None
    model = without_dropout(lora_model(architecture))  # with dropout the prefix is not shared (one mask per row)
    trainer = UnlearnTrainer(
        model=model, args=args, train_dataset=prefixed_examples(4), retain_dataset=prefixed_examples(4, seed=1),
        calibration_dataset=calibration,
    )  # fmt: skip
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    positions: list[int] = []
    tokens: list[int] = []
    hooks = [
        model.get_output_embeddings().register_forward_hook(lambda _m, a, _o: positions.append(a[0].shape[1])),
        model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: tokens.append(a[0].numel())),
    ]

    def loss_and_gradients(window: bool, shared: bool):
        trainer.answer_window_forward = None if window else False
        trainer.shared_prefix_forward = None if shared else False
        model.zero_grad()
        positions.clear()
        tokens.clear()
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
        return loss.detach(), gradients, sum(positions), sum(tokens)

    try:
        loss_and_gradients(window=False, shared=False)  # once first: the probes' and start model's forwards are done
        whole_loss, whole_gradients, whole_positions, whole_tokens = loss_and_gradients(window=False, shared=False)
        measured = {
            "window": loss_and_gradients(window=True, shared=False),
            "shared prefix": loss_and_gradients(window=True, shared=True),
        }
    finally:
        for hook in hooks:
            hook.remove()
    assert trainer.shared_prefix_forward is True
    for mode, (loss, gradients, head_positions, _forwarded) in measured.items():
        torch.testing.assert_close(loss, whole_loss, rtol=1e-5, atol=1e-6, msg=mode)
        assert gradients.keys() == whole_gradients.keys() and gradients
        for name, value in whole_gradients.items():
            torch.testing.assert_close(gradients[name], value, rtol=1e-4, atol=1e-6, msg=f"{mode}: {name}")
        assert head_positions < whole_positions, mode
    assert measured["window"][3] == whole_tokens
    assert measured["shared prefix"][3] < whole_tokens


def test_the_shared_prefix_is_not_run_once_where_it_would_not_equal_the_whole_forward(tmp_path):
    """Gradient checkpointing turned on after the first batch (Trainer does so inside train()) and a prompt-learning
    adapter (its virtual tokens go before every call) each run the rows whole."""
    from peft import PromptTuningConfig

    from hf_unlearn.forwards import prompt_cache_keyword

    args = unlearn_config(tmp_path, method="graddiff", per_device_train_batch_size=4, probe_interval=0, seed=0)
    model = without_dropout(lora_model("llama"))
    trainer = UnlearnTrainer(
        model=model, args=args, train_dataset=prefixed_examples(4), retain_dataset=prefixed_examples(4, seed=1)
    )
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    forget = batch["forget"]
    start = trainer._answer_window(model, forget)
    assert trainer._shared_prefix(model, forget, start) == PREFIX
    model.base_model.model.gradient_checkpointing_enable()
    assert trainer._shared_prefix(model, forget, start) == 0
    prompt_tuning = PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    prompt_tuned = get_peft_model(make_tiny_model("llama"), prompt_tuning)
    assert prompt_cache_keyword(prompt_tuned) is None
    assert prompt_cache_keyword(model) is not None
