"""A job's flags and their help: what `ftc`'s argument parser needs of a job, apart from what checks
one (runner/jobspec.py imports launch planning, providers and the data readers; every ftc command
builds the parser, so it would pay their import).
"""

from .node import glue
from .node.recipes import COMPILE_MIN_THREADS, POWERSGD_RANK, RECIPES

JOB_FLAGS = {
    "task": "GLUE task: " + ", ".join(glue.TASKS) + "; or custom (your own --train-file and --validation-file)",
    "train_file": "custom: your training rows, CSV, TSV or JSON lines (README: Your own data)",
    "validation_file": "custom: your dev rows, in the same layout",
    "text_columns": "custom: one or two text columns, comma-separated (default sentence1,sentence2 when the "
                    "file has both, else text)",
    "label_column": "custom: the label column (default label); float labels mean regression",
    "model": "hub id or local directory (default distilbert-base-uncased; 'auto': offline fallback)",
    "data_dir": "local GLUE directory (<dir>/<task>/train.tsv, dev.tsv); default: the hub; 'auto'",
    "recipe": "ftc (default) or seed (the 2021 recipe's settings); your own data under 1000 rows: small-data "
              "(lr 2e-4, 3 epochs, batch size 8, no dropout) for whatever of these you leave unset",
    "epochs": "epochs (default: the recipe's, 3)",
    "batch_size": "per rank (default 32)",
    "lr": "learning rate (default 2e-5)",
    "max_train_samples": "use the first N training rows (0: all)",
    "max_eval_samples": "evaluate on the first N dev rows (0: all)",
    "precision": "auto (bf16 where the CPU has it natively), bf16 or fp32",
    "allreduce": "auto (default: the faster by ftc plan's model on a cloud's instance type, else after-backward), "
                 "after-backward (cores idle), "
                 "overlap (DDP's buckets during backward) or comm-core (overlap, gloo's threads on a core kept "
                 "from compute)",
    "dropout": "every dropout probability of the model (default: its config's); 0 lets attention run "
               "PyTorch's fused kernel (faster: docs/performance.md)",
    "grad_compress": "what the gradient all-reduce sends: auto (bf16 when training in bf16), none (fp32), bf16, or "
                     f"powersgd (the weight matrices as rank-{POWERSGD_RANK} factors with error feedback: an approximate "
                     "average; after backward only)",
    "flows": "gloo TCP connections per peer (default: on EC2 as many as fill the instance's link, 3 at 25 Gbit/s, "
             "since each flow is capped at 10; elsewhere 1)",
    "ppn": "ranks per node (default: one per socket, the fastest at the recipe's global batch; more ranks are "
           "faster only as each adds its batch to the global batch: docs/performance.md)",
    "compile": "torch.compile the training step on every node: auto (default: where the job's planned steps pay "
               f"the compile back and a rank has {COMPILE_MIN_THREADS} threads or more; kernels an earlier cluster "
               "compiled count as warm), on or off",
    "seed": f"the random seed of the new head's weights, the data's order, dropout and PowerSGD (default "
            f"{RECIPES['ftc']['seed']}): "
            "a run with another seed measures the spread of a recipe's accuracy",
    "results": "controller directory for results (default $FTC_HOME/runs/<cluster>/<task>-<UTC time>)",
    "checkpoint_uri": "a checkpoint store's URI ({stores}): also copy every checkpoint there (<prefix>/<job>/last.pt)",
}
JOB_FLAG_ALIASES = {"checkpoint_s3": "checkpoint_uri"}  # a former name -> the flag it now is
