"""What ftc keeps of inductor's own files beside a node's compiled kernels, set up before anything compiles:
the answers to inductor's ISA checks (and the check itself made without importing torch), and inductor's
precompiled headers, which a shipped cache of another model brings to a node whose own were not shipped.
"""

import hashlib
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import torch

from .facts import cpu_info
from .protocol import json_object, read_json, write_whole

# How inductor checks that a vector ISA's kernels build and load, where torch checks it by starting a
# Python that imports torch to load a test kernel (torch before 2.13; 2.13 finds torch's libraries without
# importing it). A test kernel linked as needed wants torch's C++ library alone, loaded first here; one
# that wants more (a toolchain that links every library named) is loaded as torch's own check loads it,
# so the check never passes fewer ISAs than torch's. Under torch 2.11 on 2 cores the imports were 7.6 s
# of a warm start's 11.1 s (docs/bench-log.md).
ISA_CHECK_WITHOUT_TORCH = """
import ctypes
try:
    ctypes.CDLL(__torch_cpu__, mode=ctypes.RTLD_GLOBAL)
    ctypes.cdll.LoadLibrary("__lib_path__")
except OSError:
    import torch
    ctypes.cdll.LoadLibrary("__lib_path__")
"""


def check_isa_without_importing_torch(vec_isa_class=None) -> bool:
    """Where inductor's ISA check starts a Python that imports torch (VecISA._avx_py_load, torch before
    2.13), the check loads torch's C++ library instead; True where it changed the check."""
    if vec_isa_class is None:
        try:
            from torch._inductor.cpu_vec_isa import VecISA as vec_isa_class
        except ImportError:  # a torch whose inductor keeps its ISAs elsewhere: its own check stands
            return False
    torch_cpu = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    loader = getattr(vec_isa_class, "_avx_py_load", "")
    if (hasattr(vec_isa_class, "_probe_load") or "import torch" not in loader or "ctypes.CDLL(" in loader
            or not torch_cpu.is_file()):
        return False
    vec_isa_class._avx_py_load = ISA_CHECK_WITHOUT_TORCH.replace("__torch_cpu__", repr(str(torch_cpu)))
    return True


# Inductor's answers to "do this vector ISA's kernels build and load here?", kept in the kernel cache. Torch
# asks again in every process, loading a test kernel in a new Python for each (on the 16-core AMX host 13.6 s
# of a warm start's 17.7 s: docs/performance.md); the answer depends only on what its key holds. The training
# process's checks are kept; a compile worker's own (cold compiles only) are torch's.
ISA_CHECKS_FILE = "ftc-isa-checks.json"


def isa_checks_kept_in(cache_dir: Path, vec_isa_class=None) -> bool:
    """Inductor's ISA checks answered from `cache_dir` where an earlier process (on this node, or where these
    kernels were compiled) found the ISA good, keyed by torch's own fingerprint of the check (the compiler's
    version, the ISA's flags, torch's version), the test kernel and this CPU's vector ISA; a check that failed
    is asked again. True where installed (before anything compiles: torch keeps each answer for the process)."""
    try:
        from torch._inductor import cpu_vec_isa
        vec_isa_class = vec_isa_class or cpu_vec_isa.VecISA
        fingerprint = cpu_vec_isa._get_isa_dry_compile_fingerprint
    except (ImportError, AttributeError):  # a torch that checks otherwise: its own check stands
        return False
    asked = getattr(vec_isa_class.check_build, "__wrapped__", vec_isa_class.check_build)  # inductor's, never ours twice
    path, unwritable, cpu_isa = cache_dir / ISA_CHECKS_FILE, [], cpu_info()[1]

    def check_build(isa, code: str) -> bool:
        flags = isa.build_arch_flags() if hasattr(isa, "build_arch_flags") else isa._arch_flags
        key = hashlib.sha256(json.dumps([fingerprint(flags), code, cpu_isa]).encode()).hexdigest()[:20]
        if read_json(path).get(key) is True:
            return True
        good = asked(isa, code)
        if good and not unwritable:
            try:
                write_whole(path, read_json(path) | {key: True})
            except OSError as exc:  # said once: the next process asks inductor again
                unwritable.append(exc)
                print(f"compile: inductor's ISA checks are not kept ({exc})", file=sys.stderr)
        return good
    check_build.__wrapped__ = asked
    vec_isa_class.check_build = check_build
    return True


# Inductor's precompiled header of its C++ kernels' prelude (cpp_prefix.h: 150-185 MB, about 27 MB packed), built
# once per compiler and flags before the first kernel compiles, and by torch kept under /tmp whatever
# TORCHINDUCTOR_CACHE_DIR says. Kept in the kernel cache instead, it goes home with the kernels and on to the next
# cluster, for any model of the same torch and CPU: on the 16-core AMX host a first compiled job's first pass took
# 87.4 s without it and 36.4 s with it (docs/probes/long_jobs_regional_compile.json).
HEADERS_DIR = "precompiled_headers"
# g++ writes a header in place, so a build cut short (a job cancelled in its first compile) leaves a prefix, and
# inductor, finding the file, never builds it again: g++ passes over it (a kill at 22 of 150 MB: every kernel then
# compiled without it) or stops at it ("cannot read PCH file"). A header is marked whole, beside it with its size,
# by a job that compiled with it and ended; one not marked so is removed before anything compiles, and a shipped
# cache gives only marked ones.
WHOLE_MARK = ".whole"


