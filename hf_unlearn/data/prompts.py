"""How a question and its answer become the text a model reads: one prompt format for training data and evaluation.

Unlearning only works on the format the model learned its facts in, so the format is chosen once and every
tokenization (training examples, greedy answers, answer probabilities, truth ratios, the bound) goes through
:func:`prompt_and_completion`:

* ``None`` (default): the tokenizer's chat template when it has one (question = user turn, answer = assistant
  turn), otherwise :data:`PLAIN_PROMPT_TEMPLATE`;
* ``"chat"``: the chat template, and an error if the tokenizer has none;
* ``"plain"``: :data:`PLAIN_PROMPT_TEMPLATE` even when the tokenizer has a chat template;
* a format string with ``{question}`` and optionally ``{answer}``, e.g. ``"### Q: {question}\\n### A: {answer}"``.
  The prompt is the text before ``{answer}`` (its trailing spaces go to the answer, so the answer's first word
  is tokenized as it was in fine-tuning); without ``{answer}`` the answer follows the prompt after one space.
"""

from __future__ import annotations

from typing import Any

PLAIN_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"
PROMPT_FORMATS = ("chat", "plain")


def check_prompt_template(template: str | None) -> None:
    """Refuse a template that cannot be filled with a question (and an answer), naming what is wrong."""
    if template is None or template in PROMPT_FORMATS:
        return
    if not isinstance(template, str) or "{question}" not in template:
        raise ValueError(
            f"prompt_template must be 'chat', 'plain' or a format string containing '{{question}}' (and optionally "
            f"'{{answer}}'), got {template!r}."
        )
    try:
        template.format(question="", answer="")
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(
            f"prompt_template {template!r} cannot be filled: {type(error).__name__}: {error}. Only {{question}} and "
            "{answer} are placeholders; write a literal brace as {{ or }}."
        ) from error


def uses_chat_template(tokenizer: Any, template: str | None = None) -> bool:
    """Whether ``template`` resolves to the tokenizer's chat template (see the module docstring)."""
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" and not has_chat:
        raise ValueError(
            "prompt_template='chat' but the tokenizer has no chat_template. Use the format the model was "
            "fine-tuned with: 'plain' or a format string such as 'Q: {question}\\nA: {answer}'."
        )
    return has_chat if template is None else template == "chat"


def describe_prompt_format(tokenizer: Any, template: str | None = None) -> str:
    """One line for the run record and the model card: which format the examples were tokenized in."""
    if uses_chat_template(tokenizer, template):
        return "the tokenizer's chat template (question as the user turn, answer as the assistant turn)"
    text = _format_string(template)
    return repr(text if "{answer}" in text else text + " {answer}")


def _format_string(template: str | None) -> str:
    return PLAIN_PROMPT_TEMPLATE if template in (None, "plain") else template


def prompt_and_completion(tokenizer: Any, question: str, answer: str, template: str | None = None) -> tuple[str, str]:
    """The prompt text and the completion text of one QA pair in the format ``template`` resolves to.

    With the chat template the completion is whatever the template appends for the assistant, end-of-turn tokens
    included. The EOS token is appended by :func:`hf_unlearn.data.tokenize_qa`.
    """
    if uses_chat_template(tokenizer, template):
        user = [{"role": "user", "content": question}]
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": answer}], tokenize=False)
        if full.startswith(prompt):
            return prompt, full[len(prompt) :]
        return prompt, answer
    check_prompt_template(template)
    text = _format_string(template)
    if "{answer}" not in text:
        return text.format(question=question), " " + answer
    head, _, tail = text.partition("{answer}")
    filled = head.format(question=question)
    prompt = filled.rstrip(" ")
    return prompt, filled[len(prompt) :] + answer + tail.format(question=question)


__all__ = [
    "PLAIN_PROMPT_TEMPLATE",
    "PROMPT_FORMATS",
    "check_prompt_template",
    "describe_prompt_format",
    "prompt_and_completion",
    "uses_chat_template",
]
