"""The 4-bit check catches what it is for: a model whose forgotten answers come back under NF4 (built here: its
weights sit inside the NF4 bins of a model that knows the answers) is flagged and the target is not; the caller's
model (a LoRA model included) is untouched; every requested mode is really quantized."""

import copy
import tempfile

import bitsandbytes.functional as bnb_functional
import pytest
import torch
from conftest import quantized_and_kept, train_on_answers

from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.data.pairing import pad_examples
from hf_unlearn.evaluation.metrics import evaluate_qa
from hf_unlearn.robustness.quantize import check_quantization_robustness, quantization_table

# bitsandbytes' NF4 code book (Dettmers et al. 2023, QLoRA, Appendix E), ascending.
NF4_CODES = torch.tensor(
    [-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
     0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0]
)  # fmt: skip
BLOCK = 64


def nf4_round_trip(weight: torch.Tensor) -> torch.Tensor:
    packed, state = bnb_functional.quantize_4bit(
        weight.detach().float().contiguous(), blocksize=BLOCK, quant_type="nf4"
    )
    return bnb_functional.dequantize_4bit(packed, state, blocksize=BLOCK, quant_type="nf4").view_as(weight)


def nf4_bins(weight: torch.Tensor, shrink: float = 0.98) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element, the interval that keeps its NF4 code (a little inside the midpoints to the neighbouring codes);
    each block's absmax element is pinned, so the block's scale does not move."""
    blocks = weight.reshape(-1, BLOCK)
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    normalized = blocks / absmax
    mids = (NF4_CODES[1:] + NF4_CODES[:-1]) / 2
    index = torch.bucketize(normalized, mids)
    centre = NF4_CODES[index]
    low = torch.cat([torch.tensor([-1.0]), mids])[index]
    high = torch.cat([mids, torch.tensor([1.0])])[index]
    low, high = (centre + (low - centre) * shrink) * absmax, (centre + (high - centre) * shrink) * absmax
    pinned = normalized.abs() >= 0.999
    low, high = torch.where(pinned, blocks, low), torch.where(pinned, blocks, high)
    return low.reshape(weight.shape), high.reshape(weight.shape)


def quantized_linears(model):
    return [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in name]


@pytest.fixture(scope="module")
def regain():
    """A target that knows 5 forget answers, and an 'unlearned' copy whose fp32 weights forgot them by gradient
    ascent *inside* the target's NF4 bins: in full precision it has forgotten, under NF4 it is the target again
    (the failure of Zhang et al., ICLR 2025, made exact)."""
    tokenizer = build_tokenizer()
    target = tiny_model(tokenizer, "llama", hidden_size=64, num_layers=2, num_heads=2)
    forget = load_split("forget01").select_columns(["question", "answer"])
    retain = load_split("retain99").select(range(10)).select_columns(["question", "answer"])
    train_on_answers(target, tokenizer, [*forget, *retain], steps=80, lr=1e-2)
    with torch.no_grad():
        for module in quantized_linears(target):  # on the NF4 grid, so NF4 changes nothing about the target
            module.weight.copy_(nf4_round_trip(module.weight))
    unlearned = copy.deepcopy(target)
    weights = [m.weight for m in quantized_linears(unlearned)]
    bins = [nf4_bins(w.detach()) for w in weights]
    for parameter in unlearned.parameters():
        parameter.requires_grad_(parameter in set(weights))
    forget_batch = pad_examples([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in forget], 0)
    optimizer = torch.optim.Adam(weights, lr=3e-3)
    for _ in range(80):
        optimizer.zero_grad()
        (-unlearned(**forget_batch).loss).backward()
        optimizer.step()
        with torch.no_grad():
            for weight, (low, high) in zip(weights, bins, strict=True):
                weight.copy_(torch.maximum(torch.minimum(weight, high), low))
    for parameter in unlearned.parameters():
        parameter.requires_grad_(True)
    return target, unlearned, tokenizer, forget, retain


def test_the_built_model_really_regains_under_nf4(regain):
    target, unlearned, tokenizer, forget, _ = regain
    assert evaluate_qa(target, tokenizer, forget)["rouge_l_recall"] > 0.9
    assert evaluate_qa(unlearned, tokenizer, forget)["rouge_l_recall"] < 0.4
    for before, after in zip(quantized_linears(target), quantized_linears(unlearned), strict=True):
        assert not torch.equal(before.weight, after.weight)
        assert torch.equal(nf4_round_trip(after.weight), before.weight)


def test_quant_check_flags_the_regain_and_not_the_target(regain):
    target, unlearned, tokenizer, forget, retain = regain
    flagged = check_quantization_robustness(unlearned, tokenizer, forget, retain, modes=("nf4",))
    assert flagged["full_precision"]["forget"]["rouge_l_recall"] < 0.4
    assert flagged["nf4"]["forget"]["rouge_l_recall"] > 0.9
    assert flagged["nf4"]["change"]["forget"]["rouge_l_recall"] > 0.5
    assert flagged["nf4"]["knowledge_returned"] is True
    assert "Forgotten knowledge came back after: nf4." in quantization_table(flagged)
    # The target knew its answers in full precision already: nothing came back.
    quiet = check_quantization_robustness(target, tokenizer, forget, retain, modes=("nf4",))
    assert quiet["nf4"]["knowledge_returned"] is False
    assert "No forgotten knowledge came back" in quantization_table(quiet)


def test_the_callers_model_and_its_adapters_are_untouched(regain):
    from peft import LoraConfig, get_peft_model

    _, unlearned, tokenizer, forget, _ = regain
    model = get_peft_model(
        copy.deepcopy(unlearned), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # non-zero adapters, so a merge into the caller's base would show
                parameter.normal_(0, 0.05)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([tokenize_qa(tokenizer, forget[0]["question"], forget[0]["answer"])["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    check_quantization_robustness(model, tokenizer, forget, modes=("nf4",))
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert sum("lora_A" in name for name, _ in model.named_parameters()) == 4
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, logits)


def test_every_requested_mode_is_really_quantized(regain):
    _, unlearned, tokenizer, forget, _ = regain
    layers = len(quantized_linears(unlearned))
    result = check_quantization_robustness(unlearned, tokenizer, forget, modes=("nf4", "fp4", "int8"))
    assert set(result) == {"full_precision", "nf4", "fp4", "int8"}
    for mode in ("nf4", "fp4", "int8"):
        # Llama, hidden 64, MLP 256: shapes bitsandbytes' AVX-512 BF16 kernel packs, so on any CPU every layer is in
        # 4 (or 8) bits and none is kept in full precision.
        assert quantized_and_kept(result[mode]) == (layers, 0) and result[mode]["linear_layers"] == layers
        assert result[mode]["measured"] is True and isinstance(result[mode]["knowledge_returned"], bool)
        assert result[mode]["forget"]["num_examples"] == 5
    # FP4 has another code book: the fp32 model's weights are not on its grid, so its answers differ from NF4's.
    assert result["fp4"]["forget"]["probability"] != result["nf4"]["forget"]["probability"]


def test_layers_that_do_not_fit_the_avx512_bf16_layout_stay_in_full_precision_and_are_reported():
    """On a CPU with AVX-512 BF16, bitsandbytes repacks a 4-bit weight for inference and asserts that its out features
    are a multiple of 32. The check keeps such layers in full precision (bitsandbytes' skip list), names them with
    their shape in a warning and in the result, and quantizes the rest. The shape rule is given (``avx512_bf16``), so
    it is checked on any CPU; then the check runs as this CPU needs; bitsandbytes' own repacking function shows which
    layers it would refuse."""
    from hf_unlearn.robustness.quantize import modules_to_keep_for_cpu, repacks_4bit_on_this_cpu

    tokenizer = build_tokenizer()
    forget = list(load_split("forget01").select_columns(["question", "answer"]))
    # Qwen2, hidden 64 (attention 64 x 64) and an MLP of 80: gate and up have 80 out features (not a multiple of 32),
    # down has 80 in features (not a multiple of bitsandbytes' 4-bit blocksize, 64).
    model = tiny_model(tokenizer, "qwen2", hidden_size=64, num_layers=1, num_heads=4, intermediate_size=80)
    fitting = tiny_model(tokenizer, "llama", hidden_size=64, num_layers=1, num_heads=4, intermediate_size=128)
    unfit_expected = {
        f"model.layers.0.mlp.{name}": shape
        for name, shape in (("gate_proj", [80, 64]), ("up_proj", [80, 64]), ("down_proj", [64, 80]))
    }

    assert modules_to_keep_for_cpu(model.config, avx512_bf16=False)[1] == {}  # on other CPUs nothing extra is kept
    skip, unfit = modules_to_keep_for_cpu(model.config, avx512_bf16=True)
    assert unfit == unfit_expected and "lm_head" in skip
    assert modules_to_keep_for_cpu(fitting.config, avx512_bf16=True)[1] == {}  # a model without such a layer
    assert modules_to_keep_for_cpu(model.config)[1] == (unfit_expected if repacks_4bit_on_this_cpu() else {})

    all_linears = 7  # q, k, v, o, gate, up, down
    result = check_quantization_robustness(model, tokenizer, forget, modes=("nf4", "int8"), avx512_bf16=True)
    kept = result["nf4"]["kept_in_full_precision"]
    assert kept["modules"] == unfit_expected and "multiples of 32" in kept["reason"]
    assert "kept_in_full_precision" not in result["int8"]  # the 8-bit layout is not affected
    assert quantized_and_kept(result["nf4"]) == (all_linears - 3, 3) and quantized_and_kept(result["int8"]) == (7, 0)
    assert result["nf4"]["measured"] is True  # 4 of 7: more than half
    table = quantization_table(result)
    assert "`model.layers.0.mlp.gate_proj` (80 x 64)" in table and "stayed in full precision" in table
    # As this CPU needs: the same split on one with AVX-512 BF16, every layer in 4 bits elsewhere.
    own = check_quantization_robustness(model, tokenizer, forget, modes=("nf4",))["nf4"]
    assert sum(quantized_and_kept(own)) == own["linear_layers"] == all_linears
    assert quantized_and_kept(own)[1] == (3 if repacks_4bit_on_this_cpu() else 0)

    # What the skip list avoids, with bitsandbytes' own repacking: it fails on the three MLP layers and accepts every
    # layer left in 4 bits.
    from bitsandbytes.functional import _convert_weight_packed_for_cpu
    from transformers import BitsAndBytesConfig

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        for skip_modules, should_fail in ((None, True), (skip, False)):
            config = BitsAndBytesConfig(load_in_4bit=True, llm_int8_skip_modules=skip_modules)
            loaded = type(model).from_pretrained(folder, quantization_config=config, device_map="cpu")
            refused = []
            for name, module in loaded.named_modules():
                if type(module).__name__ == "Linear4bit":
                    try:
                        _convert_weight_packed_for_cpu(
                            module.weight.data.clone(), copy.deepcopy(module.weight.quant_state)
                        )
                    except (AssertionError, RuntimeError):  # out features: an assertion; in features: a reshape
                        refused.append(name)
            assert sorted(refused) == (sorted(unfit_expected) if should_fail else []), refused


def test_a_check_that_quantized_under_half_of_the_layers_is_not_measured():
    """Under the shape rule of bitsandbytes' AVX-512 BF16 kernel (given, so on any CPU) a model with 1 key/value head
    and an MLP of 80 keeps 5 of its 7 layers in full precision: its 4-bit numbers are a mostly full-precision
    model's. The mode is "not measured", knowledge_returned is None, the table says why; 8-bit is measured."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.benchmarks import tiny_model_config

    tokenizer = build_tokenizer()
    forget = list(load_split("forget01").select_columns(["question", "answer"]))
    config = tiny_model_config(tokenizer, "qwen2", hidden_size=64, num_layers=1, num_heads=4, intermediate_size=80)
    config.num_key_value_heads = 1  # k and v: 16 x 64, out features not a multiple of 32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    result = check_quantization_robustness(model, tokenizer, forget, modes=("nf4", "int8"), avx512_bf16=True)
    nf4 = result["nf4"]
    assert quantized_and_kept(nf4) == (2, 5) and nf4["linear_layers"] == 7
    assert nf4["measured"] is False and nf4["knowledge_returned"] is None
    assert "only 2 of 7 linear layers were quantized" in nf4["not_measured"]
    assert "multiples of 32" in nf4["not_measured"]
    assert result["int8"]["measured"] is True and isinstance(result["int8"]["knowledge_returned"], bool)
    table = quantization_table(result)
    assert "| nf4 (not measured) | int8 |" in table and "Not measured in nf4: only 2 of 7" in table
    assert "No forgotten knowledge came back after int8 " in table and "after quantization" not in table
    # Nothing quantized at all: 4 bits only, every layer kept.
    nothing = check_quantization_robustness(
        tiny_model(tokenizer, "llama", hidden_size=48, num_layers=1, num_heads=2), tokenizer, forget,
        modes=("nf4",), avx512_bf16=True,
    )  # fmt: skip
    assert quantized_and_kept(nothing["nf4"]) == (0, 7) and nothing["nf4"]["measured"] is False
    table = quantization_table(nothing)
    assert "Not measured in nf4: only 0 of 7" in table and "No forgotten knowledge" not in table
