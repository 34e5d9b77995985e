"""Which globals a file may name at all.

torchless never imports or calls a global, so no name can run code here. The
policy exists to *report*: a file that names ``os.system`` was built to
attack whoever loads it with torch, and we refuse it with
:class:`UnsafeGlobalError` rather than quietly return its weights.

Order of judgement for ``module.name`` (after Python 2 names are mapped):

1. Names that are not plain dotted identifiers, or that walk through a dunder
   attribute (``numpy.__builtins__``) or through lower-case attributes
   (``pathlib`` + ``os.system``), are refused.
2. Globals the rebuild rules know are allowed (the rules decide what they are); they are
   judged first, being exact names (``zoneinfo.ZoneInfo._unpickle`` walks an attribute).
3. Modules in a family that runs code, touches files, processes or the
   network, imports, or deserializes, are refused — every name in them.
4. ``strict=True`` refuses everything outside the rules.
``allow`` (exact ``module.name`` strings from the user) overrides 3-4.

The reader then asks the scanner's allowlist (:mod:`.allowlist`) what the name is: a name it
calls dangerous (a class whose constructor writes files, ``sympy``'s string evaluation …) is
refused, and so is every *call* the execution model calls dangerous or that calls a function
nobody vetted (:class:`~torchless.rules.resolver.TorchResolver`); a plain reference to a
function, never called, is kept as an inert record. So the reader refuses what ``torchless
scan`` calls dangerous.
"""

from __future__ import annotations

import re

__all__ = ["DENIED_MODULE_FAMILIES", "PYTHON_CONSTANTS", "TORCH_CONSTANTS", "judge",
           "torch_constant"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENT}(?:\.{_IDENT})*\Z")

#: torch attributes that are plain enumeration values (layouts, memory formats, qschemes).
TORCH_CONSTANTS: frozenset[str] = frozenset({
    "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn",
    "jagged", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
    "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
    "per_channel_affine_float_qparams",
})


#: The language's own constants that pickle writes as a global of ``builtins`` (``...`` and
#: ``NotImplemented`` have no opcode of their own): values, not code.
PYTHON_CONSTANTS: dict[str, object] = {"Ellipsis": Ellipsis, "NotImplemented": NotImplemented}


def torch_constant(module: str, name: str) -> str | None:
    """The torch constant ``module.name`` names, or None: ``torch.<constant>``, or
    ``<torch submodule>.torch.<constant>``, which is how pickle protocols 4 and 5 write a
    memory format: its ``__reduce__`` gives the dotted text ``torch.channels_last``, and
    pickle names the first module that reaches the object through it (``torch._utils``, which
    imports torch). Not an attribute walk to refuse: it ends at an inert value."""
    if module == "torch":
        return name if name in TORCH_CONSTANTS else None
    head, _, const = name.partition(".")
    if head == "torch" and const in TORCH_CONSTANTS and module.startswith("torch."):
        return const
    return None


