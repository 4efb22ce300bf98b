"""The batch a training step receives.

A frozen dataclass registered as a JAX pytree, so it passes through `jax.jit`,
`jax.tree.map` and sharding annotations like a dict, while its field names are
checked by Python rather than by string keys.

Besides the six fields every LLM batch has, a pipeline may add more (per-token
`loss_weights`, per-row `document_idx`, ...). They live in one dict, `extra`,
which is part of the pytree: jit, sharding and `jax.tree.map` see them like the
six, and `from_dict` / `to_dict` carry them, so an extra field is never dropped
on its way from the pipeline to the train step. They read as
`batch.extra["loss_weights"]` or, for convenience, `batch.loss_weights`.

The methods the xlstm-jax trainer calls on its `LLMBatch` (`get_document_borders`,
`get_dtype_struct`, `get_sample`, `from_inputs`, slicing) behave as there.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError

#: The six fields every LLM batch carries, in a fixed order.
LLM_BATCH_FIELDS: tuple[str, ...] = (
    "inputs",
    "targets",
    "inputs_segmentation",
    "targets_segmentation",
    "inputs_position",
    "targets_position",
)

#: Per token, the index of its dataset in the iterator's `source_names`; the
#: planned pipeline adds it to every batch, so a jitted step can take the loss
#: per dataset (`xlstm_data.loss_by_source`).
SOURCE_ID_FIELD = "source_ids"
#: `source_ids` of a padding slot: outside every dataset's index, and
#: `jax.nn.one_hot` of it is all zeros.
SOURCE_ID_PADDING = -1

#: Dataclass fields that are not batch fields of their own.
_NON_DATA_FIELDS: frozenset[str] = frozenset({"extra", "_document_borders"})


def _is_array(value: Any) -> bool:
    """Whether indexing applies to `value` (numpy or JAX arrays, tracers included)."""
    return isinstance(value, np.ndarray | jax.Array)


@functools.cache
def _batch_fields(cls: type) -> tuple[str, ...]:
    """The named batch fields of a batch class (the six, plus a subclass's own)."""
    return tuple(
        f.name for f in dataclasses.fields(cls) if f.init and f.name not in _NON_DATA_FIELDS
    )


@functools.cache
def _reserved_names(cls: type) -> frozenset[str]:
    """Names an extra field may not take: they would shadow the class's attributes."""
    return frozenset(dir(cls)) | {f.name for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class LLMBatch:
    """A batch of token sequences for causal language modelling.

    The six fields have shape `[batch, sequence]` and dtype int32. Segmentation
    ids number the documents packed into a row starting at 1; 0 marks padding, so
    a loss masked with `targets_segmentation != 0` ignores padding exactly.
    Positions restart at 0 at the start of each document (or document chunk).

    Construct with the six fields (by keyword, or positionally in the order
    below), or with `from_dict` from a mapping that may hold more fields.

    Attributes:
      inputs: Token ids the model reads.
      targets: Token ids the model predicts at each position.
      inputs_segmentation: Document id of each input token, 0 for padding.
      targets_segmentation: Document id of each target token, 0 for padding.
      inputs_position: Position of each input token within its document.
      targets_position: Position of each target token within its document.
      extra: Further fields by name (keyword-only), e.g. `{"loss_weights": w}`;
        part of the pytree. Each is also readable as an attribute
        (`batch.loss_weights`), so names may not shadow the class's own
        attributes (`inputs`, `shape`, `to_dict`, ...).
      _document_borders: Keyword-only override of `get_document_borders`, set by
        slicing along the sequence so a slice keeps the borders of the whole row
        (as in xlstm-jax). Leave it None otherwise.
    """

    inputs: Any
    targets: Any
    inputs_segmentation: Any
    targets_segmentation: Any
    inputs_position: Any
    targets_position: Any
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, kw_only=True)
    _document_borders: Any = dataclasses.field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        """Checks the extra field names and keeps a copy of the dict.

        Runs on every pytree unflatten too, so it looks at names only, never at
        values (which may be tracers, specs or placeholders there).
        """
        extra = self.extra
        if not isinstance(extra, Mapping):
            raise DataConfigError(
                f"extra={extra!r} (type {type(extra).__name__}) must be a mapping from field "
                "name to array, e.g. {'loss_weights': weights}"
            )
        reserved = _reserved_names(type(self))
        for name in extra:
            if not isinstance(name, str) or not name.isidentifier() or name in reserved:
                raise DataConfigError(
                    f"extra field name {name!r} is invalid: extra field names must be Python "
                    f"identifiers that are not already attributes of {type(self).__name__} "
                    f"(such as {sorted(_batch_fields(type(self)))} or 'shape'); rename it, "
                    "e.g. 'loss_weights'"
                )
        object.__setattr__(self, "extra", dict(extra))

    def __getattr__(self, name: str) -> Any:
        """Reads an extra field as an attribute (only reached for unknown names)."""
        extra = self.__dict__.get("extra")
        if extra is not None and name in extra:
            return extra[name]
        known = list(_batch_fields(type(self))) + sorted(extra or ())
        raise AttributeError(f"{type(self).__name__} has no field {name!r}; its fields are {known}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LLMBatch:
        """Builds a batch from a mapping of fields, keeping every field.

        Args:
          data: The six fields (and any a subclass declares), plus any further
            fields, which go to `extra`.

        Returns:
          The batch; `to_dict()` gives `data` back.
        """
        names = _batch_fields(cls)
        missing = [name for name in names if name not in data]
        if missing:
            raise DataConfigError(
                f"{cls.__name__}.from_dict: the mapping lacks the fields {missing} (it has "
                f"{sorted(data)}); a batch needs all of {list(names)}"
            )
        extra = {key: value for key, value in data.items() if key not in names}
        return cls(**{name: data[name] for name in names}, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """Returns every field as a plain dict: the six, then the extra fields."""
        fields = {name: getattr(self, name) for name in _batch_fields(type(self))}
        return {**fields, **self.extra}

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the token arrays: `(batch, sequence)`."""
        return tuple(self.inputs.shape)

    # Read-only mapping of the fields, for loops written for dict batches --------

    def keys(self) -> KeysView[str]:
        """The field names: the six, then the extra fields (as `to_dict`)."""
        return self.to_dict().keys()

    def values(self) -> ValuesView[Any]:
        return self.to_dict().values()

    def items(self) -> ItemsView[str, Any]:
        return self.to_dict().items()

    def get(self, name: str, default: Any = None) -> Any:
        """A field by name (`batch.get("inputs")`), or `default` if there is none."""
        return self.to_dict().get(name, default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        """The field names, as a dict batch iterates (`dict(batch)`, `**batch`)."""
        return iter(self.keys())

    def __len__(self) -> int:
        """The number of fields (a `Mapping`'s length; the batch size is `shape[0]`)."""
        return len(self.to_dict())

    def __getitem__(self, key: Any) -> Any:
        """A field by name (`batch["inputs"]`), or every array field indexed at once.

        A string key reads a field, as in a dict batch; a missing one raises
        `KeyError`. Any other key indexes every array field at once, as
        xlstm-jax's batches do.

        `batch[i:j]` keeps rows `i..j-1` of every field (extras included);
        `batch[:, a:b]` also slices the sequence. A tuple key is cut to each
        field's number of dimensions, so per-row extras (shape `[batch]`) are
        indexed by its first entry only. When a key reaches past the batch axis,
        the document borders of the whole rows are computed first and sliced
        along, so a slice that starts inside a document does not report a border
        there. Fields that are not arrays (specs, None) are kept as they are.

        Args:
          key: Any numpy/JAX index: an int, a slice, an index array, or a tuple.

        Returns:
          A batch of the same class with every array field indexed.
        """

        if isinstance(key, str):
            fields = self.to_dict()
            if key not in fields:
                raise KeyError(
                    f"{type(self).__name__} has no field {key!r}; its fields are {list(fields)}"
                )
            return fields[key]

        def index(value: Any) -> Any:
            if not _is_array(value):
                return value
            if isinstance(key, tuple):
                return value[key[: value.ndim]]
            return value[key]

        borders = self._document_borders
        reaches_sequence = isinstance(key, tuple) and len(key) > 1
        if borders is None and reaches_sequence and _is_array(self.targets_segmentation):
            borders = self.get_document_borders()
        fields = {name: index(getattr(self, name)) for name in _batch_fields(type(self))}
        extra = {name: index(value) for name, value in self.extra.items()}
        return type(self)(**fields, extra=extra, _document_borders=index(borders))

    def get_document_borders(self) -> Any:
        """Marks the tokens where a new document starts, as xlstm-jax defines it.

        A token is a border if the target token before it has a different target
        segmentation; the first token of a row always is. Segmentation
        `[1, 1, 2, 2, 2, 3]` gives `[T, F, T, F, F, T]`. A recurrent model resets
        its state at the borders. The step from a document into trailing padding
        (segmentation 0) is a border too.

        Returns:
          A bool array shaped like `targets_segmentation`: numpy for numpy
          fields, a JAX array otherwise (also inside `jax.jit`).
        """
        if self._document_borders is not None:
            return self._document_borders
        segmentation = self.targets_segmentation
        xp = np if isinstance(segmentation, np.ndarray) else jnp
        changed = segmentation[..., 1:] != segmentation[..., :-1]
        first = xp.ones((*segmentation.shape[:-1], 1), dtype=bool)
        return xp.concatenate([first, changed], axis=-1)

    @classmethod
    def get_dtype_struct(
        cls, batch_size: int, max_length: int, *, sharding: Any = None
    ) -> LLMBatch:
        """The batch's shapes and dtypes, for ahead-of-time tracing and compilation.

        Args:
          batch_size: Rows of the (global) batch.
          max_length: Tokens per row (`max_target_length`).
          sharding: Optional sharding to put on every field, e.g.
            `xlstm_data.data_sharding(mesh)`.

        Returns:
          A batch whose six fields are `jax.ShapeDtypeStruct((batch_size,
          max_length), int32)`; no extra fields.
        """
        check_int("batch_size", batch_size, 1)
        check_int("max_length", max_length, 1)
        struct = jax.ShapeDtypeStruct((batch_size, max_length), jnp.int32, sharding=sharding)
        return cls(**dict.fromkeys(LLM_BATCH_FIELDS, struct))

    @classmethod
    def get_sample(cls, batch_size: int, max_length: int) -> LLMBatch:
        """A concrete all-zero batch, for compiling code that needs real values.

        As in xlstm-jax (e.g. to compile around `jax.debug` calls). Every token's
        segmentation is 0, so the whole sample reads as padding to a masked loss.

        Args:
          batch_size: Rows of the batch.
          max_length: Tokens per row.

        Returns:
          A batch of int32 zeros of shape `(batch_size, max_length)`.
        """
        return jax.tree.map(
            lambda s: jnp.zeros(s.shape, s.dtype), cls.get_dtype_struct(batch_size, max_length)
        )

    @classmethod
    def from_inputs(cls, inputs: Any, targets: Any | None = None) -> LLMBatch:
        """A batch of one whole document per row, from token ids alone (tests, demos).

        Args:
          inputs: Token ids `[batch, sequence]`.
          targets: Target ids of the same shape. If None, the targets are `inputs`
            and the inputs are `inputs` shifted right by one, starting with 0.

        Returns:
          A batch with segmentation 1 everywhere and positions `0..sequence-1`.
        """
        inputs = np.asarray(inputs) if not _is_array(inputs) else inputs
        if inputs.ndim != 2:
            raise DataConfigError(
                f"inputs of shape {tuple(inputs.shape)} must have 2 dimensions [batch, sequence]"
            )
        if targets is None:
            xp = np if isinstance(inputs, np.ndarray) else jnp
            targets = inputs
            inputs = xp.pad(inputs[:, :-1], ((0, 0), (1, 0)))
        elif tuple(targets.shape) != tuple(inputs.shape):
            raise DataConfigError(
                f"targets of shape {tuple(targets.shape)} must have the shape of inputs "
                f"{tuple(inputs.shape)}"
            )
        position = jnp.broadcast_to(jnp.arange(inputs.shape[1], dtype=jnp.int32), inputs.shape)
        segmentation = jnp.ones(inputs.shape, dtype=jnp.int32)
        return cls(
            inputs=inputs,
            targets=targets,
            inputs_segmentation=segmentation,
            targets_segmentation=segmentation,
            inputs_position=position,
            targets_position=position,
        )


jax.tree_util.register_dataclass(
    LLMBatch, data_fields=[*LLM_BATCH_FIELDS, "extra", "_document_borders"], meta_fields=[]
)
#: A read-only mapping of its fields (`isinstance(batch, Mapping)`); still a dataclass pytree.
Mapping.register(LLMBatch)
