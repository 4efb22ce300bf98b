"""A per-step fingerprint of every batch, to check that a resume is exact.

Comparing the fingerprints of an interrupted-and-resumed run with those of an
uninterrupted one shows, step by step, that the data stream continued on
exactly the next batch. The fingerprint hashes the whole global batch, so it
does not depend on how many processes produced it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from xlstm_data.batch import LLM_BATCH_FIELDS


def global_numpy(array: jax.Array) -> np.ndarray:
    """The whole global array on this host (a collective on several processes)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def batch_fingerprint(batch: Any) -> str:
    """sha256 (16 hex digits) over every field's global shape, dtype and values."""
    digest = hashlib.sha256()
    for name in LLM_BATCH_FIELDS:
        values = global_numpy(getattr(batch, name))
        digest.update(f"{name}:{values.shape}:{values.dtype}".encode())
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()[:16]


class BatchLog:
    """Appends `{"step", "data_step", "fingerprint", "batch_size", "tokens", "loss"}` lines.

    Lines are flushed one by one, so a killed run leaves every finished line.
    A resumed run appends again from its checkpoint, so a step can appear
    twice; both lines must agree when the resume is exact.
    """

    def __init__(self, path: epath.PathLike, *, enabled: bool = True):
        self.path = epath.Path(path)
        self._file = self.path.open("a") if enabled else None

    def write(self, step: int, **fields: Any) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps({"step": step, **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def read_batch_log(path: epath.PathLike) -> list[dict[str, Any]]:
    """All records of a batch log, in the order written."""
    text = epath.Path(path).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def replay_check(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Compares the steps a resumed run replayed with what was logged before.

    After a pre-emption the run resumes from its last checkpoint, so the steps
    between that checkpoint and the kill are logged twice; an exact resume
    logs identical fingerprints (and losses) for them.

    The batch (fingerprint and size) must be identical. The loss may differ
    in its last bits when the run resumed on another number of devices,
    which sums in another order: up to `LOSS_RTOL` relative it is reported
    as `loss_drift`, beyond it the step is mismatched.

    Returns:
      `{"resumes": [step resumed from, ...], "replayed": n, "mismatched": [step, ...],
      "loss_drift": largest relative loss difference}`.
    """
    first: dict[int, dict[str, Any]] = {}
    resumes, replayed, mismatched, drift = [], 0, [], 0.0
    previous = 0
    for record in records:
        step = record["step"]
        if step <= previous:
            resumes.append(step - 1)
        previous = step
        if step in first:
            replayed += 1
            before = first[step]
            same_batch = all(before.get(k) == record.get(k) for k in ("fingerprint", "batch_size"))
            relative = _relative(before.get("loss"), record.get("loss"))
            drift = max(drift, relative)
            if not same_batch or relative > LOSS_RTOL:
                mismatched.append(step)
        else:
            first[step] = record
    return {"resumes": resumes, "replayed": replayed, "mismatched": mismatched, "loss_drift": drift}


#: Relative loss difference accepted on a replayed step (summation order only).
LOSS_RTOL = 1e-5


def _relative(a: Any, b: Any) -> float:
    if a == b:
        return 0.0
    if a is None or b is None:
        return float("inf")
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


if __name__ == "__main__":
    import sys

    result = replay_check(read_batch_log(epath.Path(sys.argv[1]) / "batches.jsonl"))
    for resumed_from in result["resumes"]:
        print(f"resumed from the checkpoint at step {resumed_from}")
    if result["mismatched"]:
        verdict = f"MISMATCH at {result['mismatched']}"
    elif result["loss_drift"]:
        verdict = (
            f"identical batches, losses within {result['loss_drift']:.1e} relative (another "
            "device count sums in another order)"
        )
    else:
        verdict = "all identical"
    print(f"{result['replayed']} replayed steps compared with the pre-emption run: {verdict}")
    sys.exit(1 if result["mismatched"] else 0)
