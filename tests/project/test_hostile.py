"""Hostile inputs from ../shared/hostile: torchless never executes, imports or crashes.

The generator (``make_hostile.py``, standard library only) writes ~259 cases into a temp dir;
nothing is copied into the repo. Every case, and every third-party sample under
``hostile/corpus/``, is opened (``torchless.open`` + every tensor's ``.numpy()``) and loaded
(``torchless.load``) in worker subprocesses with ``RLIMIT_AS`` = 3 GiB and a per-case time
limit, so a bomb cannot take pytest down. The outcome is ``read`` (no error), ``reject`` (a
:class:`torchless.CheckpointError`) or a failure: ``foreign`` (any other exception),
``crash`` (the worker died) or ``timeout``.

What is asserted:

* the outcome is in the case's ``acceptable`` list, except for :data:`POLICY_DEVIATIONS`
  (each with its reason; the test asserts the deviation's actual outcome);
* no exception outside torchless's tree, and no rejection that is only torchless's
  catch-all wrapper around an internal bug (``InternalError``);
* no ``/tmp/PWNED_*`` marker appears and the workers' working directory stays empty;
* read cases give the values the manifest describes (:data:`EXPECTED`) and the values torch
  2.13 read with ``weights_only=True`` (the manifest's recorded summary);
* with an audit hook and a profiler installed (``_lsprof``, cProfile's C core: the same hook
  as ``sys.setprofile`` at a fraction of the cost), reading everything imports no module
  beyond ``import torchless``'s, raises no exec/compile/process/socket/file-write event and
  calls none of the globals the files name (:func:`test_audit_no_import_exec_or_watched_call`);
* ``hostile/check_reader.py`` grades ``tests/_hostile_adapter.py`` without any EXECUTED,
  crash, timeout, stray-file or partial-output line (a sample of the cases by default, all of
  them with ``TORCHLESS_HOSTILE_FULL=1``: each case costs a fresh interpreter there).

Cases rejected only because a layout is "not supported yet" count as rejections and are
listed by :func:`test_not_supported_yet_layouts` (an ``xfail`` where only reading is
acceptable), so they are re-checked when that layout lands; once a layout is read,
:data:`READ_ONCE_SUPPORTED` cases must read.

The timed pool runs alone (so no time limit is spent waiting for a CPU); check_reader and
the audit run share the two cores afterwards. About a minute in all, a quarter of it the
generator.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
WORKER = TESTS / "_hostile_worker.py"
#: Only for collecting parameter ids; the tests themselves locate it with ``shared_dir``.
_HOSTILE = REPO.parent / "shared" / "hostile"

MEM_LIMIT = 3 << 30
CASE_TIMEOUT = 20.0
#: The audit run only looks for imports and calls (hangs are the pool's business) and the
#: profiler slows call-heavy cases ~4x (pkl_tensor_alias_explosion: 4 s -> 16 s).
AUDIT_CASE_TIMEOUT = 120
WORKERS = 2
FULL = bool(os.environ.get("TORCHLESS_HOSTILE_FULL"))

OUTCOME_TO_MANIFEST = {"read": "read-safely", "reject": "reject"}

#: Where torchless deliberately differs from a case's ``acceptable`` list: id -> (outcome, why).
POLICY_DEVIATIONS: dict[str, tuple[str, str]] = {
    "torch_torchscript_real": (
        "read", "TorchScript archives are read as data by design: the issue requires exposing "
        "their parameters; code/ and constants.pkl are never run (format is 'torchscript')"),
    "key_lone_surrogate": (
        "read", "reading is not converting: a tensor name is returned as data; refusing it "
        "(InvalidKeyError) is the safetensors writer's job, and convert does (the "
        "check_reader job runs it through tests/_hostile_adapter.py)"),
    "key_reserved_metadata": (
        "read", "reading is not converting: '__metadata__' is only reserved in a safetensors "
        "header; refusing it (InvalidKeyError) is the safetensors writer's job"),
    "pkl_cycle_state_dict_self": (
        "read", "torch.load reads this file, and real checkpoints hold cycles (Hydra/OmegaConf "
        "configs point each node at its parent): the walk never follows an edge round a "
        "cycle, so naming stops and load() gives the same cyclic dict (issue 12)"),
}

#: Cases whose manifest note allows a rejection only while the layout is unsupported: once
#: torchless reads the layout (the rejection is no longer "not supported yet"), they must read.
READ_ONCE_SUPPORTED = {
    "tar_benign": "note: 'reject is acceptable if TAR support is dropped, with "
                  "UnsupportedFormatError'; torchless reads TAR checkpoints",
    "fmt_safetensors_as_pt": "torchless reads safetensors files (its own outputs) whatever "
                             "their name, with no pickle in them",
}

# ---------------------------------------------------------------------------
# Reference values, from the case descriptions and the generator's fixed contents
# ---------------------------------------------------------------------------
_W = np.arange(6, dtype=np.float32).reshape(2, 3)
_B = np.arange(2, dtype=np.int64)
#: The generator's ``benign_items()``: "w float32 2x3 = 0..5, b int64 [2] = [0, 1]".
_STANDARD = {"w": _W, "b": _B}
_ALL_DTYPES = {
    name: np.arange(5).astype(dt) for name, dt in [
        ("float", np.float32), ("double", np.float64), ("half", np.float16),
        ("bfloat16", ml_dtypes.bfloat16), ("long", np.int64), ("int", np.int32),
        ("short", np.int16), ("char", np.int8), ("byte", np.uint8)]
}
_ALL_DTYPES["bool"] = np.array([False, True, False, True, False])
_F12 = np.arange(12, dtype=np.float32).reshape(3, 4)
_RICH = {
    "f32": _F12,
    **{k: np.arange(5).astype(dt) for k, dt in [
        ("f64", np.float64), ("f16", np.float16), ("bf16", ml_dtypes.bfloat16),
        ("i64", np.int64), ("i32", np.int32), ("i16", np.int16), ("i8", np.int8),
        ("u8", np.uint8)]},
    "bool": np.array([True, False, True]),
    "c64": np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "transposed": _F12.T,
    "row_view": _F12[1],
    "tied": _F12,
    "expanded": np.ones(4, dtype=np.float32),
    "param": np.ones(2, dtype=np.float32),
}

#: id -> every tensor the file must yield when it is read, by flat name.
EXPECTED: dict[str, dict[str, np.ndarray]] = {
    **{cid: _STANDARD for cid in [
        # torch_zip() / benign_items() / legacy_stream() / torch_tar() defaults
        "zip_payload_in_other_entry", "polyglot_zip_then_pickle", "zip_constants_pkl_added",
        "zip_traversal_extra_entry", "zip_invalid_utf8_name", "zip_missing_version",
        "zip_trailing_junk", "zip_data_descriptor_mismatch", "zip_deflated_benign",
        "zip_zip64_benign", "zip_directory_entries", "zip_many_entries", "pkl_put_huge_index",
        "pkl_memoize_flood", "pkl_billion_laughs_dup", "pkl_billion_laughs_memo",
        "pkl_stack_leftover", "pkl_open_mark_at_stop", "pkl_trailing_after_stop",
        "pkl_inst_ordered_dict", "st_key_int", "st_pid_location_weird", "st_pid_location_cuda",
        "st_parameter_benign", "st_extra_unreferenced_record", "st_state_dict_metadata_build",
        "geo_big_endian", "legacy_benign", "legacy_trailing_junk", "tar_benign",
        "tar_traversal_member", "tar_absolute_member"]},
    "geo_all_dtypes": _ALL_DTYPES,
    "geo_stride0_small": {"w": np.tile(np.arange(3, dtype=np.float32), (4, 1)), "b": _B},
    "geo_scalar_0dim": {"w": np.array(0.0, dtype=np.float32), "b": _B},
    "geo_zero_elements": {"w": np.zeros((0, 3), dtype=np.float32), "b": _B},
    "geo_transposed_view": {"w": _W.T, "b": _B},
    "geo_shared_storage_views": {"w": _W, "w_row1": _W[1], "b": _B},
    "geo_tied_same_object": {"w": _W, "w_tied": _W, "b": _B},
    "key_path_traversal": {"../../../../../../tmp/PWNED_key_path_traversal": _W, "b": _B},
    "key_int": {"0": _W, "b": _B},
    "key_very_long": {"k" * 300_000: _W, "b": _B},
    "key_nul": {"w\x00.bin": _W, "b": _B},
    "key_duplicate": {"w": _B},  # last wins, like torch
    "key_lone_surrogate": {"w\ud800": _W, "b": _B},
    "key_reserved_metadata": {"__metadata__": _W, "b": _B},
    "nested_checkpoint": {"state_dict.w": _W, "state_dict.b": _B},
    "torch_benign_rich": _RICH,
    "torch_benign_rich_legacy": _RICH,
    "torch_torchscript_real": {"w": np.ones(2, dtype=np.float32)},
    "fmt_plain_list_pickle": {},
    "fmt_safetensors_as_pt": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
}
#: id -> non-tensor values load() must return, by flat name, as repr().
EXPECTED_LOADED: dict[str, dict[str, str]] = {
    "fmt_plain_list_pickle": {"0": "'a'", "1": "'b'", "2": "'c'"},
    "nested_checkpoint": {"epoch": "3", "hyper_parameters.lr": "0.1",
                          "hyper_parameters.name": "'x'",
                          "optimizer_states.0.param_groups.0.lr": "0.1"},
}

#: torch controls saved from one freshly initialised nn.Sequential(Linear(3, 2), LayerNorm(2)):
#: their values differ on every generation, so only the recorded geometry applies.
RANDOM_WEIGHTS = ("torch_benign_module_state_dict", "torch_benign_nested",
                  "torch_benign_no_crc", "torch_benign_protocol4")

# ---------------------------------------------------------------------------
# Third-party corpus (hostile/corpus/*/PROVENANCE.md says what each file is)
# ---------------------------------------------------------------------------
#: Files that may be read; every other corpus file is malicious or not a checkpoint at all
#: (ziplinter's archives hold no data.pkl, PNG/7z/encrypted files) and must be rejected.
CORPUS_MAY_READ = {
    "picklescan/data/new_pytorch_model.bin": "benign ZIP-format torch state dict (control)",
    "picklescan/data/pytorch_model.bin": "benign legacy-format checkpoint (control)",
    "picklescan/data/benign0_v0.pkl": "benign plain pickle ['a','b','c'], protocol 0",
    "picklescan/data/benign0_v3.pkl": "benign plain pickle ['a','b','c'], protocol 3",
    "picklescan/data/benign0_v4.pkl": "benign plain pickle ['a','b','c'], protocol 4",
    # Expansion (DoS) samples: the manifest accepts read-safely for the same attack
    # (pkl_billion_laughs_*) when sharing is kept; the time and memory limits enforce that.
    "pickle_injector/billionLaughs.pt": "billion laughs via DUP: no callable at all",
    "pickle_injector/billionLaughsAlt.pkl": "billion laughs via PUT/GET: no callable at all",
    "pickle_injector/globalLaughs.pt": "billion laughs through allow-listed OrderedDict",
}
#: Benign controls in a layout torchless reads: these must be read, not just survive.
CORPUS_MUST_READ = {"picklescan/data/new_pytorch_model.bin", "picklescan/data/pytorch_model.bin"}


def _shared_cases() -> dict[str, dict[str, Any]]:
    path = _HOSTILE / "manifest.json"
    if not path.is_file():
        return {}
    return {c["id"]: c for c in json.loads(path.read_text())["cases"]}


def _corpus_files() -> list[str]:
    root = _HOSTILE / "corpus"
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.suffix != ".md")


SHARED_CASES = _shared_cases()
CORPUS_FILES = _corpus_files()


def _ids(values: list[str]) -> list[Any]:
    return values or [pytest.param(None, marks=pytest.mark.skip(reason="../shared is missing"))]


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------
@dataclass
class Hostile:
    shared: Path  # .../shared/hostile
    root: Path  # the generated dir (cases/, manifest.json)
    cases: dict[str, dict[str, Any]]  # id -> generated manifest entry
    recorded: dict[str, dict[str, Any]]  # id -> shared manifest entry (torch's recordings)
    corpus: dict[str, str] = field(default_factory=dict)  # corpus relpath -> absolute path
    seconds: float = 0.0

    def path(self, cid: str) -> str:
        return str(self.root / self.cases[cid]["file"])


@pytest.fixture(scope="session")
def hostile(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    src = shared_dir / "hostile"
    out = tmp_path_factory.mktemp("hostile")
    cmd = [sys.executable, str(src / "make_hostile.py"), "--out", str(out)]
    have_torch = importlib.util.find_spec("torch") is not None
    if have_torch:
        cmd += ["--torch-benign", sys.executable]
    elif os.environ.get("TORCHLESS_REQUIRE_TORCH"):
        pytest.fail("torch is required for the torch.save controls but is not installed")
    t0 = time.monotonic()
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out, check=False)
    assert cp.returncode == 0, cp.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    cases = {c["id"]: c for c in manifest["cases"]}
    if have_torch:
        assert "torch_benign_rich" in cases, f"torch controls not generated: {cp.stderr[-2000:]}"
    corpus = {rel: str(src / "corpus" / rel) for rel in CORPUS_FILES}
    return Hostile(src, out, cases, SHARED_CASES, corpus, time.monotonic() - t0)


# ---------------------------------------------------------------------------
# Worker pool: one long-lived interpreter per worker, restarted after a crash or timeout
# ---------------------------------------------------------------------------
class _Worker:
    def __init__(self, cwd: Path) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "serve", str(MEM_LIMIT)], cwd=cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.buf = b""
        line = self._readline(time.monotonic() + 120)
        if not line:
            self.close()
            raise RuntimeError(f"worker did not start: {self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-2000:]

    def _readline(self, deadline: float) -> bytes | None:
        """A line; b"" at end of file; None when the deadline passes first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def run(self, path: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        t0 = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps({"path": path}) + "\n").encode())
            self.proc.stdin.flush()
            line = self._readline(t0 + timeout)
        except (BrokenPipeError, OSError):
            line = b""
        if line is None:
            self.close()
            return {"path": path, "outcome": "timeout", "seconds": round(time.monotonic() - t0, 2)}
        if not line:
            rc = self.proc.wait(timeout=30)
            return {"path": path, "outcome": "crash", "returncode": rc,
                    "stderr": self._stderr_tail()}
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.stderr.close()


