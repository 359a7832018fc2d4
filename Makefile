# The README's commands. `make test` and `make demo` work on a fresh clone: they create .venv, install the
# pinned environment (torch pinned: an unpinned torch pulls a multi-GB CUDA build), build the C++ extension
# and run. Thread counts are set explicitly: this class of machine is badly hurt by oversubscription.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
THREADS ?= 1
RUN    := OMP_NUM_THREADS=$(THREADS) MKL_NUM_THREADS=$(THREADS) SPECDEC_THREADS=$(THREADS) $(VPY)

.PHONY: venv install test test-fast demo bench ablate real-demo gpu-check clean

venv: $(VPY)
$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): $(VPY) requirements-dev.txt pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h)
	$(VPY) -m pip install -q -r requirements-dev.txt
	$(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	$(VPY) -c "import specdec_kernels as sk; print('specdec_kernels backends:', sk.available_backends())"
	touch $(STAMP)

install: $(STAMP)

test: install
	$(RUN) -m pytest -q tests

demo: install
	$(RUN) -m specdec demo

bench: install
	$(RUN) -m pytest -q bench --benchmark-enable --benchmark-only --benchmark-columns=median,iqr,ops --benchmark-sort=name

ablate: install
	$(RUN) -m specdec ablate --quick --json results/ablation.json --plot results/ablation.png

gpu-check: install
	$(VPY) bench/gpu_check --out results/gpu_check.json

clean:
	rm -rf $(VENV) build *.egg-info kernels/*.so .pytest_cache .benchmarks
