"""The probe behind ftc compiling each of the model's repeated blocks (regional compilation) instead of the
whole model. The blocks share one code object, so dynamo traces and inductor compiles one block, not six; what
lies between the blocks (embeddings, the classifier, the loss) runs eager. One process per mode, each with its
own empty inductor cache: DistilBERT's architecture (6 layers, random weights, its config's dropout), 32 rows a
step of random lengths 24-95, bf16 autocast, fused AdamW, as ftc's training step.

    python docs/probes/regional_compile.py MODE [STEPS [CACHE_DIR [ROWS]]]     # MODE: eager | regional | whole

TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0 compiles each kernel without inductor's precompiled header (set in the
process from the variable: torch 2.11's inductor does not read it, 2.13's does); a CACHE_DIR run before (the same
mode and header setting) gives a warm start. ROWS a step (default 32): dynamic shapes make the batch a symbol, so a
run of few rows compiles the kernels a run of 32 finds warm.

Prints one JSON line: the first 3 steps' seconds, the steady step (median after the 4th), the start cost (the
first 4 steps beyond 4 steady ones) and rows/s. Results: docs/probes/regional_compile.txt."""
import json
import os
import random
import sys
import tempfile
import time

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 32
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix=f"inductor-{mode}-")
import torch  # noqa: E402
import torch._inductor.config  # noqa: E402
from transformers import AutoModelForSequenceClassification, DistilBertConfig  # noqa: E402

torch._inductor.config.cpp_cache_precompile_headers = os.environ.get("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS") != "0"
torch.manual_seed(0)
random.seed(0)
model = AutoModelForSequenceClassification.from_config(DistilBertConfig(num_labels=2, n_layers=6))
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
torch._dynamo.config.specialize_float = True  # as ftc compiles: a dropout's p is a constant
if mode == "whole":
    model.compile(dynamic=True)
elif mode == "regional":
    for block in model.distilbert.transformer.layer:
        block.compile(dynamic=True)
seconds = []
for length in [random.choice(range(24, 96)) for _ in range(steps)]:  # noqa: S311 - lengths, not secrets
    ids = torch.randint(1000, 30000, (rows, length))
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.randint(0, 2, (rows,))).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds.append(time.perf_counter() - started)
steady = sorted(seconds[4:])[len(seconds[4:]) // 2]
print(json.dumps({"mode": mode, "threads": torch.get_num_threads(), "rows": rows,
                  "precompiled_header": torch._inductor.config.cpp_cache_precompile_headers,
                  "compile_threads": torch._inductor.config.compile_threads,
                  "first3_s": round(sum(seconds[:3]), 1), "steady_step_s": round(steady, 3),
                  "start_cost_s": round(sum(seconds[:4]) - 4 * steady, 1), "rows_per_s": round(rows / steady, 1),
                  "total_s": round(sum(seconds), 1)}))
