# Two entry points, both of which build the environment first:
#   make run   - set up .venv and run the main job (every scenario in scenarios/)
#   make test  - set up .venv (the peers extra included) and run the whole test suite in parallel
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3.13 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PEERS_STAMP := $(VENV)/.peers-installed

.PHONY: run test venv clean peers cuda-torch

venv: $(STAMP)

$(STAMP): pyproject.toml
	@# An older Python would make pip resolve the wrong wheels (the CUDA build of torch) for
	@# minutes before failing; say what is needed instead.
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "commsim needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) --version 2>&1)." >&2; \
	  echo "Run with a newer one, e.g.: make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	# CPU build of torch from the local wheel cache; a bare `torch` would pull CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	# The ray extra too: tests/sweep/test_executors.py runs a local 2-CPU Ray.
	$(BIN)/pip install --quiet -e '.[test,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/commsim run scenarios/

test: $(STAMP) $(PEERS_STAMP)
	bash scripts/test.sh

# The serving libraries of the `peers` extra (pyproject.toml says why each is there),
# installed without their GPU-only dependencies, so that `make test` runs them unmodified
# (tests/hosting/test_flashinfer.py, test_vllm.py). Measured here on a quiet 2-core machine:
# the download is 407 MB (vllm's wheel 321 MB, flashinfer's 60 MB), 18 s from the registry;
# download plus install about 54 s; a fresh clone's whole `make test` 353 s, within CI's 10
# minutes on 2 cores. `make peers` adds FlashInfer 0.4.1, vLLM 0.34.0 and SGLang in venvs of
# their own.
# The download is bounded (PEERS_DOWNLOAD_S, 0 = no limit) so that a slow registry cannot
# push CI past its 10 minutes: past the limit nothing is installed, make says so, and the
# peers' tests skip naming what is absent; the next `make test` tries again. Downloading
# first and installing from the local copy means a cut-off download leaves no half-installed
# package behind.
PEERS_DOWNLOAD_S ?= 150
PEERS_WHEELS := $(VENV)/peers-wheels

$(PEERS_STAMP): $(STAMP)
	@rm -rf $(PEERS_WHEELS)
	@if timeout $(PEERS_DOWNLOAD_S) $(BIN)/pip download --quiet --no-deps -d $(PEERS_WHEELS) $(PEERS); then \
	  $(BIN)/pip install --quiet --no-deps --no-index --find-links $(PEERS_WHEELS) $(PEERS) && touch $@; \
	else \
	  echo "make: the peers extra did not download within $(PEERS_DOWNLOAD_S) s (PEERS_DOWNLOAD_S);" \
	       "it is not installed and its tests skip; make peers installs it with no limit." >&2; \
	fi
	@rm -rf $(PEERS_WHEELS)

PEERS = $(shell $(BIN)/python -c 'import tomllib; print(" ".join(repr(p) for p in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["peers"]))' 2>/dev/null)

# A venv layered over .venv at $(1): a .pth adds .venv's site-packages after its own.
define layered_venv
rm -rf $(1)
$$(readlink -f $(BIN)/python) -m venv --without-pip $(1)
$(1)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] + "/zz-commsim-venv.pth", "w").write("import site; site.addsitedir(%r)\n" % sys.argv[1])' $(SITE)
endef

# FlashInfer 0.4.1 (the release of the legacy-IPC seed) pins apache-tvm-ffi 0.1.0b15 where
# 0.7.x needs 0.1.11+, so it gets a venv of its own, layered over .venv (torch, commsim and
# the test tools shared; flashinfer and tvm-ffi its own). 0.1.0b15 is no longer on the
# registry: 0.1.0, its final release, stands in; 0.4.1 ships as an sdist whose build needs tvm-ffi, so it builds without isolation.
FI041 := .venv-fi041
SITE = $(shell $(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

$(FI041)/.installed: $(STAMP)
	$(call layered_venv,$(FI041))
	$(FI041)/bin/python -m pip install --quiet --no-deps 'apache-tvm-ffi==0.1.0'
	$(FI041)/bin/python -m pip install --quiet --no-deps --no-build-isolation 'flashinfer-python==0.4.1'
	touch $@

# vLLM 0.34.0 beside the peers pin 0.33.0 (the seed's release, vllm-project/vllm#52778:
# custom all-reduce admits a TP group across two GB200 trays and dies registering graph
# buffers; `make test` runs it): 0.34.0 declines that group. A venv layered over .venv
# holding only vllm 0.34.0 (--no-deps; every other package is .venv's);
# tests/hosting/test_vllm.py runs commsim with each venv's interpreter.
VLLM034 := .venv-vllm034

$(VLLM034)/.installed: $(STAMP)
	$(call layered_venv,$(VLLM034))
	$(VLLM034)/bin/python -m pip install --quiet --no-deps 'vllm==0.34.0'
	touch $@

# SGLang 0.5.23 pins torch 2.14.1 and imports triton at module level
# (sglang/srt/utils/common.py), which the other peers must not see: a layered venv holding
# sglang, triton and the pure packages its communication modules import (--no-deps, as
# installed when tests/hosting/test_sglang.py passed; FlashInfer is .venv's), and
# sglang-kernel, whose custom all-reduce ops commsim serves (a 373 MB wheel, 1.5 GB
# installed, nearly all of it kernels no hosted rank loads).
SGLANG := .venv-sglang
SGLANG_PKGS := 'sglang==0.5.23' 'sglang-kernel==0.4.10' 'triton==3.9.0' orjson starlette anyio \
    httpx2 httpcore2 truststore ipython traitlets aiohttp multidict yarl propcache \
    aiohappyeyeballs aiosignal frozenlist

$(SGLANG)/.installed: $(STAMP)
	$(call layered_venv,$(SGLANG))
	$(SGLANG)/bin/python -m pip install --quiet --no-deps $(SGLANG_PKGS)
	touch $@

peers: PEERS_DOWNLOAD_S = 0
peers: $(PEERS_STAMP) $(FI041)/.installed $(VLLM034)/.installed $(SGLANG)/.installed
	$(BIN)/python -m pytest -q -n 2 tests/hosting/test_flashinfer.py tests/hosting/test_vllm.py \
	    tests/hosting/test_flashinfer_041.py tests/hosting/test_plugin.py tests/hosting/test_sglang.py

# Hosting over a CUDA build of torch on a machine without a driver (a vLLM developer's laptop
# or CI image; vLLM 0.33 pins torch 2.14.0): a second venv with the CUDA wheel, then the
# hosting tests in it. Not part of `make test`: the wheel is 555 MB plus ~3 GB of nvidia-*
# wheels (about 7 min to install; docs/hosting.md, "CPU and CUDA builds of torch").
CUDA_VENV  := .venv-cuda
CUDA_TORCH := torch==2.14.0

$(CUDA_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/pip install --quiet $(CUDA_TORCH)
	# commsim's own dependencies as pyproject.toml declares them; the CUDA build satisfies torch>=2.13.
	$(CUDA_VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

cuda-torch: $(CUDA_VENV)/.installed
	$(CUDA_VENV)/bin/python -m pytest -q -n 2 tests/hosting

clean:
	rm -rf $(VENV) $(CUDA_VENV) $(FI041) $(VLLM034) $(SGLANG) .pytest_cache build *.egg-info
