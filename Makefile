# gemmlab: one entry point for every machine.
#   make run        execute every notebook headless into build/ on this hardware, then a table
#   make test       unit tests + nbval regression of every notebook (what CI runs)
#   make lab        JupyterLab on notebooks/
#   make gpu-check  on an H100/H200 (or B200): GPU tests required, benchmarks,
#                   notebooks re-executed in place, nbval with gpu cells required
#   make lock       regenerate requirements.lock from the current .venv
#
# run/test/lab create .venv from requirements.lock when it is missing (about 3 GB to download, 6 GB on
# disk; `make run PYTHON=python3` uses that interpreter instead, checks first that it imports the
# stack, and installs nothing: so do `make test PYTHON=...` and `make lab PYTHON=...`).
# gpu-check uses .venv if present, else a python3 that already imports the
# stack (an offline GPU machine), else creates .venv.

BOOT_PYTHON ?= python3
VENV        := .venv
VENV_PY     := $(VENV)/bin/python
STACK_CHECK := import cutlass, torch, tvm_ffi, nbval, nbclient, matplotlib, ipykernel
NBVAL_ARGS  := --nbval --nbval-current-env --nbval-sanitize-with nbval-sanitize.cfg --nbval-cell-timeout 900
export PYTHONPATH := $(CURDIR)/lib$(if $(PYTHONPATH),:$(PYTHONPATH))
export MPLBACKEND := Agg

ifdef PYTHON
PY       := $(PYTHON)
VENV_DEP :=
else
PY       := $(VENV_PY)
VENV_DEP := venv
endif

