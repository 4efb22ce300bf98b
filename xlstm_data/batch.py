"""The batch a training step receives.

A frozen dataclass registered as a JAX pytree, so it passes through `jax.jit`,
`jax.tree.map` and sharding annotations like a dict, while its field names are
checked by Python rather than by string keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

#: The six fields every LLM batch carries, in a fixed order.
LLM_BATCH_FIELDS: tuple[str, ...] = (
    "inputs",
    "targets",
    "inputs_segmentation",
    "targets_segmentation",
    "inputs_position",
    "targets_position",
)

#: Suffixes of the fields that mark padding; they are always padded with 0.
MASK_FIELD_SUFFIXES: tuple[str, ...] = ("_segmentation", "_position")


def padding_value(field: str, pad_value: int | float = 0) -> int | float:
    """The value a padded slot of `field` gets.

    Segmentation and position fields get 0, so padding reads as padding to a
    masked loss whatever `pad_value` the token fields use.
    """
    return 0 if field.endswith(MASK_FIELD_SUFFIXES) else pad_value


@dataclasses.dataclass(frozen=True)
class LLMBatch:
    """A batch of token sequences for causal language modelling.

    All fields have shape `[batch, sequence]` and dtype int32. Segmentation ids
    number the documents packed into a row starting at 1; 0 marks padding, so a
    loss masked with `targets_segmentation != 0` ignores padding exactly.
    Positions restart at 0 at the start of each document (or document chunk).

    Attributes:
      inputs: Token ids the model reads.
      targets: Token ids the model predicts at each position.
      inputs_segmentation: Document id of each input token, 0 for padding.
      targets_segmentation: Document id of each target token, 0 for padding.
      inputs_position: Position of each input token within its document.
      targets_position: Position of each target token within its document.
    """

    inputs: Any
    targets: Any
    inputs_segmentation: Any
    targets_segmentation: Any
    inputs_position: Any
    targets_position: Any

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMBatch:
        """Builds a batch from a mapping holding (at least) the six fields."""
        return cls(**{name: data[name] for name in LLM_BATCH_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a plain dict."""
        return {name: getattr(self, name) for name in LLM_BATCH_FIELDS}

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the token arrays: `(batch, sequence)`."""
        return tuple(self.inputs.shape)


jax.tree_util.register_dataclass(LLMBatch, data_fields=list(LLM_BATCH_FIELDS), meta_fields=[])