def run_pool(paths: list[str], cwd: Path, workers: int = WORKERS) -> dict[str, dict[str, Any]]:
    todo: queue.Queue[str] = queue.Queue()
    for p in paths:
        todo.put(p)
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def loop() -> None:
        worker: _Worker | None = None
        try:
            while True:
                try:
                    path = todo.get_nowait()
                except queue.Empty:
                    return
                if worker is None:
                    worker = _Worker(cwd)
                res = worker.run(path, CASE_TIMEOUT)
                results[path] = res
                if res["outcome"] in ("timeout", "crash"):
                    worker.close()
                    worker = None
        except BaseException as e:  # surfaced by the caller
            errors.append(e)
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@dataclass
class Outcomes:
    by_path: dict[str, dict[str, Any]]
    cwd: Path
    seconds: float


@pytest.fixture(scope="session")
def outcomes(hostile: Hostile, tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    cwd = tmp_path_factory.mktemp("workers") / "cwd"
    cwd.mkdir()
    stale = _markers()
    assert not stale, f"remove stale markers before running: {sorted(stale)[:5]}"
    paths = [hostile.path(c) for c in hostile.cases] + list(hostile.corpus.values())
    t0 = time.monotonic()
    return Outcomes(run_pool(paths, cwd), cwd, time.monotonic() - t0)


def _markers() -> set[str]:
    return {str(p) for p in Path("/tmp").glob("PWNED_*")}


# ---------------------------------------------------------------------------
# Background jobs: check_reader.py and the audit run, side by side after the pool
# ---------------------------------------------------------------------------
@dataclass
class _Job:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    started: float
    extra: dict[str, Any] = field(default_factory=dict)

    def wait(self, timeout: float) -> tuple[int, str, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"{self.proc.args!r} still running after {timeout} s")
        return rc, self.out.read_text("utf-8", "replace"), self.err.read_text("utf-8", "replace")


def _start(cmd: list[str], cwd: Path, name: str, env: dict[str, str] | None = None) -> _Job:
    out, err = cwd.parent / f"{name}.out", cwd.parent / f"{name}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                env=env)
    return _Job(proc, out, err, time.monotonic())


def _check_reader_sample(hostile: Hostile) -> list[str]:
    """Every code-execution case and torch control, plus every 6th other case (all of them
    with TORCHLESS_HOSTILE_FULL=1): check_reader starts a fresh interpreter per case."""
    ids = list(hostile.cases)
    if FULL:
        return ids
    keep = {"code-exec", "torch-control"}
    rest = [c for c in ids if hostile.cases[c]["category"] not in keep]
    return [c for c in ids if hostile.cases[c]["category"] in keep] + rest[::6]


@pytest.fixture(scope="session")
def background(hostile: Hostile, outcomes: Outcomes,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Job]]:
    """check_reader.py and the audit run, side by side, once the timed pool has finished (so
    no case's time limit is spent waiting for a CPU)."""
    jobs: dict[str, _Job] = {}

    # check_reader.py over a manifest of the chosen cases, beside the generated one
    sample = _check_reader_sample(hostile)
    man = json.loads((hostile.root / "manifest.json").read_text())
    man["cases"] = [c for c in man["cases"] if c["id"] in set(sample)]
    sub = hostile.root / "manifest_check_reader.json"
    sub.write_text(json.dumps(man))
    cwd = tmp_path_factory.mktemp("check_reader") / "cwd"
    cwd.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    jobs["check_reader"] = _start(
        [sys.executable, str(hostile.shared / "check_reader.py"), "--manifest", str(sub),
         "--api", "tests._hostile_adapter:convert", "--error", "torchless:CheckpointError",
         "--mem", str(MEM_LIMIT), "--timeout", str(CASE_TIMEOUT),
         "--json", str(cwd.parent / "check_reader.json")], cwd, "check_reader", env)
    jobs["check_reader"].extra["n"] = len(sample)

    # the audit run: every generated case and every corpus file, hooks installed
    warm = [hostile.path(c) for c in AUDIT_WARMUP if c in hostile.cases]
    paths = [hostile.path(c) for c in hostile.cases] + list(hostile.corpus.values())
    exact, modules = watch_list(paths)
    spec = {"cases": paths, "warmup": warm, "watch_exact": sorted(exact),
            "watch_modules": sorted(modules), "timeout": AUDIT_CASE_TIMEOUT,
            "preload_codecs": sorted(TORCHLESS_CODECS)}
    cwd = tmp_path_factory.mktemp("audit") / "cwd"
    cwd.mkdir()
    (cwd.parent / "spec.json").write_text(json.dumps(spec))
    jobs["audit"] = _start([sys.executable, str(WORKER), "audit", str(MEM_LIMIT),
                            str(cwd.parent / "spec.json")], cwd, "audit")
    jobs["audit"].extra.update(exact=exact, modules=modules, cwd=cwd)
    yield jobs
    for job in jobs.values():
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


