"""Shared pytest setup.

The in-process tests run on 4 CPU devices (set before any backend starts).
grain's mp_prefetch reads absl flags, which raise unless parsed; tests never go
through absl.app, so the flags are marked parsed once here.
"""

import jax
from absl import flags

jax.config.update("jax_num_cpu_devices", 4)
flags.FLAGS.mark_as_parsed()
