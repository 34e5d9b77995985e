"""Subprocess side of tests/project/test_hostile.py: reads hostile files with torchless,
in isolation.

Never imported by pytest. Run as ``python _hostile_worker.py MODE MEM_BYTES [ARGS]`` with the
working directory set to an empty temp dir, so a payload that escaped could not hurt the
test process and any file it wrote would show up.

``serve``  reads JSON requests ``{"path": ...}`` from stdin, one a line, and answers each on
           the protocol pipe with what torchless did: ``read`` (open, every tensor's ``.numpy()``
           and ``load`` all succeeded; a summary of the values comes back), ``reject`` (a
           CheckpointError) or ``foreign`` (anything else). The parent enforces the time limit.
``audit``  reads every path listed in the JSON file ARGS[0] once, under ``sys.addaudithook``
           and ``sys.setprofile``, and prints one JSON report of the imports, audit events and
           calls of watched functions that happened while reading.

RLIMIT_AS is set before torchless is imported, so an allocation bomb ends as a MemoryError
(a ``foreign`` outcome) instead of taking the machine down.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import json
import os
import re
import resource
import signal
import sys
import time
import traceback
from typing import Any

MARKER_GLOB = "/tmp/PWNED_*"

#: Values are hashed like the manifest's torch probe does it (contiguous native bytes).
_HASH_LIMIT = 64 << 20


class _Timeout(BaseException):
    """SIGALRM in the audit run (the serve mode is timed by its parent)."""


def _markers() -> set[str]:
    return set(glob.glob(MARKER_GLOB))


def _set_limits(mem: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _protocol_stream() -> Any:
    """A private copy of stdout for answers; fd 1 then points at stderr, so nothing a
    payload or a library prints can corrupt the protocol."""
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", encoding="ascii", buffering=1)


def _values(arr: Any) -> list[Any] | None:
    import numpy as np

    if arr.size > 16:
        return None
    kind = arr.dtype.kind
    if kind == "c":
        return [[float(v.real), float(v.imag)] for v in arr.ravel()]
    if kind in "biu":
        return [v.item() for v in arr.ravel()]
    if arr.dtype.names:  # complex32 as a structured pair
        return None
    return [float(v) for v in arr.astype(np.float64).ravel()]


def _describe_array(arr: Any) -> dict[str, Any]:
    import numpy as np

    ent: dict[str, Any] = {"np_dtype": str(arr.dtype), "shape": list(arr.shape)}
    if arr.nbytes <= _HASH_LIMIT:
        data = np.ascontiguousarray(arr).tobytes() if arr.size else b""
        ent["sha256"] = hashlib.sha256(data).hexdigest()
        ent["values"] = _values(arr)
    else:
        ent["sha256"] = None
    return ent


def _walk_loaded(obj: Any) -> dict[str, Any]:
    """The manifest probe's walk (same caps, same key joining) over torchless.load()'s result."""
    import numpy as np

    summary: dict[str, Any] = {}
    seen: dict[int, str] = {}
    stack: list[tuple[str, Any, int]] = [("", obj, 0)]
    while stack:
        prefix, o, depth = stack.pop()
        if len(summary) > 200 or depth > 20:
            continue
        if isinstance(o, np.ndarray):
            summary[prefix or "<root>"] = _describe_array(o)
        elif isinstance(o, (dict, list, tuple)):
            if id(o) in seen:
                summary[prefix] = {"alias_of": seen[id(o)]}
                continue
            seen[id(o)] = prefix
            items = list(o.items())[:500] if isinstance(o, dict) else list(enumerate(o[:50]))
            for k, v in reversed(items):
                stack.append((f"{prefix}.{k}" if prefix else str(k), v, depth + 1))
        else:
            summary[prefix or "<root>"] = {"value": repr(o)[:80]}
    return summary


def _qualname(tp: type) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


def read_case(path: str, *, summarise: bool = True) -> dict[str, Any]:
    """Open, view every tensor, load; classify what happened."""
    import torchless

    res: dict[str, Any] = {"path": path}
    t0 = time.perf_counter()
    stage = "open"
    try:
        with torchless.open(path) as ckpt:
            res["format"] = ckpt.format
            res["unsupported"] = dict(ckpt.unsupported)
            stage = "numpy"
            tensors = {}
            for name, tensor in ckpt.tensors.items():
                arr = tensor.numpy()
                if summarise:
                    ent = _describe_array(arr)
                    ent.update(dtype=tensor.dtype.name, stride=list(tensor.stride),
                               storage_offset=tensor.storage_offset)
                    tensors[name] = ent
            res["tensors"] = tensors
        stage = "load"
        obj = torchless.load(path)
        if summarise:
            res["loaded"] = _walk_loaded(obj)
        res["outcome"] = "read"
    except _Timeout:
        raise
    except torchless.CheckpointError as e:
        res["outcome"] = "reject"
        res["error"] = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                        "message": str(e)[:600], "stage": stage,
                        "cause": _qualname(type(e.__cause__)) if e.__cause__ else None}
    except BaseException as e:
        res["outcome"] = "foreign"
        res["error"] = {"type": _qualname(type(e)), "message": str(e)[:600], "stage": stage,
                        "traceback": traceback.format_exc()[-2500:]}
    res["seconds"] = round(time.perf_counter() - t0, 3)
    return res


def serve(mem: int) -> int:
    _set_limits(mem)
    out = _protocol_stream()
    import torchless  # noqa: F401  (imported under the limit, before the first case)

    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        before = _markers()
        res = read_case(req["path"])
        res["new_markers"] = sorted(_markers() - before)
        out.write(json.dumps(res, default=repr) + "\n")
    return 0


# ---------------------------------------------------------------------------
# audit mode
# ---------------------------------------------------------------------------

#: Audit events that reading a checkpoint never has a reason to raise.
AUDIT_EVENTS = frozenset({
    "import", "exec", "compile", "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn",
    "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.startfile",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "socket.connect", "socket.bind",
    "socket.getaddrinfo", "urllib.Request", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
    "os.symlink", "os.link", "os.chmod", "os.chown", "os.truncate", "os.putenv", "os.unsetenv",
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.rmtree", "shutil.move",
    "shutil.make_archive", "shutil.unpack_archive", "pickle.find_class", "marshal.loads",
    "marshal.load", "builtins.input", "code.__new__", "function.__new__", "sys.settrace",
    "sys._getframe", "cpython.run_command", "cpython.run_file", "cpython.run_module",
    "webbrowser.open", "glob.glob", "os.listdir", "os.scandir", "os.walk", "tempfile.mkstemp",
    "tempfile.mkdtemp", "gc.get_referrers", "object.__setattr__",
})


_BUILTIN = re.compile(r"<built-in method ([\w.]+)\.(\w+)>")
_PROFILER_OFF = "<method 'disable' of '_lsprof.Profiler' objects>"
_METHOD = re.compile(r"<method '(\w+)' of '([\w.]+)' objects>")


def _code_name(code: Any, files: dict[str, str]) -> tuple[str, str] | None:
    """(module, qualified name) of a profiler entry's code: a code object for Python
    functions, a label such as ``<built-in method posix.system>`` for C functions."""
    if isinstance(code, str):
        m = _BUILTIN.fullmatch(code)
        if m:
            return m.group(1), m.group(2)
        m = _METHOD.fullmatch(code)
        if m:
            owner = m.group(2)
            mod, _, cls = owner.rpartition(".")
            return (mod or "builtins"), f"{cls}.{m.group(1)}"
        return None
    mod = files.get(code.co_filename)
    if mod is None:
        return None
    return mod, _qualname_of(code)


def _qualname_of(code: Any) -> str:
    return str(getattr(code, "co_qualname", code.co_name))  # co_qualname: Python >= 3.11


def _site(code: Any) -> str:
    if isinstance(code, str):
        return code
    return f"{code.co_filename}:{_qualname_of(code)}"


def audit(mem: int, spec_path: str) -> int:
    """Read every file once with hooks installed; print the report as JSON on the protocol.

    Calls are recorded with ``_lsprof`` (the C core of cProfile): it installs the same hook as
    ``sys.setprofile`` and sees every Python function and every C function called from Python,
    with its caller, at a fraction of the cost of a Python-level profile function.
    """
    _set_limits(mem)
    out = _protocol_stream()
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    watch_exact = {tuple(x) for x in spec["watch_exact"]}
    watch_modules = frozenset(spec["watch_modules"])

    def watched(name: tuple[str, str]) -> bool:
        mod, qual = name
        parts = mod.split(".")
        if any(".".join(parts[:i]) in watch_modules for i in range(1, len(parts) + 1)):
            return True
        return (mod, qual) in watch_exact or (mod, qual.partition(".")[0]) in watch_exact

    import _lsprof
    import codecs

    pre = set(sys.modules)
    import torchless

    for name in torchless.__all__:  # the public API loads lazily: load all of it now
        getattr(torchless, name)
    # so do NumPy and ml_dtypes, on the first value read: load them too
    from torchless.core.dtypes import DTYPES, ml_dtypes_by_name

    assert all(d.numpy is not None for d in DTYPES if d.view is not None)
    ml_dtypes_by_name()
    # and the readers of layouts and formats, imported when a file needs them: every module
    # of the package (the integrations import their frameworks; __main__ runs the CLI)
    import pkgutil

    for info in pkgutil.walk_packages(torchless.__path__, "torchless."):
        if not info.name.startswith(("torchless.integrations", "torchless.__main__")):
            importlib.import_module(info.name)
    by_import = sorted(set(sys.modules) - pre)
    current = {"case": "<warm-up>", "recording": False}
    events: list[dict[str, Any]] = []
    opens: list[dict[str, Any]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not current["recording"]:
            return
        if event == "open":
            path = args[0] if args else None
            mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
            opens.append({"case": current["case"],
                          "path": path if isinstance(path, str) else repr(path),
                          "mode": repr(mode),
                          "flags": flags if isinstance(flags, int) else repr(flags)})
        elif event in AUDIT_EVENTS:
            shown = args[0] if event == "import" and args else repr(args)[:300]
            events.append({"case": current["case"], "event": event, "args": shown})

    def alarm(signum: int, frame: Any) -> None:
        raise _Timeout

    signal.signal(signal.SIGALRM, alarm)
    sys.addaudithook(hook)
    profiler = _lsprof.Profiler()
    warm_sites: set[tuple[str, str]] = set()
    calls: list[dict[str, Any]] = []

    def collect(case: str) -> None:
        files = {getattr(m, "__file__", None): name for name, m in list(sys.modules.items())}
        stats = profiler.getstats()
        pairs = [(sub.code, _site(entry.code)) for entry in stats for sub in entry.calls or ()]
        as_callee = {id(code) for code, _ in pairs} | {code for code, _ in pairs
                                                        if isinstance(code, str)}
        # a function called straight from the frame that enabled the profiler has no caller
        pairs += [(entry.code, "<top level>") for entry in stats
                  if id(entry.code) not in as_callee and entry.code not in as_callee
                  and entry.code != _PROFILER_OFF]
        for code, caller in pairs:
            name = _code_name(code, files)
            if name is None or not watched(name):
                continue
            key = (f"{name[0]}.{name[1]}", caller)
            if case == "<warm-up>":
                warm_sites.add(key)
            elif key not in warm_sites:
                calls.append({"case": case, "callee": key[0], "site": caller})
        profiler.clear()

    def run(paths: list[str], warmup: bool) -> list[dict[str, Any]]:
        results = []
        for path in paths:
            case = "<warm-up>" if warmup else path
            current["case"] = case
            signal.alarm(spec["timeout"])
            profiler.enable(subcalls=True, builtins=True)
            try:
                res = read_case(path, summarise=False)
            except _Timeout:
                res = {"path": path, "outcome": "timeout"}
            finally:
                profiler.disable()
                signal.alarm(0)
            collect(case)
            results.append({"path": path, "outcome": res["outcome"], "seconds": res.get("seconds"),
                            "error": res.get("error", {}).get("type")})
        return results

    # Warm-up: modules and call sites torchless itself uses while reading benign files.
    current["recording"] = True
    warm = run(spec["warmup"], warmup=True)
    current["recording"] = False
    warm_events, warm_opens = list(events), len(opens)
    events.clear()
    opens.clear()
    lazy = sorted(set(sys.modules) - pre - set(by_import))
    for name in spec["preload_codecs"]:
        codecs.lookup(name)
    baseline = set(sys.modules)

    current["recording"] = True
    results = run(spec["cases"], warmup=False)
    current["recording"] = False
    new_modules = sorted(set(sys.modules) - baseline)

    case_paths = set(spec["cases"])
    write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    odd_opens = [o for o in opens if o["path"] not in case_paths
                 or (isinstance(o["flags"], int) and o["flags"] & write)
                 or o["mode"] not in ("None", "'r'", "'rb'")]

    # Positive control: the same hooks must see an import, an eval and its compile/exec.
    def control_case() -> None:
        __import__("colorsys")
        eval("1 + 1")

    current.update(case="<control>", recording=True)
    profiler.enable(subcalls=True, builtins=True)
    control_case()
    compile("2 + 2", "<control>", "eval")  # a top-level call: no caller entry in the profile
    profiler.disable()
    current["recording"] = False
    collect("<control>")
    control = {"events": [e["event"] + ":" + str(e["args"])[:40] for e in events
                          if e["case"] == "<control>"],
               "calls": [f"{c['callee']} <- {c['site'].rpartition(':')[2]}" for c in calls
                         if c["case"] == "<control>"]}
    events[:] = [e for e in events if e["case"] != "<control>"]
    calls[:] = [c for c in calls if c["case"] != "<control>"]

    report = {
        "imported_by_torchless": by_import,
        "lazy_imports_during_warmup": lazy,
        "preloaded": sorted(baseline - pre - set(by_import) - set(lazy)),
        "warmup": warm,
        "warmup_events": warm_events,
        "warmup_opens": warm_opens,
        "warmup_call_sites": sorted(f"{c} <- {s}" for c, s in warm_sites),
        "new_modules": new_modules,
        "control": control,
        "events": events,
        "calls": calls,
        "opens_total": len(opens),
        "odd_opens": odd_opens,
        "results": results,
    }
    out.write(json.dumps(report, default=repr) + "\n")
    return 0


def main(argv: list[str]) -> int:
    mode, mem = argv[0], int(argv[1])
    if mode == "serve":
        return serve(mem)
    if mode == "audit":
        return audit(mem, argv[2])
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
