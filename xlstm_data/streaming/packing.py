"""Lays examples out in fixed-length rows: first-fit packing or padding.

Both paths produce the same six fields as `LLMBatch` (segmentation 0 marks
padding, positions restart at each document), so everything downstream is
indifferent to how rows were filled. Packing uses grain's public
`FirstFitPackIterDataset`; its feature names are renamed to ours.
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from xlstm_data.streaming.row_map import RowMapIterDataset

_SEQUENCE_FEATURES = ("inputs", "targets")


@dataclasses.dataclass(frozen=True)
class _RenamePackedFeatures:
    """Maps grain's `<f>_segment_ids` / `<f>_positions` to our field names."""

    def __call__(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for feature in _SEQUENCE_FEATURES:
            out[feature] = np.asarray(element[feature], dtype=np.int32)
            out[f"{feature}_segmentation"] = np.asarray(
                element[f"{feature}_segment_ids"], dtype=np.int32
            )
            out[f"{feature}_position"] = np.asarray(element[f"{feature}_positions"], dtype=np.int32)
        return out


@dataclasses.dataclass(frozen=True)
class _PadExample:
    """Adds segmentation and positions to one example, optionally padding it."""

    length: int | None

    def __call__(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for feature in _SEQUENCE_FEATURES:
            tokens = np.asarray(element[feature], dtype=np.int32)
            n = len(tokens)
            width = n if self.length is None else self.length
            values = np.zeros(width, dtype=np.int32)
            values[:n] = tokens
            segmentation = np.zeros(width, dtype=np.int32)
            segmentation[:n] = 1
            position = np.zeros(width, dtype=np.int32)
            position[:n] = np.arange(n, dtype=np.int32)
            out[feature] = values
            out[f"{feature}_segmentation"] = segmentation
            out[f"{feature}_position"] = position
        return out


def pack_examples(
    dataset: grain.IterDataset,
    max_target_length: int,
    num_packing_bins: int,
    seed: int,
    *,
    shuffle: bool = True,
) -> grain.IterDataset:
    """Packs examples into rows of `max_target_length` tokens, first fit.

    Args:
      dataset: Examples `{"inputs", "targets"}` no longer than the row.
      max_target_length: Row length.
      num_packing_bins: Rows kept open at once; more bins, less padding.
      seed: Seed of grain's bin shuffling.
      shuffle: Shuffle the rows closed together (grain's `shuffle_bins`).
        Without it rows come out in packing order, so an unshuffled pipeline
        (eval, debugging) sees its documents in source order.

    Returns:
      Rows with the six `LLMBatch` fields.
    """
    packed = grain.experimental.FirstFitPackIterDataset(
        dataset,
        length_struct={feature: max_target_length for feature in _SEQUENCE_FEATURES},
        num_packing_bins=num_packing_bins,
        seed=seed,
        shuffle_bins=shuffle,
    )
    return RowMapIterDataset(packed, _RenamePackedFeatures())


def pad_examples(dataset: grain.IterDataset, max_target_length: int | None) -> grain.IterDataset:
    """One example per row, padded to `max_target_length` (or left ragged if None)."""
    return RowMapIterDataset(dataset, _PadExample(max_target_length))
