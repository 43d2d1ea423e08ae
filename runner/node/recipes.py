"""The training recipes: ftc's settings and the 2021 seed recipe's, by name. The training program
starts from one, then applies explicit flags; the controller reads them to tell what a job left to
its recipe (a resumed job must be the same job). No torch here: the controller imports it.
"""

RECIPES = {
    "ftc": dict(precision="auto", pad_to="longest", group_by_length=True, batch_size=32, lr=2e-5, epochs=3,
                grad_compress="auto", embedding_sync="rows", compile="auto", allreduce="after-backward",
                balance="even", gloo_threads="rank-cores"),
    "seed": dict(precision="fp32", pad_to="max_length", group_by_length=False, batch_size=32, lr=2e-5, epochs=3,
                 grad_compress="none", embedding_sync="dense", compile="off", allreduce="overlap", balance="even",
                 gloo_threads="inherit"),
}