#: Module prefixes (the module itself and every submodule) whose names are refused.
DENIED_MODULE_FAMILIES: frozenset[str] = frozenset({
    # processes, shells, the interpreter itself
    "os", "posix", "nt", "subprocess", "sys", "pty", "signal", "resource", "platform",
    "sysconfig", "site", "multiprocessing", "threading", "_thread", "concurrent",
    "asyncio", "_posixsubprocess", "_winapi", "msvcrt", "winreg", "_signal",
    # code execution, compilation, import machinery
    "builtins", "__builtin__", "__builtins__", "runpy", "importlib", "imp", "zipimport",
    "pkgutil", "code", "codeop", "compileall", "py_compile", "types", "inspect", "ast",
    "dis", "pdb", "bdb", "trace", "timeit", "cProfile", "profile", "pstats", "doctest",
    # functools.partial, types.SimpleNamespace and uuid.UUID are rebuild rules
    "unittest", "idlelib", "lib2to3", "operator", "_operator", "functools", "copy",
    "ctypes", "_ctypes", "cffi", "gc", "weakref", "_weakref", "atexit", "faulthandler",
    "tracemalloc", "linecache", "tokenize",
    # deserializers (a nested loader runs the payload it is given)
    "pickle", "_pickle", "cPickle", "pickletools", "marshal", "shelve", "dbm", "copyreg",
    "copy_reg", "dill", "cloudpickle", "joblib", "jsonpickle", "yaml", "_yaml", "ruamel",
    # files and archives
    "io", "_io", "shutil", "tempfile", "glob", "fileinput", "filecmp", "zipfile", "tarfile",
    "gzip", "bz2", "lzma", "zlib", "mmap", "logging", "sqlite3", "_sqlite3", "mailbox",
    "distutils", "setuptools", "pkg_resources", "pip", "ensurepip", "venv", "_distutils_hack",
    # network
    "socket", "_socket", "ssl", "select", "selectors", "http", "urllib", "urllib2",
    "urllib3", "requests", "httpx", "aiohttp", "ftplib", "smtplib", "poplib", "imaplib",
    "nntplib", "telnetlib", "xmlrpc", "socketserver", "wsgiref", "webbrowser", "cgi",
    "cgitb", "asyncore", "asynchat", "smtpd",
    # user interface and help machinery that shells out
    "pydoc", "pydoc_data", "tkinter", "turtle", "uuid", "getpass", "readline", "rlcompleter",
    "curses", "antigravity", "this",
    # torch code paths: native classes, loaders, compilers, JIT, packaging, extensions.
    # (torch._dynamo, torch.fx, torch.export, torch.distributed and torch.testing are not
    # here: torch itself pickles their data classes into checkpoints (a jagged tensor's
    # _DimRange, DCP metadata, TwoTensor); their functions are refused by rule 4.)
    "torch._C", "torch.jit", "torch.hub", "torch.package", "torch.serialization",
    "torch.storage", "torch.utils.collect_env", "torch.utils.cpp_extension",
    "torch.utils.bottleneck", "torch.utils.data", "torch.utils.benchmark",
    "torch.utils.tensorboard", "torch.utils.model_zoo", "torch.utils._zip",
    "torch.multiprocessing", "torch._inductor", "torch.compiler", "torch.onnx", "torch.cuda",
    "torch.backends", "torch.library", "torch._library", "torch.ops", "torch._ops",
    "torch.overrides", "torch._weights_only_unpickler",
    # numpy code paths
    "numpy.testing", "numpy.f2py", "numpy.distutils", "numpy.lib.npyio", "numpy.lib.format",
    "numpy.ctypeslib", "numpy.lib.utils", "numpy.load", "numpy._pytesttester",
    # other ML loaders that deserialize or run code
    "transformers.dynamic_module_utils", "huggingface_hub", "keras", "tensorflow",
    "IPython", "jupyter_client", "nbconvert",
})

def _family(module: str, families: frozenset[str]) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in families for i in range(1, len(parts) + 1))


def judge(module: str, name: str, *, known: bool, strict: bool,
          allow: frozenset[str]) -> str | None:
    """Return None if the global may stand, else the reason it is refused."""
    if known:  # exact entries of the rule table
        return None
    if not _DOTTED.match(module) or not _DOTTED.match(name):
        return "is not a valid dotted Python name"
    segments = name.split(".")
    if any(s.startswith("__") and s.endswith("__") for s in segments):
        return "reaches a dunder attribute"
    if len(segments) > 1 and not all(s[:1].isupper() for s in segments):
        return "walks attributes through a dotted name"
    if f"{module}.{name}" in allow:
        return None
    if strict:
        return "is outside the rebuild rules (strict mode)"
    if _family(module, DENIED_MODULE_FAMILIES) and not (
            module.startswith("torch.") or module == "torch"):
        return "belongs to a module that can run code, touch files, processes or the network"
    return None