# ---------------------------------------------------------------------------
# Checks shared by the hostile cases and the corpus
# ---------------------------------------------------------------------------
def _describe(res: dict[str, Any]) -> str:
    err = res.get("error") or {}
    text = f"{res['outcome']}"
    if err:
        text += f" {err.get('type')} at {err.get('stage')}: {err.get('message', '')[:300]}"
    if res.get("traceback") or err.get("traceback"):
        text += "\n" + (err.get("traceback") or res.get("traceback"))
    if res.get("stderr"):
        text += f"\nrc={res.get('returncode')} stderr: {res['stderr'][-1500:]}"
    return text


def _not_supported_yet(res: dict[str, Any]) -> bool:
    err = res.get("error") or {}
    return (res["outcome"] == "reject" and err.get("type") == "UnsupportedError"
            and "not supported yet" in err.get("message", ""))


def assert_safe(res: dict[str, Any]) -> None:
    """The absolute rules: nothing ran, nothing foreign escaped, nothing hung or crashed."""
    assert not res.get("new_markers"), f"EXECUTED: marker(s) {res['new_markers']}"
    assert res["outcome"] in ("read", "reject"), _describe(res)
    if res["outcome"] == "reject":
        err = res["error"]
        assert "CheckpointError" in err["mro"], _describe(res)
        assert "InternalError" not in err["mro"], (
                f"a bug surfaced only through torchless's catch-all (cause {err['cause']}): "
                f"{_describe(res)}")


