PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test install lint clean demo bench-peers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

DEMO_DIR ?= $(CURDIR)/demo_workdir
DEMO_RUN = $(BIN)/python -m trainer_hooks.train --config=configs/demo.py --workdir=$(DEMO_DIR) --cpu_devices=2

# Trains the demo (2-component mixture, 3-stage ramp-up) on the Python standard
# library's own sources, pre-empts itself with SIGKILL at step 130, resumes from
# the last checkpoint and checks that the replayed steps match bit for bit.
demo: install
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	$(BIN)/xlstm-data inspect --config=configs/demo.py --png=$(DEMO_DIR)/plan.png
	$(DEMO_RUN) --simulate_preemption_at_step=130 || [ $$? -eq 137 ]
	@echo "=== pre-empted (SIGKILL) after step 130; rerunning with the same workdir resumes ==="
	$(DEMO_RUN)
	$(BIN)/python -m trainer_hooks.batch_log $(DEMO_DIR)
	@echo "checkpoints: $(DEMO_DIR)/checkpoints  metrics: $(DEMO_DIR)/metrics.jsonl  batches: $(DEMO_DIR)/batches.jsonl"

# The loaders bench/peers compares against live in their own venv, never in the
# project's dependencies. Each peer is installed on its own, so one that fails is
# reported (bench/peers then runs the others and names it as missing).
PEERS_VENV := .venv-peers
PEERS_BIN := $(PEERS_VENV)/bin
PEERS := megatron-core==0.16.1 ai2-olmo-core mosaicml-streaming

bench-peers:
	test -x $(PEERS_BIN)/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_BIN)/pip install --quiet torch==2.13.0 psutil py-spy numpy
	@for peer in $(PEERS); do \
	  $(PEERS_BIN)/pip install --quiet torch==2.13.0 $$peer || echo "bench-peers: $$peer could not be installed"; \
	done
	$(PEERS_BIN)/python -m pip list 2>/dev/null | grep -iE '^(torch|megatron-core|ai2-olmo-core|mosaicml-streaming|psutil|numpy) '
	@echo "peers venv ready: $(PEERS_VENV); run: $(BIN)/python -m bench.peers [--rounds=N] [--docs=N]"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(PEERS_VENV) .pytest_cache build *.egg-info $(DEMO_DIR)
