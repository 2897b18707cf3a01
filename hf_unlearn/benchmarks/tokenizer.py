"""The byte-level BPE tokenizer the embedded benchmarks and the TOFU miniature train on their own text: the
tiny models learned from scratch need a vocabulary of their corpus, not a pretrained one."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"

__all__ = ["BOS_TOKEN", "EOS_TOKEN", "PAD_TOKEN", "UNK_TOKEN", "train_bpe_tokenizer"]


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, wrapped as a ``PreTrainedTokenizerFast`` with the
    special tokens every embedded benchmark's tokenizer has (:func:`~hf_unlearn.benchmarks.build_tokenizer`, the
    chronicles', the TOFU miniature's)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        add_bos_token=True,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