def _sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes() if arr.size else b"").hexdigest()


def _check_expected(cid: str, res: dict[str, Any]) -> list[str]:
    problems = []
    for key, text in EXPECTED_LOADED.get(cid, {}).items():
        if res["loaded"].get(key) != {"value": text}:
            problems.append(f"load() {key!r} = {res['loaded'].get(key)}, expected {text}")
    want = EXPECTED.get(cid)
    if want is None:
        return problems
    got = res["tensors"]
    if set(got) != set(want):
        problems.append(f"tensor names {sorted(map(repr, got))[:6]} != "
                        f"expected {sorted(map(repr, want))[:6]}")
    for name, arr in want.items():
        ent = got.get(name)
        if ent is None:
            continue
        exp = {"np_dtype": str(arr.dtype), "shape": list(arr.shape), "sha256": _sha(arr)}
        have = {k: ent.get(k) for k in exp}
        if have != exp:
            problems.append(f"{name[:40]!r}: got {have} values {ent.get('values')}, "
                            f"expected {exp} values {arr.ravel().tolist()[:16]}")
    return problems


def _check_against_torch(cid: str, res: dict[str, Any], hostile: Hostile) -> list[str]:
    """Compare with what torch 2.13 read (weights_only=True), recorded in the shared manifest."""
    rec = hostile.recorded.get(cid, {}).get("torch_weights_only_behaviour") or {}
    summary = rec.get("summary")
    if rec.get("outcome") != "loaded" or not summary:
        return []
    same_bytes = hostile.recorded[cid].get("sha256") == hostile.cases[cid].get("sha256")
    values_apply = same_bytes or cid not in RANDOM_WEIGHTS
    problems = []
    torch_tensors = {k: v for k, v in summary.items() if "dtype" in v}
    opened = {("<root>" if k == "" else k): v for k, v in res["tensors"].items()}
    if not any("alias_of" in v for v in summary.values()) and set(opened) != set(torch_tensors):
        problems.append(f"open(): names {sorted(opened)[:8]} != "
                        f"torch's {sorted(torch_tensors)[:8]}")
    for name, t in torch_tensors.items():
        for side, table in (("open()", opened), ("load()", res["loaded"])):
            ent = table.get(name)
            if ent is None:
                problems.append(f"{side}: no tensor {name[:40]!r} (torch has one)")
                continue
            keys = ["shape"] + (["sha256"] if values_apply and t.get("sha256") else [])
            if side == "open()":
                keys += ["dtype", "stride", "storage_offset"]
            diff = {k: (ent.get(k), t.get(k)) for k in keys if ent.get(k) != t.get(k)}
            if diff:
                problems.append(f"{side} {name[:40]!r} differs from torch (got, torch): {diff}")
    for key, v in summary.items():
        if "value" in v and res["loaded"].get(key) != v:
            problems.append(f"load() {key!r} = {res['loaded'].get(key)} but torch read {v}")
    return problems