.PHONY: venv run test lab gpu-check gpu-tests gpu-bench gpu-notebooks gpu-nbval sanitize bench lock clean sm100-check

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	@echo "== installing requirements.lock into $(VENV): torch with its CUDA libraries and CuTe DSL, about 3 GB to"
	@echo "== download and 6 GB on disk; 5-15 minutes the first time on a fast connection (pip shows each package)"
	@test -x $(VENV_PY) || $(BOOT_PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install --disable-pip-version-check --progress-bar on -r requirements.lock
	$(VENV_PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

# With PYTHON=..., check up front that it imports what a target needs (nothing is installed into it).
ifdef PYTHON
STACK_GUARD = err=$$($(PY) -c "$(1)" 2>&1 >/dev/null) || { echo "make: PYTHON=$(PY) cannot run this: $$(echo "$$err" | tail -n 1)." \
	"Install requirements.lock into it, or leave out PYTHON= to use $(VENV)." >&2; exit 2; }
else
STACK_GUARD = true
endif

# RUN_ARGS: passed to the runner (notebook paths, --timeout, --out).
run: $(VENV_DEP)
	@$(call STACK_GUARD,$(STACK_CHECK))
	$(PY) -m gemmlab.course.runner $(RUN_ARGS)

TEST_CHECK := $(STACK_CHECK), pytest, hypothesis
test: $(VENV_DEP)
	@$(call STACK_GUARD,$(TEST_CHECK))
	$(PY) -m pytest -q -p no:cacheprovider tests notebooks $(NBVAL_ARGS)

# Headless and as root it just works: --allow-root for uid 0, --no-browser without a display
# (macOS opens its browser without $DISPLAY). LAB_ARGS: more JupyterLab options (e.g. --ip=0.0.0.0 --port=8890).
# The kernels get the user's own matplotlib backend (inline): MPLBACKEND=Agg, exported above for the
# headless targets, is taken out of their environment.
LAB_CHECK := $(STACK_CHECK), jupyterlab
lab: $(VENV_DEP)
	@$(call STACK_GUARD,$(LAB_CHECK))
	@args="--ServerApp.root_dir=notebooks"; \
	if [ "$$(id -u)" = 0 ]; then args="$$args --allow-root"; fi; \
	if [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && [ "$$(uname)" != Darwin ]; then args="$$args --no-browser"; fi; \
	echo "== $(PY) -m jupyter lab $$args $(LAB_ARGS)"; \
	echo "== open the http://.../lab?token=... URL that JupyterLab prints below; Ctrl-C twice stops it"; \
	exec env -u MPLBACKEND $(PY) -m jupyter lab $$args $(LAB_ARGS)

# The interpreter for gpu-check, chosen as the header says.
GPU_PY = $(shell if [ -x $(VENV_PY) ]; then echo $(VENV_PY); \
	elif python3 -c "$(STACK_CHECK)" >/dev/null 2>&1; then echo python3; \
	else echo NEEDS_VENV; fi)

# gpu-check = gpu-tests gpu-bench gpu-notebooks gpu-nbval, in that order; each
# part can also be run alone (e.g. on a machine lent for ten minutes at a time).
GPU_ENV = py="$(GPU_PY)"; \
	if [ "$$py" = NEEDS_VENV ]; then $(MAKE) venv && py=$(VENV_PY); fi; \
	tier=$$($$py -c "from gemmlab.tiers import detect_tier; print(detect_tier())"); \
	if [ "$$tier" = cpu ]; then echo "gpu-check needs a GPU of tier sm90 or sm100; this machine is tier cpu" >&2; exit 2; fi; \
	export GEMMLAB_TIER=$$tier; set -e

gpu-check: gpu-tests gpu-bench gpu-notebooks gpu-nbval

gpu-tests:
	@$(GPU_ENV); echo "== unit tests on tier $$tier with $$py (GPU tests required)"; \
	$$py -m pytest -q -p no:cacheprovider tests

gpu-bench:
	@$(GPU_ENV); echo "== benchmarks on tier $$tier"; $$py benchmarks/run.py

gpu-notebooks:
	@$(GPU_ENV); echo "== notebooks re-executed in place on tier $$tier"; $$py -m gemmlab.course.runner --inplace

gpu-nbval:
	@$(GPU_ENV); echo "== nbval on tier $$tier (gpu cells required)"; \
	$$py -m pytest -q -p no:cacheprovider notebooks $(NBVAL_ARGS)

# compute-sanitizer memcheck and racecheck on chapter 07's GEMM variants (small partial-tile shapes).
sanitize:
	@$(GPU_ENV); out=results/$$($$py -c "from gemmlab.measure.bench import device_slug; print(device_slug())"); \
	mkdir -p $$out; f=$$out/gemm_sm90_sanitizer.txt; \
	echo "# compute-sanitizer on $$($$py -c "from gemmlab.measure.bench import device_name; print(device_name())"), $$(date +%F), make sanitize (benchmarks/sanitize_gemm.py)" > $$f; \
	for tool in memcheck racecheck; do \
	  extra=""; if [ $$tool = memcheck ]; then extra="--report-api-errors no"; fi; \
	  echo "== compute-sanitizer --tool $$tool $$extra" | tee -a $$f; \
	  compute-sanitizer --tool $$tool $$extra $$py benchmarks/sanitize_gemm.py 2>&1 | grep -E "rel\. Frobenius|ERROR SUMMARY|RACECHECK SUMMARY|Error|Hazard" | tee -a $$f; \
	done; \
	grep -q "ERROR SUMMARY: 0 errors" $$f && grep -q "RACECHECK SUMMARY: 0 hazards" $$f \
	  || { echo "compute-sanitizer found problems: see $$f" >&2; exit 1; }

# On a B200 / GB200: sm100 tests (mandatory), chapters 09-10 with their sm100 cells, a short benchmark
# against cuBLAS, one verdict table, results/<device>/sm100_check.json (benchmarks/sm100_check.py).
# Elsewhere: one line naming the tier it needs, exit status 2.
sm100-check:
	@py="$(GPU_PY)"; if [ "$$py" = NEEDS_VENV ]; then $(MAKE) -s venv && py=$(VENV_PY); fi; \
	$$py benchmarks/sm100_check.py

bench:
	$(or $(filter-out NEEDS_VENV,$(GPU_PY)),$(VENV_PY)) benchmarks/run.py

lock: venv
	$(VENV_PY) -m pip freeze --all --exclude-editable | grep -v '^pip==' \
	  | sed -E 's/^(torch==[0-9.]+)\+.*/\1/; s/^nvidia-cutlass-dsl==/nvidia-cutlass-dsl[cu13]==/' > requirements.lock

clean:
	rm -rf build
