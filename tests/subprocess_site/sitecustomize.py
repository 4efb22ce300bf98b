"""Lets every process of a multi-process test run read JAX's compilation cache.

Test subprocesses get this directory on PYTHONPATH
(`tests/multiprocess.subprocess_env`). JAX writes cache entries from process
0 only, and on CPU it keys them with the topology fingerprint of the local
client, which differs between processes: every process but the first
missed the cache on every run and compiled the train step again (about 12 s
of CPU per process and launch on 2 cores: a 2-process
`tests/train_config.py` run took 41-45 s of CPU, 22 s with this hook, its
batches and losses bit for bit the same).
The hook keys the accelerator part by the devices themselves (kind, id and
process of each, the same in every process), so the other processes load
the executable process 0 compiled, as JAX's own
`jax_share_binary_between_hosts` does between hosts.

It only wraps `jax._src.cache_key` when JAX imports it (processes that never
import JAX pay nothing), and leaves JAX as it is if that function is gone.
A `sitecustomize` found later on `sys.path` still runs.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_MODULE = "jax._src.cache_key"


def _hash_devices_everywhere_alike(module):
    def _hash_accelerator_config(hash_obj, accelerators):
        for device in accelerators.flat:
            hash_obj.update(f"{device.device_kind}:{device.id}:{device.process_index};".encode())

    if hasattr(module, "_hash_accelerator_config"):
        module._hash_accelerator_config = _hash_accelerator_config


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _hash_devices_everywhere_alike(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())


def _run_the_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    later = [p for p in sys.path if p and os.path.abspath(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_run_the_next_sitecustomize()