# ---------------------------------------------------------------------------
# The generated cases
# ---------------------------------------------------------------------------
def test_pool_reports_timeout_and_crash(tmp_path: Path) -> None:
    """The harness itself: a worker that stops answering is a timeout, one that dies a crash."""
    stopped = _Worker(tmp_path)
    try:
        os.kill(stopped.proc.pid, signal.SIGSTOP)
        assert stopped.run(str(WORKER), timeout=0.5)["outcome"] == "timeout"
    finally:
        stopped.close()
    dead = _Worker(tmp_path)
    try:
        dead.proc.kill()
        dead.proc.wait()
        assert dead.run(str(WORKER), timeout=5)["outcome"] == "crash"
    finally:
        dead.close()
    assert not list(tmp_path.iterdir())


def test_generated_cases_match_shared_manifest(hostile: Hostile) -> None:
    """The generator is deterministic: its files are the ones torch's behaviour was recorded for."""
    assert len(hostile.cases) >= 250
    assert set(hostile.cases) <= set(hostile.recorded)
    missing = set(hostile.recorded) - set(hostile.cases)
    assert all(c.startswith("torch_") for c in missing), sorted(missing)
    differ = [c for c, e in hostile.cases.items()
              if e["category"] != "torch-control" and e["sha256"] != hostile.recorded[c]["sha256"]]
    assert not differ, f"generated bytes differ from the shared manifest: {differ}"
    assert set(POLICY_DEVIATIONS) <= set(hostile.recorded)
    assert set(EXPECTED) | set(READ_ONCE_SUPPORTED) <= set(hostile.recorded)


@pytest.mark.parametrize("case_id", _ids(sorted(SHARED_CASES)))
def test_hostile_case(case_id: str, hostile: Hostile, outcomes: Outcomes) -> None:
    if case_id not in hostile.cases:
        pytest.skip("not generated here (the torch.save controls need torch)")
    case = hostile.cases[case_id]
    res = outcomes.by_path[hostile.path(case_id)]
    assert_safe(res)
    got = res["outcome"]
    if case_id in POLICY_DEVIATIONS:
        want, why = POLICY_DEVIATIONS[case_id]
        assert got == want, f"documented deviation ({why}) no longer holds: {_describe(res)}"
        if case_id == "torch_torchscript_real":
            assert res["format"] == "torchscript"
    elif _not_supported_yet(res) and ("reject" not in case["acceptable"]
                                      or case_id in READ_ONCE_SUPPORTED):
        pytest.xfail(f"layout not supported yet: {res['error']['message'][-120:]}")
    else:
        if case_id in READ_ONCE_SUPPORTED:
            assert got == "read", f"{READ_ONCE_SUPPORTED[case_id]}; got {_describe(res)}"
        assert OUTCOME_TO_MANIFEST[got] in case["acceptable"], (
            f"{case['category']}: {case['description'][:200]}\n"
            f"acceptable {case['acceptable']}, got {_describe(res)}")
    if got == "read":
        problems = _check_expected(case_id, res) + _check_against_torch(case_id, res, hostile)
        assert not problems, "\n".join(problems)


