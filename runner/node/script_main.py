"""Your script, run as `python SCRIPT ARGS` would run it, then the process group left cleanly.

script_rank.py starts this file by its path (not as part of ftc's package, so nothing of ftc's sits
on the script's import path: sys.path[0] is the script's own folder, as with `python SCRIPT`). After
the script returns, what its globals held is freed and a process group it joined and did not leave is
left here, barrier first: without that, gloo's work meets the interpreter's exit and the rank dies with
`terminate called without an active exception` (SIGABRT), failing a job whose training succeeded. A script that fails exits with
its own code, without that exit-time abort replacing it.

While the script runs, torch.distributed.init_process_group starts gloo's threads on all of the
rank's cores: the launch binds each OpenMP thread, the main one included, to a single core, and a
thread inherits its starter's binding (distenv.threads_started_on).
"""

import atexit
import functools
import gc
import importlib.util
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path


def _distenv():
    """runner/node/distenv.py, loaded by path under a private name (ftc's `runner` stays unimported)."""
    spec = importlib.util.spec_from_file_location("_ftc_distenv", Path(__file__).with_name("distenv.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JOINED = []  # not empty once the script has joined a process group


def _gloo_threads_on(cores: list[int], distenv) -> None:
    try:
        import torch.distributed as dist
    except ImportError:  # a script without torch: nothing to tune
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        JOINED.append(True)
        with distenv.threads_started_on(cores):
            return original(*args, **kwargs)
    dist.init_process_group = init_process_group


COMBINING = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
             "reduce_scatter_tensor", "all_to_all", "all_to_all_single")  # collectives that combine the ranks' data


def _note_when_synced() -> None:
    """script_rank's file (protocol.SYNCED_ENV) made the first time the script wraps a model in DDP or FSDP
    or calls a collective that combines the ranks' data: a job none of whose ranks did ran N times alone."""
    path = os.environ.get("FTC_SYNCED_FILE", "")
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a script without torch: nothing to note
        return
    if not path:
        return

    noted = []  # once is enough: a collective may run every step

    def noting(original):
        @functools.wraps(original)
        def call(*args, **kwargs):
            if not noted:
                Path(path).touch()
                noted.append(True)
            return original(*args, **kwargs)
        return call
    for name in COMBINING:
        if hasattr(c10d, name):
            wrapped = noting(getattr(c10d, name))
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)
    DistributedDataParallel.__init__ = noting(DistributedDataParallel.__init__)


def _leave_if_joined(distenv) -> None:
    """Out of the process group the script joined and did not leave (barrier first)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        distenv.leave_process_group()


def _exit_now(code: int) -> None:
    """Exit with `code` at once: the streams flushed, no exit-time teardown left to abort the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _from_the_script(tb, script: str):
    """The traceback from the script's first frame on: this file's and runpy's frames are not yours."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb


def main() -> None:
    cores = sorted(os.sched_getaffinity(0))
    script = str(Path(sys.argv[1]).absolute())
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    sys.path[0] = str(Path(script).parent)
    distenv = _distenv()
    _gloo_threads_on(cores, distenv)
    _note_when_synced()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            _exit_now(exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:  # noqa: BLE001 - the script's own failure: its traceback, as python prints it
        traceback.print_exception(type(exc), exc, _from_the_script(exc.__traceback__, script))
        _exit_now(1)
    if JOINED:
        # What the script's globals held (a DDP wrapper's reducer holds gloo's pending work) is freed
        # now, while the interpreter is whole: freed by the interpreter's own teardown, it aborts the
        # rank with `terminate called without an active exception` (seen under load, 1 rank of 2),
        # whether or not the script left the group itself. Then the exit's Python part (the script's
        # threads, atexit handlers, streams), and out without the C++ teardown.
        gc.collect()
        _leave_if_joined(distenv)
        threading._shutdown()  # the interpreter's own exit order: the script's threads and executors first
        atexit._run_exitfuncs()
        _exit_now(0)


if __name__ == "__main__":
    main()
