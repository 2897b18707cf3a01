import pytest
import torch
from datasets import Dataset

from hf_unlearn.benchmarks import build_tokenizer
from hf_unlearn.data import prompt_copies
from hf_unlearn.data.examples import build_qa_dataset, tokenize_prompt, tokenize_qa
from hf_unlearn.data.pairing import ForgetRetainCollator, ForgetRetainDataset, split_holdout

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def answer_text(tokenizer, example):
    answer = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
    return tokenizer.decode(answer, skip_special_tokens=True)


def test_chat_template_puts_only_the_assistant_turn_in_the_labels(tokenizer):
    chat = build_tokenizer()
    chat.chat_template = CHAT_TEMPLATE
    example = tokenize_qa(chat, "Where was Ann born?", "Ann was born in Oslo.")
    assert answer_text(chat, example).strip() == "Ann was born in Oslo."
    prompt = tokenize_prompt(chat, "Where was Ann born?")
    assert example["input_ids"][: len(prompt)] == prompt
    assert all(label == -100 for label in example["labels"][: len(prompt)])


def test_prompt_copies_marks_answer_tokens_in_a_pair_the_prompt_holds():
    """Row 0: the prompt (9, 5, 6, 7) holds the pair (5, 6), so the answer's 5 and 6 are copies; 9 is in the prompt
    alone, and (7, 5) is a pair only across the prompt's end and the answer's start, so the answer's (7, 5) is not one.
    Row 1: (3, 4) is in the prompt only across padding, and its answer repeats nothing."""
    input_ids = torch.tensor([[9, 5, 6, 7, 5, 6, 9, 7, 5], [3, 0, 4, 2, 3, 4, 1, 0, 0]])
    labels = torch.tensor([[-100] * 4 + [5, 6, 9, 7, 5], [-100, -100, -100, 2, 3, 4, 1, -100, -100]])
    attention_mask = torch.tensor([[1] * 9, [1, 0, 1, 1, 1, 1, 1, 0, 0]])
    copies = prompt_copies(input_ids, labels, attention_mask)
    assert copies.tolist() == [[False] * 4 + [True, True, False, False, False], [False] * 9]
    attention_mask[1, 1] = 1  # (3, 0) and (0, 4) are then prompt pairs, (3, 4) still is not
    assert not prompt_copies(input_ids, labels, attention_mask)[1].any()
    input_ids[1, :3] = torch.tensor([3, 4, 4])  # now (3, 4) is in the prompt: the answer's 3 and 4 are copies
    assert prompt_copies(input_ids, labels, attention_mask)[1].tolist() == [False] * 4 + [True, True] + [False] * 3


def test_build_qa_dataset_names_missing_columns_and_rejects_long_examples(tokenizer):
    data = Dataset.from_list([{"prompt": "q", "response": "a"}])
    with pytest.raises(ValueError, match="no column 'question'.*question_column"):
        build_qa_dataset(data, tokenizer)
    built = build_qa_dataset(data, tokenizer, question_column="prompt", answer_column="response")
    assert {"input_ids", "labels", "question", "answer"} <= set(built.column_names)  # renamed for evaluation
    assert built[0]["question"] == "q" and "prompt" not in built.column_names
    with pytest.raises(ValueError, match="more than max_length=3"):
        build_qa_dataset(data, tokenizer, question_column="prompt", answer_column="response", max_length=3)


def test_retain_pairing_walks_the_whole_retain_set_over_epochs():
    forget = [{"input_ids": [1], "labels": [1]} for _ in range(3)]
    retain = [{"input_ids": [100 + i], "labels": [100 + i]} for i in range(7)]
    dataset = ForgetRetainDataset(forget, retain, seed=0)
    seen = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        seen += [dataset[i]["retain"]["input_ids"][0] for i in range(3)]
    assert sorted(seen[:7]) == list(range(100, 107))  # every retain example before any repeats
    dataset.set_epoch(1)
    again = ForgetRetainDataset(forget, retain, seed=0)
    again.set_epoch(1)
    assert [again[i] for i in range(3)] == [dataset[i] for i in range(3)]  # deterministic for resume


def test_collator_pads_each_side_with_ignore_labels():
    batch = ForgetRetainCollator(pad_token_id=0)(
        [
            {"forget": {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, "retain": {"input_ids": [8], "labels": [8]}},
            {"forget": {"input_ids": [5], "labels": [5]}, "retain": {"input_ids": [9, 9], "labels": [-100, 9]}},
        ]
    )
    assert batch["forget"]["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["forget"]["labels"].tolist() == [[-100, 6, 7], [5, -100, -100]]
    assert batch["forget"]["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["retain"]["labels"].tolist() == [[8, -100], [-100, 9]]


def test_holdout_split_is_seeded_disjoint_and_refuses_tiny_sets():
    trained, held = split_holdout(20, 0.25, seed=3)
    assert len(held) == 5 and not set(trained) & set(held) and sorted(trained + held) == list(range(20))
    assert split_holdout(20, 0.25, seed=3) == (trained, held)
    with pytest.raises(ValueError, match="too few to hold out"):
        split_holdout(1, 0.1, seed=0)
