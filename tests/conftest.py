"""Shared pytest setup.

The in-process tests run on 4 CPU devices (set before any backend starts).
absl flags are left unparsed, as in a user's plain script: the library must
not need them (grain's worker processes read one).
"""

import jax

jax.config.update("jax_num_cpu_devices", 4)
