"""Shared pytest setup.

The in-process tests run on 4 CPU devices. The backend starts here, so a
command line run in-process (`xlstm-data inspect` sets the CPU device count
when JAX has not started yet) cannot change the devices of later tests.
absl flags are left unparsed, as in a user's plain script: the library must
not need them (grain's worker processes read one).
"""

import jax

jax.config.update("jax_num_cpu_devices", 4)
assert len(jax.devices()) == 4