def headers_kept_in(cache_dir: Path) -> bool:
    """Inductor builds and finds its precompiled headers in `cache_dir`/HEADERS_DIR; True where installed (a torch
    that keeps them otherwise keeps its own way). Before anything compiles."""
    try:
        from torch._inductor import codecache
    except ImportError:
        return False
    if not isinstance(getattr(codecache, "_HEADER_DIR", None), str):
        return False
    codecache._HEADER_DIR = str(cache_dir / HEADERS_DIR)
    codecache._HEADER_LOCK_DIR = str(cache_dir / HEADERS_DIR / "locks")
    return True


def headers_not_whole(sizes: dict[str, int], marks: dict[str, dict]) -> list[str]:
    """The precompiled headers (name: size) whose mark (name + WHOLE_MARK: {"bytes": size}) does not say they are
    whole at this size: cut short, or of unknown making. Pure."""
    return sorted(name for name, size in sizes.items() if marks.get(name + WHOLE_MARK, {}).get("bytes") != size)


def headers_marked_whole(cache_dir: Path) -> None:
    """After a compiled job that ended: every precompiled header in the cache is whole (inductor waits for g++
    before it compiles a kernel with one, and unmarked ones were removed before this job compiled)."""
    for header in (cache_dir / HEADERS_DIR).glob("*.gch"):
        mark, size = header.with_name(header.name + WHOLE_MARK), header.stat().st_size
        if read_json(mark).get("bytes") != size:
            write_whole(mark, {"bytes": size})


def headers_readied(cache_dir: Path, cold: bool, archives: list[Path]) -> list[str]:
    """Before anything compiles, on a node's first rank: the precompiled headers not known whole removed (inductor
    then builds them again); for cold kernels and no header left, a shipped cache's whole ones. The log's lines."""
    folder, lines = cache_dir / HEADERS_DIR, []
    headers = {header.name: header.stat().st_size for header in folder.glob("*.gch")}
    marks = {mark.name: read_json(mark) for mark in folder.glob(f"*.gch{WHOLE_MARK}")}
    if cut_short := headers_not_whole(headers, marks):
        for name in cut_short:
            (folder / name).unlink(missing_ok=True)
        lines.append(f"kernels: inductor's precompiled header {', '.join(cut_short)} removed: no job that compiled "
                     "with it ended (a build cut short?); inductor builds it again")
    if cold and len(cut_short) == len(headers) and (taken := headers_taken(archives, cache_dir)):
        lines.append(taken)
    return lines


def headers_archives(key: dict, entries: list[tuple[Path, dict | None]]) -> list[Path]:
    """The shipped caches that may hold precompiled headers for this job, where its own kernels were not
    shipped: those made under this torch and CPU ISA since ftc kept the headers with the kernels (their key
    says what compiled), whatever the model (the headers depend only on the compiler and its flags, and g++
    passes over one built otherwise); the last made first. Pure but for the file tests."""
    made_here = [artifacts for artifacts, meta in entries
                 if isinstance(meta, dict) and isinstance(meta.get("key"), dict) and "compiled" in meta["key"]
                 and (meta["key"].get("torch"), meta["key"].get("isa")) == (key["torch"], key["isa"])
                 and artifacts.is_file()]
    return sorted(made_here, key=lambda artifacts: artifacts.stat().st_mtime, reverse=True)


def headers_taken(archives: list[Path], cache_dir: Path) -> str:
    """The precompiled headers of the first of `archives` that holds them, into this node's kernel cache; the
    line for the log, '' where there were no archives to try."""
    tried = []
    for archive in archives:
        if not (failed := unpack_headers(archive, cache_dir)):
            return f"kernels: inductor's precompiled headers taken from the shipped cache {archive.stem}"
        tried.append(f"{archive.stem}: {failed}")
    if not tried:
        return ""
    return f"kernels: no shipped cache gave inductor's precompiled headers ({'; '.join(tried)}); inductor builds its own"


def unpack_headers(archive: Path, cache_dir: Path) -> str:
    """The whole precompiled headers of a shipped cache (marked so: WHOLE_MARK) into this node's kernel cache, with
    their marks, its kernels left out (another key's); '' when some came, else why not. Each file is moved in
    whole or not at all: inductor never builds again a header it finds."""
    partial = cache_dir / f".{HEADERS_DIR}.partial"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(archive) as tar:
            files = {member.name.split("/", 1)[1]: member for member in tar.getmembers()
                     if member.isfile() and member.name.count("/") == 1 and member.name.startswith(f"{HEADERS_DIR}/")}
            sizes = {name: member.size for name, member in files.items() if name.endswith(".gch")}
            marks = {name: json_object(tar.extractfile(member).read())
                     for name, member in files.items() if name.endswith(f".gch{WHOLE_MARK}")}
            whole = sorted(sizes.keys() - set(headers_not_whole(sizes, marks)))
            if not whole:
                return "it holds none known whole" if sizes else "it holds none"
            taken = [files[name] for header in whole for name in (header, header + WHOLE_MARK, header[:-4]) if name in files]
            tar.extractall(partial, members=taken, filter="data")
        (cache_dir / HEADERS_DIR).mkdir(parents=True, exist_ok=True)
        for header in sorted((partial / HEADERS_DIR).iterdir(), reverse=True):  # x.h.gch before the x.h it goes with
            os.replace(header, cache_dir / HEADERS_DIR / header.name)
        return ""
    except (OSError, EOFError, tarfile.TarError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        shutil.rmtree(partial, ignore_errors=True)
