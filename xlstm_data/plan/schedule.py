"""Batch-size ramp-up schedules: which global and per-host batch size applies at each step.

Large-batch training often starts with a fraction of the final batch size and grows it
in a few stages. This module turns a user's ramp-up config (``{step: factor}``) into a
validated, picklable schedule, in the style of an optax schedule: pure frozen
dataclasses, queried by step.

Semantics (those of xlstm-jax's ``batch_rampup_factors``): a schedule is a set of step
boundaries, each with a factor of the base global batch size (``global_batch_size``,
the batch the ramp-up starts from). Factors are not cumulative: at step ``s`` the factor
of the largest boundary ``<= s`` applies, so the stage batch is
``global_batch_size * factor``. Any finite factor > 0 is accepted: factors below 1
shrink the base batch (``{0: 0.25, 1000: 1.0}`` ramps up to the base batch), factors
above 1 grow it (``{0: 1.0, 1000: 2.0}`` ramps up to twice the base batch, as
xlstm-jax configs do). Boundary 0 must be present. No ramp-up is the schedule
``{0: 1.0}``.

Unlike the reference, which truncates ``int(global_batch_size * factor)``, a stage batch
must come out as a whole number exactly, so a factor never silently loses rows.

Batch sizes only change at stage boundaries, so a jitted train step sees one batch
shape per stage and compiles once per stage: the number of distinct shapes equals the
number of stages (adjacent stages with the same factor are merged). Every stage is
validated when a `BatchSizeSchedule` is built, before any data is read, so a stage
whose batch does not split over the data-parallel devices fails at launch rather than
hours into a run.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import numbers
import operator
import re
from collections.abc import Mapping
from typing import Any

import ml_collections

from xlstm_data.errors import DataConfigError

__all__ = [
    "BatchSizeSchedule",
    "RampupSchedule",
    "Stage",
    "parse_rampup",
]

DEFAULT_KEY = "data.rampup"
_INT_STRING = re.compile(r"[+-]?\d+")
_TOLERANCE = 1e-9
_VALID_STEPS = "steps must be integers >= 0 (ints, or strings of ints such as '100')"
_VALID_FACTORS = (
    "factors must be finite numbers > 0 that scale global_batch_size (0.5 halves it, "
    "2.0 doubles it)"
)
_VALID_FORMS = (
    "a mapping {step: factor} such as {0: 0.25, 1000: 0.5, 5000: 1.0}, a list of "
    "[step, factor] pairs such as [[0, 0.25], [1000, 0.5]], or None / {} / [] for no ramp-up"
)


def _parse_step(raw: Any, key: str, entry: str) -> int:
    """Converts one step of a ramp-up config to an int.

    Args:
      raw: The step as given (int, or a string of an int after a JSON round trip).
      key: Config key named in errors.
      entry: How the offending entry is shown in errors.

    Returns:
      The step as a non-negative int.
    """
    if isinstance(raw, bool):
        step = None
    elif isinstance(raw, numbers.Integral):
        step = int(raw)
    elif isinstance(raw, str) and _INT_STRING.fullmatch(raw.strip()):
        step = int(raw.strip())
    else:
        step = None
    if step is None:
        raise DataConfigError(
            f"{key}: step {raw!r} (type {type(raw).__name__}) in entry {entry} is not an "
            f"integer; {_VALID_STEPS}"
        )
    if step < 0:
        raise DataConfigError(f"{key}: step {raw!r} in entry {entry} is negative; {_VALID_STEPS}")
    return step


def _parse_factor(raw: Any, key: str, entry: str) -> float:
    """Converts one factor of a ramp-up config to a float.

    Args:
      raw: The factor as given.
      key: Config key named in errors.
      entry: How the offending entry is shown in errors.

    Returns:
      The factor as a finite float > 0.
    """
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
        raise DataConfigError(
            f"{key}: factor {raw!r} (type {type(raw).__name__}) in entry {entry} is not a "
            f"number; {_VALID_FACTORS}"
        )
    factor = float(raw)
    if not (math.isfinite(factor) and factor > 0.0):
        raise DataConfigError(
            f"{key}: factor {raw!r} in entry {entry} is out of range; {_VALID_FACTORS}"
        )
    return factor


def _check_step_arg(step: Any, what: str = "step") -> int:
    """Validates a step passed to a schedule query.

    Args:
      step: The step (int, numpy integer, or anything with ``__index__``).
      what: Argument name used in errors.

    Returns:
      The step as a non-negative int.
    """
    if isinstance(step, bool):
        raise DataConfigError(f"{what}={step!r} must be an int >= 0, not a bool")
    try:
        value = operator.index(step)
    except TypeError:
        raise DataConfigError(
            f"{what}={step!r} (type {type(step).__name__}) must be an int >= 0"
        ) from None
    if value < 0:
        raise DataConfigError(f"{what}={step!r} is negative; it must be an int >= 0")
    return value


@dataclasses.dataclass(frozen=True)
class RampupSchedule:
    """Batch-size factors by step: the factor of the largest boundary <= step applies.

    Build one with `parse_rampup`. Construction validates and canonicalizes: inputs are
    converted to tuples of int / float, and a boundary whose factor equals the previous
    boundary's is dropped, so equal schedules compare equal.

    Attributes:
      boundaries: Strictly increasing steps, the first being 0.
      factors: Multiple of the base global batch size from each boundary on, each a
        finite float > 0 (below 1 shrinks the base batch, above 1 grows it).
    """

    boundaries: tuple[int, ...]
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        """Validates the boundaries and factors and merges redundant boundaries."""
        name = type(self).__name__
        boundaries = tuple(self.boundaries)
        factors = tuple(self.factors)
        if len(boundaries) != len(factors) or not boundaries:
            raise DataConfigError(
                f"{name}: boundaries {boundaries!r} and factors {factors!r} must be non-empty "
                "and of equal length"
            )
        steps = [_parse_step(b, name, f"boundaries={boundaries!r}") for b in boundaries]
        values = [_parse_factor(f, name, f"factors={factors!r}") for f in factors]
        if steps[0] != 0 or any(a >= b for a, b in zip(steps, steps[1:], strict=False)):
            raise DataConfigError(
                f"{name}: boundaries {boundaries!r} must be strictly increasing and start at 0"
            )
        merged_steps, merged_values = [steps[0]], [values[0]]
        for step, value in zip(steps[1:], values[1:], strict=True):
            if value != merged_values[-1]:
                merged_steps.append(step)
                merged_values.append(value)
        object.__setattr__(self, "boundaries", tuple(merged_steps))
        object.__setattr__(self, "factors", tuple(merged_values))

    def factor_at(self, step: int) -> float:
        """Returns the factor in force at a step.

        Args:
          step: Training step, an int >= 0.

        Returns:
          The factor of the largest boundary <= step.
        """
        step = _check_step_arg(step)
        return self.factors[bisect.bisect_right(self.boundaries, step) - 1]

    def to_pairs(self) -> list[list]:
        """Returns the schedule as JSON-friendly ``[[step, factor], ...]``.

        Returns:
          A list of ``[int, float]`` pairs sorted by step; `parse_rampup` accepts it.
        """
        return [[step, factor] for step, factor in zip(self.boundaries, self.factors, strict=True)]

    @property
    def is_constant(self) -> bool:
        """True when there is no ramp-up: the factor is 1.0 at every step."""
        return self.factors == (1.0,)


def parse_rampup(value: Any, key: str = DEFAULT_KEY) -> RampupSchedule:
    """Parses a ramp-up config into a `RampupSchedule`.

    Args:
      value: None, an empty mapping or an empty list (no ramp-up); a mapping (dict,
        `ml_collections.ConfigDict`, ...) from step to factor, whose steps are ints or
        strings of ints (as after a JSON round trip); a list or tuple of ``[step, factor]``
        pairs; or a `RampupSchedule`, returned as is.
      key: Config key named in error messages.

    Returns:
      The validated schedule, sorted by step.

    Raises:
      DataConfigError: if a step is not an integer >= 0, steps repeat, a factor is not a
        finite number > 0, step 0 is missing, a pair is not of length 2, or `value` has
        another type.
    """
    if isinstance(value, RampupSchedule):
        return value
    if value is None:
        return RampupSchedule((0,), (1.0,))
    raw_items: list[tuple[Any, Any, str]] = []
    if isinstance(value, Mapping | ml_collections.ConfigDict):
        for raw_step, raw_factor in value.items():
            raw_items.append((raw_step, raw_factor, f"{{{raw_step!r}: {raw_factor!r}}}"))
    elif isinstance(value, list | tuple):
        for index, pair in enumerate(value):
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise DataConfigError(
                    f"{key}[{index}] = {pair!r} is not a [step, factor] pair of length 2; "
                    f"{key} must be {_VALID_FORMS}"
                )
            raw_items.append((pair[0], pair[1], f"{key}[{index}] = {list(pair)!r}"))
    else:
        raise DataConfigError(
            f"{key} = {value!r} has unsupported type {type(value).__name__}; "
            f"it must be {_VALID_FORMS}"
        )
    if not raw_items:
        return RampupSchedule((0,), (1.0,))

    by_step: dict[int, tuple[float, str]] = {}
    for raw_step, raw_factor, entry in raw_items:
        step = _parse_step(raw_step, key, entry)
        factor = _parse_factor(raw_factor, key, entry)
        if step in by_step:
            raise DataConfigError(
                f"{key}: step {raw_step!r} in entry {entry} repeats step {step} of entry "
                f"{by_step[step][1]} (note '10' and 10 are the same step); each step may "
                "appear once"
            )
        by_step[step] = (factor, entry)
    if 0 not in by_step:
        first = min(by_step)
        raise DataConfigError(
            f"{key} = {value!r} has no entry for step 0 (its first step is {first}); the "
            "factor before the first boundary would be undefined. Add step 0, e.g. "
            f"{{0: <factor>, {first}: {by_step[first][0]!r}, ...}}, using 1.0 for no ramp-up"
        )
    steps = sorted(by_step)
    return RampupSchedule(tuple(steps), tuple(by_step[step][0] for step in steps))


@dataclasses.dataclass(frozen=True)
class Stage:
    """A run of steps with one batch size.

    Attributes:
      start_step: First step of the stage.
      end_step: Exclusive end step, or None for the last stage (runs forever).
      factor: Multiple of the base global batch size (may exceed 1).
      global_batch_size: Rows per step over all hosts.
      host_batch_size: Rows per step each data-loading host loads.
    """

    start_step: int
    end_step: int | None
    factor: float
    global_batch_size: int
    host_batch_size: int


def _valid_factor_hint(global_batch_size: int, data_parallel_size: int, stage_batch: float) -> str:
    """Describes the factors nearest a bad one that give a valid stage batch.

    A valid stage batch is any positive multiple of the data-parallel size, so the
    valid factors are the multiples of ``data_parallel_size / global_batch_size``;
    they may exceed 1 (a stage larger than the base batch).

    Args:
      global_batch_size: Base global batch size.
      data_parallel_size: Every stage batch must be a positive multiple of this.
      stage_batch: The (possibly fractional) stage batch the bad factor gives.

    Returns:
      A sentence naming the nearest valid factors.
    """
    below = max(
        math.floor(stage_batch / data_parallel_size) * data_parallel_size, data_parallel_size
    )
    candidates = {below, below + data_parallel_size} if below < stage_batch else {below}
    shown = ", ".join(
        f"{batch / global_batch_size!r} (= {batch}/{global_batch_size})"
        for batch in sorted(candidates)
    )
    return (
        f"valid factors are the multiples of {data_parallel_size}/{global_batch_size} "
        f"(stage batches that are multiples of {data_parallel_size}); nearest: {shown}"
    )


@dataclasses.dataclass(frozen=True)
class BatchSizeSchedule:
    """Global and per-host batch size by step, validated for every stage up front.

    Calling the schedule with a step returns the host batch size, so an instance can be
    passed (and pickled) as the batch-size function of a batching transformation.

    Attributes:
      global_batch_size: Base global batch size (rows per step over all hosts at factor
        1); each stage's factor scales it, and may be above 1.
      rampup: The ramp-up factors. A raw config (mapping, list of pairs, None) is also
        accepted and parsed with `parse_rampup`.
      data_parallel_size: Number of batch shards on the mesh; every stage batch must be a
        multiple of it.
      host_count: Number of data-loading hosts; must divide `data_parallel_size`.
      key: Config key named in error messages.
    """

    global_batch_size: int
    rampup: RampupSchedule
    data_parallel_size: int = 1
    host_count: int = 1
    key: str = DEFAULT_KEY
    _starts: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _factors: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _batches: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validates the sizes and every stage of the ramp-up before any data is read."""
        key = self.key
        object.__setattr__(self, "rampup", parse_rampup(self.rampup, key))
        for name in ("global_batch_size", "data_parallel_size", "host_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise DataConfigError(f"{name}={value!r} (for {key}) must be an int >= 1")
            object.__setattr__(self, name, int(value))
        dp, hosts, base = self.data_parallel_size, self.host_count, self.global_batch_size
        if dp % hosts:
            raise DataConfigError(
                f"data_parallel_size={dp} (for {key}) must be a multiple of host_count="
                f"{hosts}; each data-loading host holds the same number of batch shards"
            )
        starts: list[int] = []
        factors: list[float] = []
        batches: list[int] = []
        for step, factor in zip(self.rampup.boundaries, self.rampup.factors, strict=True):
            exact = base * factor
            if not math.isfinite(exact):
                raise DataConfigError(
                    f"{key}: stage at step {step} has factor {factor!r}, giving a stage batch "
                    f"of global_batch_size {base} * {factor!r}, which overflows; "
                    f"{_VALID_FACTORS}, with stage batches that are multiples of {dp}"
                )
            batch = round(exact)
            if abs(exact - batch) > _TOLERANCE * max(1.0, exact) or batch < 1:
                raise DataConfigError(
                    f"{key}: stage at step {step} has factor {factor!r}, giving a stage batch "
                    f"of global_batch_size {base} * {factor!r} = {exact!r}, which is not a "
                    f"whole number >= 1 (data-parallel size {dp}); "
                    + _valid_factor_hint(base, dp, exact)
                )
            if batch % dp:
                raise DataConfigError(
                    f"{key}: stage at step {step} has factor {factor!r}, giving a stage batch "
                    f"of global_batch_size {base} * {factor!r} = {batch}, which is not "
                    f"divisible by the data-parallel size {dp} (host_count {hosts}); "
                    + _valid_factor_hint(base, dp, exact)
                )
            if batches and batches[-1] == batch:
                continue
            starts.append(step)
            factors.append(factor)
            batches.append(batch)
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "_factors", tuple(factors))
        object.__setattr__(self, "_batches", tuple(batches))

    def _stage_index(self, step: int) -> int:
        """Returns the index of the stage holding a validated step."""
        return bisect.bisect_right(self._starts, step) - 1

    def global_batch_size_at(self, step: int) -> int:
        """Returns the global batch size at a step.

        Args:
          step: Training step, an int >= 0.

        Returns:
          Rows per step over all hosts.
        """
        return self._batches[self._stage_index(_check_step_arg(step))]

    def host_batch_size_at(self, step: int) -> int:
        """Returns the batch size one data-loading host loads at a step.

        Args:
          step: Training step, an int >= 0.

        Returns:
          ``global_batch_size_at(step) // host_count``.
        """
        return self.global_batch_size_at(step) // self.host_count

    def __call__(self, step: int) -> int:
        """Returns the host batch size at a step (batch-size-function protocol).

        Args:
          step: Training step, an int >= 0.

        Returns:
          ``host_batch_size_at(step)``.
        """
        return self.host_batch_size_at(step)

    def examples_seen(self, step: int) -> int:
        """Returns the global examples consumed by steps ``[0, step)``.

        Args:
          step: Training step, an int >= 0.

        Returns:
          Sum of the global batch sizes of all steps before `step` (closed form per stage).
        """
        step = _check_step_arg(step)
        total = 0
        ends = self._starts[1:] + (None,)
        for start, end, batch in zip(self._starts, ends, self._batches, strict=True):
            if step <= start:
                break
            stop = step if end is None else min(step, end)
            total += batch * (stop - start)
        return total

    def step_for_examples(self, examples: int) -> int:
        """Returns the smallest step whose `examples_seen` is >= `examples`.

        Args:
          examples: Number of global examples, an int >= 0 (e.g. the size of an epoch).

        Returns:
          The number of steps needed to consume at least `examples` examples.
        """
        examples = _check_step_arg(examples, "examples")
        seen = 0
        ends = self._starts[1:] + (None,)
        for start, end, batch in zip(self._starts, ends, self._batches, strict=True):
            if end is None or seen + batch * (end - start) >= examples:
                return start + max(0, -(-(examples - seen) // batch))
            seen += batch * (end - start)
        raise AssertionError("unreachable: the last stage has no end")

    def stages(self) -> list[Stage]:
        """Returns the stages, one per distinct batch size.

        Returns:
          The stages in step order; the last has ``end_step=None``.
        """
        ends = self._starts[1:] + (None,)
        return [
            Stage(
                start_step=start,
                end_step=end,
                factor=factor,
                global_batch_size=batch,
                host_batch_size=batch // self.host_count,
            )
            for start, end, factor, batch in zip(
                self._starts, ends, self._factors, self._batches, strict=True
            )
        ]

    def next_boundary(self, step: int) -> int | None:
        """Returns the next step after `step` where the batch size changes.

        Args:
          step: Training step, an int >= 0.

        Returns:
          The start of the next stage, or None when `step` is in the last stage.
        """
        index = self._stage_index(_check_step_arg(step)) + 1
        return self._starts[index] if index < len(self._starts) else None
