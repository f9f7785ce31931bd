"""``--log-validation-samples N``: at each evaluation, N validation questions with the
model's greedy answer and the reference, so a person sees what the accuracy counts: in the
log (after the validation line) and as TensorBoard / wandb text (a Markdown table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ...data import Sample
from ...data.records import MODALITIES


@dataclass(frozen=True)
class ShownAnswer:
    """A validation sample as ``--log-validation-samples`` shows it."""

    record_id: str
    question: str  # the prompt's text, each media item's placeholder tokens as one
    answer: str  # the model's greedy answer
    reference: str

    def line(self) -> str:
        return (f"   [{self.record_id}] {self.question!r} -> {self.answer.strip()!r} "
                f"(reference {self.reference!r})")


def _placeholders(tokenizer) -> dict:
    """Media token id -> its modality's placeholder text (``<image>``)."""
    out = {}
    for name, spec in MODALITIES.items():
        try:
            out[tokenizer.media_token_id(name)] = spec.placeholder
        except KeyError:  # no such modality in this tokenizer
            pass
    return out


def shown_answer(tokenizer, sample: Sample, answer: str) -> ShownAnswer:
    """``sample``'s prompt as text, each media item's run of placeholder ids as one
    placeholder (``<image>``)."""
    tags = _placeholders(tokenizer)
    pieces, text, last = [], [], None
    for token in sample.tokens[:sample.prompt_len].tolist():  # outside the training step
        if token not in tags:
            text.append(token)
            last = None
            continue
        if last != token:
            pieces += [tokenizer.detokenize(text)] if text else []
            pieces.append(tags[token])
            text, last = [], token
    pieces += [tokenizer.detokenize(text)] if text else []
    return ShownAnswer(sample.record_id, " ".join(" ".join(pieces).split()), answer,
                       sample.answer)


def samples_text(shown: List[ShownAnswer]) -> str:
    """The samples as a Markdown table (TensorBoard renders its text as Markdown)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = [f"| {cell(s.record_id)} | {cell(s.question)} | {cell(s.answer.strip())} | "
            f"{cell(s.reference)} |" for s in shown]
    return "\n".join(["| record | question | answer | reference |", "| --- | --- | --- | --- |"]
                     + rows)


def samples_lines(shown: List[ShownAnswer], iteration: int, label: str = "") -> str:
    """The samples as the log prints them, one line each."""
    return "\n".join([f" validation samples at iteration {iteration}{label} "
                      f"(--log-validation-samples {len(shown)}): question -> answer"]
                     + [s.line() for s in shown])
