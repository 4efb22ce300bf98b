"""Turns documents into training examples no longer than the target length.

Each document `{"tokens": int32[n]}` becomes the token stream
`[EOD]? + tokens + [EOD]` (the leading EOD acts as BOS when inputs are shifted
right) and is cut into windows. With shifting, consecutive windows overlap by
one token, so every token is read as an input exactly once and predicted as a
target exactly once: long documents are split into chunks, never truncated.
Positions restart at 0 in every chunk, so no position exceeds the target
length the model was built for.

The iterator's state is the parent's state before the current document plus
the index of the next chunk, a plain JSON-able dict.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

from xlstm_data.errors import DataReadError


def document_to_examples(
    tokens: np.ndarray,
    max_target_length: int,
    shift: bool,
    shift_target: bool,
    eod_token_id: int,
) -> list[dict[str, np.ndarray]]:
    """Splits one document into `{"inputs", "targets"}` examples.

    Args:
      tokens: The document's token ids, 1-D.
      max_target_length: Longest example to produce.
      shift: Whether targets are the inputs shifted by one token.
      shift_target: Shift targets left (True) or inputs right with EOD as BOS.
      eod_token_id: End-of-document id, appended to every document.

    Returns:
      Examples whose inputs and targets have equal length `<= max_target_length`.
    """
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    eod = np.array([eod_token_id], dtype=np.int32)
    if not shift:
        stream = np.concatenate([tokens, eod])
        return [
            {"inputs": chunk, "targets": chunk}
            for chunk in (
                stream[start : start + max_target_length]
                for start in range(0, len(stream), max_target_length)
            )
        ]
    parts = [tokens, eod] if shift_target else [eod, tokens, eod]
    stream = np.concatenate(parts)
    last = len(stream) - 1  # the final token is only ever a target
    examples = []
    for start in range(0, last, max_target_length):
        stop = min(start + max_target_length, last)
        examples.append({"inputs": stream[start:stop], "targets": stream[start + 1 : stop + 1]})
    return examples


class DocumentChunkIterDataset(grain.IterDataset):
    """Splits each document of the parent into training examples."""

    def __init__(
        self,
        parent: grain.IterDataset,
        *,
        max_target_length: int,
        shift: bool = True,
        shift_target: bool = True,
        eod_token_id: int = 0,
    ):
        super().__init__(parent)
        self._max_target_length = max_target_length
        self._shift = shift
        self._shift_target = shift_target
        self._eod_token_id = eod_token_id

    def __iter__(self) -> _DocumentChunkIterator:
        return _DocumentChunkIterator(
            self._parent.__iter__(),
            max_target_length=self._max_target_length,
            shift=self._shift,
            shift_target=self._shift_target,
            eod_token_id=self._eod_token_id,
        )

    def __str__(self) -> str:
        return (
            f"DocumentChunkIterDataset(max_target_length={self._max_target_length}, "
            f"shift={self._shift}, shift_target={self._shift_target})"
        )


class _DocumentChunkIterator(grain.DatasetIterator):
    def __init__(
        self,
        parent: grain.DatasetIterator,
        *,
        max_target_length: int,
        shift: bool,
        shift_target: bool,
        eod_token_id: int,
    ):
        super().__init__(parent)
        self._max_target_length = max_target_length
        self._shift = shift
        self._shift_target = shift_target
        self._eod_token_id = eod_token_id
        self._document_state: dict[str, Any] | None = None
        self._chunks: list[dict[str, np.ndarray]] = []
        self._next_chunk = 0

    def _read_document(self) -> None:
        self._document_state = self._parent.get_state()
        document = next(self._parent)
        if not isinstance(document, dict) or "tokens" not in document:
            raise DataReadError(
                f"documents must be dicts with a 'tokens' array, got {type(document).__name__}"
                + (f" with keys {sorted(document)}" if isinstance(document, dict) else "")
                + "; check the dataset and the user operations"
            )
        self._chunks = document_to_examples(
            document["tokens"],
            self._max_target_length,
            self._shift,
            self._shift_target,
            self._eod_token_id,
        )
        self._next_chunk = 0

    def __next__(self) -> dict[str, np.ndarray]:
        while self._next_chunk >= len(self._chunks):
            self._read_document()
        chunk = self._chunks[self._next_chunk]
        self._next_chunk += 1
        return chunk

    def get_state(self) -> dict[str, Any]:
        if self._next_chunk >= len(self._chunks):
            return {"parent": self._parent.get_state(), "next_chunk": 0}
        return {"parent": self._document_state, "next_chunk": self._next_chunk}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._chunks = []
        self._next_chunk = 0
        skip = int(state["next_chunk"])
        if skip:
            self._read_document()
            self._next_chunk = skip

    def __str__(self) -> str:
        return f"DocumentChunkIterator(max_target_length={self._max_target_length})"