def test_every_read_case_has_reference_values(hostile: Hostile, outcomes: Outcomes) -> None:
    """A case that reads without a reference in EXPECTED or in torch's recording is unchecked."""
    unchecked = []
    for cid in hostile.cases:
        res = outcomes.by_path[hostile.path(cid)]
        rec = hostile.recorded.get(cid, {}).get("torch_weights_only_behaviour") or {}
        if res["outcome"] == "read" and cid not in EXPECTED and cid not in RANDOM_WEIGHTS \
                and not (rec.get("outcome") == "loaded" and rec.get("summary")):
            unchecked.append(cid)
    assert not unchecked, f"read without reference values: {unchecked}"


def test_torch_controls_agree(hostile: Hostile, outcomes: Outcomes) -> None:
    """The four controls saved from one random model hold the same values; LayerNorm is 1/0."""
    present = [c for c in RANDOM_WEIGHTS if c in hostile.cases]
    if not present:
        pytest.skip("torch controls not generated")
    tables = {}
    for cid in present:
        res = outcomes.by_path[hostile.path(cid)]
        if res["outcome"] != "read":
            continue
        t = res["tensors"]
        tables[cid] = {k.removeprefix("state_dict."): v["sha256"] for k, v in t.items()}
        assert t[next(k for k in t if k.endswith("1.weight"))]["values"] == [1.0, 1.0]
        assert t[next(k for k in t if k.endswith("1.bias"))]["values"] == [0.0, 0.0]
    assert "torch_benign_module_state_dict" in tables
    first = tables["torch_benign_module_state_dict"]
    assert set(first) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    for cid, table in tables.items():
        assert table == first, cid


def test_no_marker_and_no_file_written(hostile: Hostile, outcomes: Outcomes) -> None:
    assert not _markers(), f"EXECUTED: {sorted(_markers())}"
    assert not list(outcomes.cwd.iterdir()), "reading wrote into the working directory"
    executed = {p: r["new_markers"] for p, r in outcomes.by_path.items() if r.get("new_markers")}
    assert not executed


def test_not_supported_yet_layouts(hostile: Hostile, outcomes: Outcomes) -> None:
    """Rejections that only say a layout is "not supported yet": listed for re-checking."""
    waiting = {p: r["error"]["message"] for p, r in outcomes.by_path.items()
               if _not_supported_yet(r)}
    for path, msg in sorted(waiting.items()):
        print(f"not supported yet: {Path(path).name}: {msg[-80:]}")
    pattern = re.compile(r"(legacy|tar|pickle) checkpoints are not supported yet")
    odd = {p: m for p, m in waiting.items() if not pattern.search(m)}
    assert not odd, f"'not supported yet' outside the legacy/TAR/pickle layouts: {odd}"


# ---------------------------------------------------------------------------
# Third-party corpus
# ---------------------------------------------------------------------------
def _provenance_files(root: Path) -> set[str]:
    listed = set()
    for prov in root.glob("*/PROVENANCE.md"):
        for m in re.finditer(r"^\| `([^`]+)` \|", prov.read_text(), re.MULTILINE):
            listed.add(f"{prov.parent.name}/{m.group(1)}")
    return listed


def test_corpus_is_classified(hostile: Hostile) -> None:
    """Every sample is described in its PROVENANCE.md; the may-read list names real files."""
    listed = _provenance_files(hostile.shared / "corpus")
    assert set(CORPUS_FILES) == listed
    assert set(CORPUS_MAY_READ) <= listed and CORPUS_MUST_READ <= set(CORPUS_MAY_READ)


@pytest.mark.parametrize("rel", _ids(CORPUS_FILES))
def test_corpus_sample(rel: str, hostile: Hostile, outcomes: Outcomes) -> None:
    res = outcomes.by_path[hostile.corpus[rel]]
    assert_safe(res)
    if rel in CORPUS_MUST_READ:
        if _not_supported_yet(res):
            pytest.xfail(f"layout not supported yet: {res['error']['message'][-120:]}")
        assert res["outcome"] == "read", f"benign control: {_describe(res)}"
    elif rel not in CORPUS_MAY_READ:
        assert res["outcome"] == "reject", f"malicious or not a checkpoint: {_describe(res)}"


# ---------------------------------------------------------------------------
# Imports and calls while reading everything
# ---------------------------------------------------------------------------
#: Benign files read first: the modules torchless imports lazily and the call sites of
#: watched builtins (Source's getattr(os, "O_BINARY")…) it uses on any file come from here.
AUDIT_WARMUP = ("torch_benign_rich", "torch_benign_rich_legacy", "torch_benign_nested",
                "torch_torchscript_real", "zip_deflated_benign", "zip_zip64_benign",
                "geo_big_endian", "geo_all_dtypes", "nested_checkpoint", "legacy_benign",
                "st_state_dict_metadata_build", "fmt_plain_list_pickle",
                "fmt_safetensors_as_pt")

#: Codecs torchless's own code decodes with (constant names, never taken from a file). Python
#: imports a codec's ``encodings.*`` module on first use, so they are looked up before the
#: audited reads; any other import during reading fails the audit.
TORCHLESS_CODECS = {
    "raw_unicode_escape": "the pickle VM's protocol-0 UNICODE opcode (vm.py op_UNICODE)",
    "cp437": "ZIP member names without the UTF-8 flag (_zip.py)",
}

