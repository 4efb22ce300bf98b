"""One process of a multi-process test (see tests/multiprocess.py)."""

from __future__ import annotations

import argparse
import faulthandler
import json


def unique_token_docs(num_docs: int, seed: int, max_len: int) -> list[dict]:
    """Documents whose tokens are globally unique, so coverage can be checked."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len, size=num_docs)
    starts = 10 + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [
        {"tokens": np.arange(s, s + n, dtype=np.int32)}
        for s, n in zip(starts, lengths, strict=True)
    ]


def local_rows(array) -> dict[int, list[int]]:
    """Rows of a global array held by this process, keyed by global row index."""
    import numpy as np

    rows = {}
    for shard in array.addressable_shards:
        start = shard.index[0].start or 0
        for offset, row in enumerate(np.asarray(shard.data)):
            rows[start + offset] = row.tolist()
    return rows


def build_mesh(params: dict):
    import jax

    import xlstm_data as xd

    if params.get("device_order") == "tp_across_processes":
        # tp pairs (p0 dev i, p1 dev i): each tp group spans both processes.
        by_process = sorted(jax.devices(), key=lambda d: (d.id % 2, d.process_index))
        return xd.create_mesh((1, 2, 2, 1), devices=by_process)
    return xd.create_mesh(params.get("mesh", "dp:1,fsdp:-1,tp:1,sp:1"))


def scenario_epoch(params: dict) -> dict:
    import jax

    import xlstm_data as xd

    mesh = build_mesh(params)
    docs = unique_token_docs(params["num_docs"], params.get("seed", 0), params.get("max_len", 40))
    iterator = xd.make_grain_llm_iterator(
        None,
        None,
        mesh,
        docs,
        global_batch_size=params["global_batch_size"],
        max_target_length=params.get("max_target_length", 16),
        shuffle=True,
        data_shuffle_seed=3,
        num_epochs=1,
        grain_packing=params.get("packing", False),
        worker_count=0,
        drop_remainder=params.get("drop_remainder", False),
    )
    steps = []
    for batch in iterator:
        steps.append(
            {
                "shape": list(batch.inputs.shape),
                "spec": str(batch.inputs.sharding.spec),
                "inputs": local_rows(batch.inputs),
                "segmentation": local_rows(batch.inputs_segmentation),
            }
        )
    layout = iterator.layout
    return {
        "process_index": jax.process_index(),
        "host_index": layout.host_index,
        "host_count": layout.host_count,
        "all_tokens": sorted(int(t) for d in docs for t in d["tokens"]),
        "steps": steps,
        "state": iterator.get_state(),
    }


def scenario_rampup_resume(params: dict) -> dict:
    """Restores inside and across ramp-up stages and compares the local rows."""
    import jax

    import xlstm_data as xd
    from xlstm_data.from_config import iterators_from_config

    data = {
        "train": {
            "a": {"kind": "synthetic", "num_documents": 200, "mean_length": 20.0, "weight": 3},
            "b": {"kind": "synthetic", "num_documents": 50, "seed": 1, "weight": 1},
        },
        "global_batch_size": 16,
        "max_target_length": 32,
        # Small planned blocks, so the restored cursor is past each source's first block.
        "block_documents": 4,
        "rampup": [[0, 0.5], [3, 0.75], [6, 1.0]],
    }
    mesh = xd.create_mesh()
    train, _ = iterators_from_config(data, mesh)
    states, rows, shapes = [], [], []
    for _ in range(9):
        states.append(train.get_state())
        batch = next(train)
        shapes.append(list(batch.inputs.shape))
        rows.append(local_rows(batch.inputs))
    train.close()
    mismatches = []
    fresh, _ = iterators_from_config(data, mesh)
    for step in params["restore_steps"]:
        fresh.set_state(states[step])
        for later in range(step, 9):
            got = local_rows(next(fresh).inputs)
            if got != rows[later]:
                mismatches.append([step, later])
    fresh.close()
    moved = sum(any(s["cursor"][2:4]) for s in states)  # a block start past 0
    return {
        "process_index": jax.process_index(),
        "shapes": shapes,
        "mismatches": mismatches,
        "states_past_first_block": moved,
    }


def checkpoint_data_config() -> dict:
    """A small synthetic 2-component mixture with ramp-up (shared with tests)."""
    return {
        "train": {
            "a": {"kind": "synthetic", "num_documents": 200, "mean_length": 40, "weight": 0.7},
            "b": {"kind": "synthetic", "num_documents": 100, "mean_length": 60, "seed": 1},
        },
        "global_batch_size": 8,
        "max_target_length": 32,
        "rampup": [[0, 0.5], [4, 1.0]],
    }


def scenario_save_checkpoint(params: dict) -> dict:
    """Saves model + data position after a few steps into params["directory"]."""
    import numpy as np
    import orbax.checkpoint as ocp

    import xlstm_data as xd

    mesh = build_mesh(params)
    train, _ = xd.iterators_from_config(checkpoint_data_config(), mesh)
    for _ in range(params.get("steps", 3)):
        next(train)
    manager = ocp.CheckpointManager(params["directory"])
    state = {"w": np.arange(4.0)}
    composite = ocp.args.Composite(
        model=ocp.args.StandardSave(state), data=xd.DataCheckpointSave(train)
    )
    manager.save(params.get("steps", 3), args=composite)
    manager.wait_until_finished()
    manager.close()
    train.close()
    return {"step": train.step_counter}


def scenario_planned_rows(params: dict) -> dict:
    """This process's rows of `inputs` at `params["steps"]` of a config file's train iterator."""
    import xlstm_data as xd
    from xlstm_data.cli.inspect_config import load_config

    config = load_config(params["config"])
    train, evals = xd.iterators_from_config(config.data, build_mesh(params))
    wanted, rows = set(params["steps"]), {}
    for step in range(max(wanted) + 1):
        batch = next(train)
        if step in wanted:
            rows[str(step)] = local_rows(batch.inputs)
    for iterator in (train, *evals.values()):
        iterator.close()
    return rows


def scenario_hooks(params: dict) -> dict:
    """CheckpointHook with every_secs on disagreeing clocks; DataMetricsHook totals."""
    import time

    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax_loop_utils.metric_writers import MemoryWriter

    import xlstm_data as xd
    from trainer_hooks import CheckpointHook, DataMetricsHook, checkpoint_manager

    mesh = build_mesh(params)
    train, _ = xd.iterators_from_config(checkpoint_data_config(), mesh)
    manager = checkpoint_manager(params["directory"], max_to_keep=None)
    # Process 0's clock says a save is due at every step, process 1's never.
    checkpoints = CheckpointHook(
        manager, lambda: {"w": np.arange(3.0)}, train, every_secs=5, secs_check_every_steps=2
    )
    writer = MemoryWriter()
    metrics = DataMetricsHook(writer, train, every_steps=3)
    tokens = 0
    saved = []
    for step in range(1, 7):
        batch = next(train)
        mask = multihost_utils.process_allgather(batch.targets_segmentation, tiled=True)
        tokens += int(np.count_nonzero(np.asarray(mask)))
        clock = time.monotonic() + (10.0 * step if jax.process_index() == 0 else 0.0)
        saved.append(bool(checkpoints(step, clock)))
        metrics(step)
    manager.wait_until_finished()
    result = {
        "saved": saved,
        "steps": list(manager.all_steps()),
        "global_tokens": tokens,
        "tokens_seen": writer.scalars[6]["data/tokens_seen"],
        "shares": [writer.scalars[6][f"data/share/{n}"] for n in ("a", "b")],
    }
    manager.close()
    train.close()
    return result


def scenario_refusal_on_one_process(params: dict) -> dict:
    """Process 1 fails to restore: both processes must raise, none may hang.

    `failure` is "damaged" (a truncated data file: a refusal) or "crash" (any
    other exception on process 1 only).
    """
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    import xlstm_data as xd

    scenario_save_checkpoint(params)
    step_dir = f"{params['directory']}/{params.get('steps', 3)}/data"
    if jax.process_index() == 1 and params.get("failure", "damaged") == "damaged":
        with open(f"{step_dir}/process_1-of-2.json", "w") as damaged:
            damaged.write('{"header": ')
    if jax.process_index() == 1 and params.get("failure") == "crash":

        def crash(*args, **kwargs):
            raise RuntimeError("simulated: the storage went away")

        xd.DataCheckpointHandler._restore_here = crash
    multihost_utils.sync_global_devices("damaged")
    train, _ = xd.iterators_from_config(checkpoint_data_config(), build_mesh(params))
    manager = ocp.CheckpointManager(params["directory"])
    composite = ocp.args.Composite(
        model=ocp.args.StandardRestore({"w": np.arange(4.0)}),
        data=xd.DataCheckpointRestore(train),
    )
    try:
        manager.restore(params.get("steps", 3), args=composite)
        outcome = "restored"
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    train.close()
    return {"outcome": outcome}


def scenario_online_mixing(params: dict) -> dict:
    """Online mixture updates around a checkpoint; the gathered batches from `save_at` on.

    `mode` "save": trains steps 0..end-1 calling set_mixture where
    `updates` says, saves the data position before step `save_at`. "resume":
    restores that position and goes on to `end` with the later updates.
    """
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    import xlstm_data as xd
    from xlstm_data.cli.inspect_config import load_config

    config = load_config(params["config"])
    train, evals = xd.iterators_from_config(config.data, build_mesh(params))
    manager = ocp.CheckpointManager(params["directory"])
    save_at, end = params["save_at"], params["end"]
    if params["mode"] == "resume":
        manager.restore(save_at, args=ocp.args.Composite(data=xd.DataCheckpointRestore(train)))
    gathered = {}
    while train.step_counter < end:
        step = train.step_counter
        if str(step) in params["updates"] and (params["mode"] == "save" or step >= save_at):
            weights, from_step = params["updates"][str(step)]
            train.set_mixture(weights, from_step)
        if params["mode"] == "save" and step == save_at:
            manager.save(step, args=ocp.args.Composite(data=xd.DataCheckpointSave(train)))
            manager.wait_until_finished()
        batch = next(train)
        if step >= save_at:
            fields = (batch.inputs, batch.source_ids)
            gathered[str(step)] = [
                np.asarray(multihost_utils.process_allgather(f, tiled=True)).tolist()
                for f in fields
            ]
    manager.close()
    for iterator in (train, *evals.values()):
        iterator.close()
    return gathered


def scenario_factory_resume(params: dict) -> dict:
    """The README's factory example: saves at `save_at` ("save") or resumes there ("resume").

    Returns the all-gathered `inputs` and `inputs_segmentation` of the steps
    from `save_at` to `end`.
    """
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    import xlstm_data as xd

    mesh = xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1")
    documents = xd.sources.SyntheticSource(num_documents=10_000, mean_length=300)
    iterator = xd.make_grain_llm_iterator(
        dataloading_host_index=None,
        dataloading_host_count=None,
        global_mesh=mesh,
        dataset=documents,
        global_batch_size=48,
        max_target_length=512,
        shuffle=True,
        data_shuffle_seed=42,
        grain_packing=True,
        eod_token_id=1,
        worker_count=params["worker_count"],
    )
    manager = ocp.CheckpointManager(params["directory"])
    save_at, end = params["save_at"], params["end"]
    if params["mode"] == "resume":
        manager.restore(save_at, args=ocp.args.Composite(data=xd.DataCheckpointRestore(iterator)))
    gathered = {}
    while iterator.step_counter < end:
        step = iterator.step_counter
        if params["mode"] == "save" and step == save_at:
            manager.save(step, args=ocp.args.Composite(data=xd.DataCheckpointSave(iterator)))
            manager.wait_until_finished()
        batch = next(iterator)
        if step >= save_at:
            gathered[str(step)] = [
                np.asarray(multihost_utils.process_allgather(f, tiled=True)).tolist()
                for f in (batch.inputs, batch.inputs_segmentation)
            ]
    manager.close()
    iterator.close()
    return gathered


SCENARIOS = {
    "factory_resume": scenario_factory_resume,
    "online_mixing": scenario_online_mixing,
    "refusal_on_one_process": scenario_refusal_on_one_process,
    "hooks": scenario_hooks,
    "save_checkpoint": scenario_save_checkpoint,
    "epoch": scenario_epoch,
    "rampup_resume": scenario_rampup_resume,
    "planned_rows": scenario_planned_rows,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--process_id", type=int, required=True)
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    # A process that JAX aborts (a peer missed a barrier) shows where each thread was.
    faulthandler.enable(all_threads=True)

    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
        heartbeat_timeout_seconds=20,
        shutdown_timeout_seconds=20,
    )
    from absl import flags

    flags.FLAGS.mark_as_parsed()
    params = json.loads(args.params)
    if "pytree_steps" in params:  # 0: whole chunks through the compiled pick from the start
        from xlstm_data.multihost import global_arrays

        global_arrays.PYTREE_STEPS = params["pytree_steps"]
    if "chunk_tokens" in params:  # small chunks: whole ones within a few steps
        from xlstm_data.reading import planned_batches

        planned_batches.CHUNK_TOKENS = params["chunk_tokens"]
    result = SCENARIOS[args.scenario](params)
    if "chunk_tokens" in params:
        from xlstm_data.multihost import global_arrays

        result["picked"] = bool(global_arrays._PICKS)  # a whole chunk went through a pick
    with open(args.out, "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