#: Calls of a file-named global that torchless makes on purpose: (callee, caller) -> why.
ALLOWED_CALLS = {
    ("argparse.Namespace.__init__", "torchless/rules/stdlib.py:StdlibRules._r_namespace"):
        "the argparse.Namespace rebuild rule (Lightning hparams) builds a real Namespace, a "
        "data container whose __init__ only sets attributes (seen for rce_fallback_bait)",
    ("pathlib.Path.__new__", "torchless/rules/stdlib.py:StdlibRules._r_path"):
        "the pathlib rebuild rule builds a path from checked str parts, which touches no file "
        "(seen for gadget_pathlib_touch_chain, whose getattr(path, 'touch') is then refused)",
    ("builtins.getattr", "torchless/rules/resolver.py:TorchResolver._rule_method"):
        "the resolver looks up its own rule method, getattr(self, '_r_' + rule), once per rule "
        "of its own table (the rule names come from the table, never from the file); a case "
        "meets a rule the warm-up did not (seen for gadget_pathlib_touch_chain)",
}

#: Whole modules no reader may call into (README: "Callables that can only be there to attack").
WATCH_MODULES = {
    "subprocess", "_posixsubprocess", "runpy", "pty", "socket", "_socket", "pickle", "_pickle",
    "marshal", "code", "codeop", "importlib", "pip", "ensurepip", "ctypes", "_ctypes", "shutil",
    "timeit", "cProfile", "profile", "_lsprof", "pydoc", "bdb", "pdb", "trace", "idlelib",
    "venv", "webbrowser", "http", "urllib", "requests", "aiohttp", "smtplib", "ftplib",
    "imaplib", "telnetlib", "multiprocessing", "asyncio", "dill", "cloudpickle", "joblib",
    "distutils", "setuptools", "lib2to3", "torch", "pkgutil", "tempfile", "uuid",
}
#: Single functions of otherwise legitimate modules.
WATCH_EXACT = {
    *(("builtins", n) for n in ("eval", "exec", "compile", "__import__", "getattr", "setattr",
                                "delattr", "open", "input", "breakpoint", "__build_class__")),
    *((m, n) for m in ("os", "posix", "nt") for n in (
        "system", "popen", "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp",
        "execvpe", "spawnl", "spawnv", "spawnve", "posix_spawn", "posix_spawnp", "fork",
        "forkpty", "kill", "killpg", "remove", "unlink", "rmdir", "removedirs", "rename",
        "renames", "replace", "symlink", "link", "mkdir", "makedirs", "chmod", "chown",
        "truncate", "write", "putenv", "startfile")),
    ("sys", "exit"), ("_io", "open"), ("io", "open"), ("_io", "FileIO"), ("io", "FileIO"),
    ("logging", "FileHandler"), ("types", "CodeType"), ("types", "FunctionType"),
    ("operator", "attrgetter"), ("operator", "methodcaller"), ("_operator", "attrgetter"),
    ("_operator", "methodcaller"), ("functools", "partial"), ("numpy.testing", "runstring"),
}

_NAME = rb"[A-Za-z_][A-Za-z0-9_.]{0,200}"
_TEXT_GLOBAL = re.compile(rb"[ci](" + _NAME + rb")\n(" + _NAME + rb")\n")
_STRING_TOKEN = re.compile(rb"\x8c([\x01-\xff])|X([\x01-\xff][\x00-\x03]\x00\x00)|"
                           rb"V(" + _NAME + rb")\n|S'(" + _NAME + rb")'\n")
_MEMO_OP = re.compile(rb"\x94|q[\x00-\xff]|r[\x00-\xff]{4}|p\d+\n")


def _string_tokens(data: bytes) -> Iterator[tuple[int, int, str]]:
    for m in _STRING_TOKEN.finditer(data):
        if m.group(1) is not None:
            start, n = m.end(), m.group(1)[0]
        elif m.group(2) is not None:
            start, n = m.end(), int.from_bytes(m.group(2), "little")
        else:
            text = (m.group(3) or m.group(4)).decode("ascii")
            yield m.start(), m.end(), text
            continue
        raw = data[start:start + n]
        if len(raw) == n and re.fullmatch(_NAME, raw):
            yield m.start(), start + n, raw.decode("ascii")


def names_in(data: bytes) -> set[tuple[str, str]]:
    """``(module, name)`` pairs a pickle inside ``data`` names: GLOBAL/INST text forms and
    STACK_GLOBAL fed by two string opcodes (with memo ops between). A byte scan, never a parse:
    it only widens the watch list, so a stray match costs nothing."""
    found = {(m.decode(), n.decode()) for m, n in _TEXT_GLOBAL.findall(data)}
    tokens = list(_string_tokens(data))

    def skip_memo(pos: int) -> int:
        m = _MEMO_OP.match(data, pos)
        return m.end() if m else pos

    starts = {s: (e, t) for s, e, t in tokens}
    for _s, end, module in tokens:
        nxt = starts.get(skip_memo(end))
        if nxt and data[skip_memo(nxt[0]):skip_memo(nxt[0]) + 1] == b"\x93":
            found.add((module, nxt[1]))
    return found


def watch_list(paths: list[str]) -> tuple[set[tuple[str, str]], set[str]]:
    exact = set(WATCH_EXACT)
    for p in paths:
        for module, name in names_in(Path(p).read_bytes()):
            exact.add((module, name))
            if "." in name:  # pathlib.os.system style: watch what the dotted walk ends at
                head, _, tail = name.rpartition(".")
                exact.add((head, tail))
    return exact, set(WATCH_MODULES)


def test_watch_list_covers_the_files(hostile: Hostile) -> None:
    """The byte scan finds the payload globals the README and manifest name."""
    paths = [hostile.path(c) for c in hostile.cases] + list(hostile.corpus.values())
    exact, _ = watch_list(paths)
    for want in [("os", "system"), ("posix", "system"), ("builtins", "eval"),
                 ("builtins", "exec"), ("builtins", "getattr"), ("builtins", "__import__"),
                 ("runpy", "_run_code"), ("pickle", "loads"), ("subprocess", "run"),
                 ("_io", "FileIO"), ("torch.storage", "_load_from_bytes")]:
        assert want in exact, want
    assert len(exact) > 100


def test_audit_no_import_exec_or_watched_call(hostile: Hostile, background: dict[str, _Job],
                                              outcomes: Outcomes) -> None:
    """Every file once more, in one interpreter with an audit hook and a profiler: no import, no
    exec/compile/process/socket/file-write event, no call of a watched function, and no module
    beyond those ``import torchless`` and reading benign files bring in."""
    job = background["audit"]
    rc, out, err = job.wait(timeout=300)
    assert rc == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    print(f"audit: {len(report['results'])} files, {report['opens_total']} opens; "
          f"import torchless brought {len(report['imported_by_torchless'])} modules, "
          f"benign reads {report['lazy_imports_during_warmup']}, codecs {report['preloaded']}; "
          f"baseline call sites "
          f"{report['warmup_call_sites']}")
    stdlib = set(sys.stdlib_module_names)
    lazy_foreign = [m for m in report["lazy_imports_during_warmup"]
                    if m.partition(".")[0] not in stdlib | {"torchless", "numpy", "ml_dtypes"}]
    assert not lazy_foreign, f"benign reads imported non-stdlib modules: {lazy_foreign}"
    control = report["control"]  # the hooks do see an import, an eval and its compile/exec
    assert "import:colorsys" in control["events"], control
    assert {"compile", "exec"} <= {e.partition(":")[0] for e in control["events"]}, control
    assert {"builtins.eval <- audit.<locals>.control_case", "builtins.compile <- <top level>"} \
        <= set(control["calls"]), control
    assert all(m.startswith("encodings.") for m in report["preloaded"]), report["preloaded"]
    assert not report["warmup_events"], report["warmup_events"][:10]
    assert all(r["outcome"] == "read" for r in report["warmup"]), report["warmup"]
    assert not report["new_modules"], f"modules imported while reading: {report['new_modules']}"
    assert not report["events"], "\n".join(
        f"{e['event']} {e['args']} <- {Path(e['case']).name}" for e in report["events"][:30])
    calls = [c for c in report["calls"] if not any(
        c["callee"] == callee and c["site"].endswith(site) for callee, site in ALLOWED_CALLS)]
    assert not calls, "\n".join(
        f"{c['callee']} from {c['site']} <- {Path(c['case']).name}" for c in calls[:30])
    assert not report["odd_opens"], report["odd_opens"][:10]
    assert not list(job.extra["cwd"].iterdir()), "the audit run wrote into its directory"
    # the audit interpreter saw the same outcomes as the pool (no state leaks between cases)
    differ = [(r["path"], r["outcome"], outcomes.by_path[r["path"]]["outcome"])
              for r in report["results"]
              if r["outcome"] != outcomes.by_path[r["path"]]["outcome"]]
    assert not differ, differ[:10]


# ---------------------------------------------------------------------------
# The shared grader
# ---------------------------------------------------------------------------
def test_check_reader(hostile: Hostile, background: dict[str, _Job]) -> None:
    """check_reader.py over the adapter: no EXECUTED, crash, timeout, stray file or partial output.

    Its outcome-vs-acceptable verdicts are reported, not asserted (POLICY_DEVIATIONS and the
    per-case tests own that)."""
    job = background["check_reader"]
    rc, out, err = job.wait(timeout=900)
    lines = out.splitlines()
    summary = next((ln for ln in reversed(lines) if "cases ok" in ln), "")
    print(f"check_reader ({job.extra['n']} cases, {time.monotonic() - job.started:.0f} s): "
          f"{summary}")
    for ln in lines:
        if ln.startswith("BAD"):
            print(ln)
    assert summary, f"check_reader printed no summary (rc={rc}): {out[-2000:]} {err[-2000:]}"
    fatal = re.compile(r"EXECUTED|\bcrash\b|\btimeout\b|wrote extra files|partial output")
    bad = [ln for ln in lines if ln.startswith("BAD") and fatal.search(ln)]
    assert not bad, "\n".join(bad)
    allowed = {f"outcome 'read' not in acceptable {hostile.cases[c]['acceptable']}"
               for c in POLICY_DEVIATIONS if c in hostile.cases}
    results = json.loads((job.out.parent / "check_reader.json").read_text())
    unexpected = [r for r in results if not r["ok"]
                  and not (r["id"] in POLICY_DEVIATIONS and set(r["problems"]) <= allowed)]
    print("check_reader verdicts outside POLICY_DEVIATIONS:",
          [(r["id"], r["problems"]) for r in unexpected])
