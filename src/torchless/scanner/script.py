"""What the code of a TorchScript archive refers to, parsed as Python (never compiled or run).

``torch.jit.load`` (and ``torch.load`` of a TorchScript archive with
``weights_only=False``) compiles the text in ``code/`` and runs some of it while loading:
every ``__setstate__`` of a scripted class runs as its object is unpickled. That code can call
any operator torch has, and some of them touch files or the network:
``torch.from_file(name, shared=True, size)`` creates and maps a file, ``torch.save`` writes
one, ``rpc_async`` talks to another process. The pickles of the archive show none of this.

Serialized TorchScript is Python syntax, so each ``code/**/*.py`` member is parsed with
:func:`ast.parse` (bounded: :data:`MAX_CODE_BYTES`; text that does not parse is a problem,
never clean) and every *reference* to an operator is resolved the way torch's source importer
resolves names: ``torch.X`` is ``aten::X`` (``torch.autograd`` is ``torch`` again), ``ops.ns.X``
and ``torch.ops.ns.X`` are ``ns::X``, an attribute of an operator (``.default``) is the same
operator, ``torch.classes.ns.C`` and ``__torch__.torch.classes.ns.C`` a custom class, bare names
the builtins TorchScript exposes, all through the module's own bindings (assignments, imports,
``getattr`` with a constant name, parameters shadowing). A reference counts whether or not it
is called: ``rpc_async("w", torch.save, ...)`` names ``aten::save``.

Vetting is by allowlist (:mod:`.script_ops`, generated from torch's registry): an operator
torch registers in a namespace that computes on tensors is vetted, a file, process or network
operator is dangerous, any other name of torch's is *unvetted*, one from a namespace outside
torch and its domain libraries (or a custom class not torch's own) *unknown*. What this
proves and what not is said in ``docs/scan.md``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from torchless.scanner.script_ops import CLASSES, REGISTERED

__all__ = ["DANGEROUS", "KNOWN_NAMESPACES", "MAX_CODE_BYTES", "MAX_CODE_TOTAL",
           "VETTED_NAMESPACES", "ScriptCall", "script_calls"]

#: Members longer than this (in characters) are not parsed: hostile text costs up to about
#: 6 us and 750 bytes of parse tree per character (512 KiB of ``a,``: 3 s and 390 MB here);
#: real serialized code files are kilobytes (the largest in the corpus: 8.6 kB).
MAX_CODE_BYTES = 512 << 10
#: Characters of code parsed in one archive (a few members at most this large).
MAX_CODE_TOTAL = 8 * MAX_CODE_BYTES

#: Operators that read, write or map files, or reach other processes, with the reason.
DANGEROUS: dict[str, str] = {
    "aten::from_file": "creates, reads and maps a file (torch.from_file)",
    "aten::save": "writes a file (torch.save inside TorchScript code)",
    "aten::load": "reads a file (torch.load inside TorchScript code)",
    "aten::_load_for_mobile": "reads a file",
    "debugprims::load_tensor": "reads a tensor from a content store on disk",
    "prim::rpc_async": "calls another process over RPC",
    "prim::rpc_sync": "calls another process over RPC",
    "prim::rpc_remote": "calls another process over RPC",
    "aten::to_here": "fetches a value from another process over RPC",
}
#: Namespaces whose every operator talks to other processes (collectives, symmetric memory).
DANGEROUS_NAMESPACES: dict[str, str] = {
    ns: "communicates with other processes (distributed collectives)"
    for ns in ("c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem",
               "_dtensor")}
#: Registered namespaces whose operators only compute on tensors and scalars (the allowlist;
#: ``DANGEROUS`` entries excepted). Others torch registers (profiler, inductor, _test,
#: export, ...) are unvetted.
VETTED_NAMESPACES = frozenset({"aten", "prim", "prims", "quantized", "_quantized",
                               "quantization", "mkldnn", "mkldnn_prepacked", "mkl", "onednn",
                               "sparse", "rngprims", "static_runtime", "onnx", "_native"})
#: Namespaces of torch's own custom classes whose methods compute on tensors (packed
#: weights of quantized, sparse and recurrent layers).
VETTED_CLASS_NAMESPACES = frozenset({"quantized", "sparse", "rnn", "mkldnn"})
#: Operator namespaces of torch and its domain libraries; an operator from any other comes
#: from a native library the loading process must have loaded, and what it does cannot be
#: read from the file.
KNOWN_NAMESPACES = frozenset(REGISTERED) | {"torchvision", "torchaudio", "torchtext",
                                            "_caffe2", "profiler"}
#: Methods that reach an operator in ``DANGEROUS`` through a value (``rref.to_here()``): the
#: dangerous operators whose schema takes ``self`` first.
DANGEROUS_METHODS: dict[str, str] = {"to_here": "aten::to_here"}
#: Bare names the TorchScript compiler resolves itself; calling one computes on values.
VETTED_BUILTINS = frozenset((
    "print range len int float bool str complex tuple list dict min max abs all any sum "
    "divmod ord chr bin hex oct pow round hash id isinstance getattr hasattr enumerate zip "
    "sorted reversed iter next annotate unchecked_cast uninitialized fork wait CONSTANTS "
    "inf nan infj nanj super Exception ValueError RuntimeError AssertionError TypeError "
    "KeyError IndexError NotImplementedError StopIteration ZeroDivisionError OverflowError "
    "AttributeError ArithmeticError LookupError "
    "Tensor Optional List Dict Tuple Union Any NoneType Final Future Await RRef Device "
    "Module NamedTuple Enum Interface"
).split())
#: Bare names that reach other processes, as the operator they emit.
_BARE_DANGEROUS = {"rpc_async": "prim::rpc_async", "rpc_sync": "prim::rpc_sync",
                   "rpc_remote": "prim::rpc_remote", "remote": "prim::rpc_remote"}
#: Rounds of alias propagation (``a = torch``; ``b = a``): a longer chain is a problem.
_MAX_ROUNDS = 16
#: Namespaces one name may stand for before the code is called too tangled to follow.
_MAX_MEANINGS = 32

# A meaning is a small tuple: ("ns", "aten") a namespace whose attributes are operators,
# ("ops",) the root of ``ops``, ("classes", ns) custom classes, ("pkg", p) the archive's own
# ``__torch__`` classes, ("op", "ns::name"), ("class", "ns.Name"), ("builtin", name),
# ("method", name) an attribute of a value, ("unbound", name), ("value",) anything else.
Meaning = tuple[str, ...]
_LINE_END = re.compile(r"\r\n|\r|\n")
_VALUE: Meaning = ("value",)
_NAMESPACE_KINDS = frozenset({"ns", "ops", "classes", "pkg", "builtin"})
#: Nodes that may be references (a name read, an attribute, ``getattr(x, "y")``, imports).
_CANDIDATES = frozenset({ast.Name, ast.Attribute, ast.Call, ast.Import, ast.ImportFrom})
#: Fields that hold no node with children: the contexts, the operators (``op``, ``ops``:
#: ``Add``, ``Eq`` …, which bind and refer to nothing), and what the grammar types
#: ``identifier``, ``int`` or ``string`` (names, levels, flags, type comments).
_NOT_NODES = frozenset({"ctx", "id", "attr", "name", "arg", "module", "asname", "level",
                        "kind", "type_comment", "conversion", "is_async", "op", "ops"})


def _child_fields(kind: type[ast.AST]) -> tuple[str, ...]:
    """The fields of a node type that may hold child nodes: all of ``_fields`` but the
    ``ctx`` of a name, attribute or subscript (a Load, Store or Del) and the operators,
    which have no children and bind nothing."""
    if kind is ast.Constant:  # its value is a Python constant, never a node
        return ()
    return tuple(f for f in kind._fields if f not in _NOT_NODES)


#: Nodes that bind names (and a Name stored or deleted: :meth:`_Module._walk` takes it first).
_BINDS = frozenset({ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.AugAssign, ast.For,
                    ast.AsyncFor, ast.comprehension, ast.withitem, ast.ExceptHandler,
                    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal})


#: The values whose meanings may change as the bindings are followed (:meth:`_Module._values`
#: reads every other expression as a plain value).
_FOLLOWED_VALUES = frozenset({ast.Attribute, ast.Call, ast.Name, ast.IfExp, ast.NamedExpr})
#: What :meth:`_Module._walk` does at a node of each type besides visiting its children
#: (bits: a candidate reference, a binding site, a function or lambda, a class).
_CANDIDATE, _BINDING, _FUNCTION, _CLASS = 1, 2, 4, 8
#: Each node type's child fields and role bits (:func:`_kind_info`), made as met.
_KINDS: dict[type, tuple[tuple[str, ...], int]] = {}
#: The nodes whose parent is asked for (:meth:`_Module._tops`, :meth:`_Module._report`,
#: :meth:`_Module._followed`): the candidates, and what a followed namespace passes through.
_PARENTED = _CANDIDATES | {ast.NamedExpr, ast.IfExp, ast.Tuple, ast.List}


def _kind_info(kind: type[ast.AST]) -> tuple[tuple[str, ...], int]:
    role = (_CANDIDATE if kind in _CANDIDATES else 0) | (_BINDING if kind in _BINDS else 0)
    if kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda):
        role |= _FUNCTION
    elif kind is ast.ClassDef:
        role |= _CLASS
    return _child_fields(kind), role


@dataclass(frozen=True)
class ScriptCall:
    """One operator the code refers to (``aten::linear``, ``myns::op``, ``class myns.Thing``),
    where its reference starts in the member (bytes of its UTF-8 text), and why it matters:
    ``danger`` for file and process access, ``unknown`` for code from a native library
    outside torch, ``unvetted`` for a name no allowlist vets. ``problem`` (``op`` empty):
    code that could not be read (does not parse, too large, too tangled)."""

    op: str
    offset: int
    danger: str = ""
    unknown: bool = False
    unvetted: bool = False
    problem: str = ""


def script_calls(text: str) -> list[ScriptCall]:
    """Every operator the code refers to, in text order; or one problem."""
    if len(text) > MAX_CODE_BYTES:
        return [ScriptCall("", 0, problem=f"{len(text)} characters of code, more than the "
                           f"{MAX_CODE_BYTES} parsed")]
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        where = f" (line {e.lineno})" if isinstance(e.lineno, int) else ""
        return [ScriptCall("", 0, problem=f"does not parse as Python: {e.msg[:200]}{where}")]
    except ValueError as e:  # NUL bytes (Python < 3.12)
        return [ScriptCall("", 0, problem=f"does not parse as Python: {str(e)[:200]}")]
    except (RecursionError, MemoryError):
        return [ScriptCall("", 0, problem="nested too deeply to parse")]
    return _Module(text, tree).calls()


def _classify_class(name: str, offset: int) -> ScriptCall:
    """A custom class: torch's own packed-weight classes are vetted (a quantized model's
    code names them), torch's others unvetted, any other comes from a native library."""
    op = f"class {name}"
    if name in CLASSES and name.split(".")[0] in VETTED_CLASS_NAMESPACES:
        return ScriptCall(op, offset)
    return ScriptCall(op, offset, unvetted=True) if name in CLASSES else \
        ScriptCall(op, offset, unknown=True)


def _classify(op: str, offset: int) -> ScriptCall:
    ns, _, name = op.partition("::")
    if op in DANGEROUS:
        return ScriptCall(op, offset, DANGEROUS[op])
    if ns in DANGEROUS_NAMESPACES:
        return ScriptCall(op, offset, DANGEROUS_NAMESPACES[ns])
    if ns in VETTED_NAMESPACES and name in REGISTERED.get(ns, ()):
        return ScriptCall(op, offset)
    if ns in KNOWN_NAMESPACES:
        return ScriptCall(op, offset, unvetted=True)
    return ScriptCall(op, offset, unknown=True)


def _attr(meaning: Meaning, name: str) -> Meaning:
    """What ``meaning.name`` stands for (torch's source importer: ``torch`` is a builtin
    module of ``aten``, whose ``autograd`` is itself and whose other attributes are
    operators; an operator's attributes are its overloads)."""
    kind = meaning[0]
    if kind == "ns":
        if meaning[1] == "aten" and name == "ops":
            return ("ops",)
        if meaning[1] == "aten" and name == "classes":
            return ("classes", "")
        if name == "autograd":
            return ("ns", "aten")
        return ("op", f"{meaning[1]}::{name}")
    if kind == "ops":
        return ("ns", name)
    if kind == "classes":
        return ("classes", name) if not meaning[1] else ("class", f"{meaning[1]}.{name}")
    if kind == "pkg":
        if meaning[1] == "" and name == "torch":
            return ("pkg", "torch")
        return ("classes", "") if meaning[1] == "torch" and name == "classes" else ("pkg", "x")
    if kind in ("op", "class"):
        return meaning
    return ("method", name)


_GLOBALS: dict[str, Meaning] = {"torch": ("ns", "aten"), "ops": ("ops",),
                                "__torch__": ("pkg", "")}
_GLOBALS.update({name: ("builtin", name) for name in VETTED_BUILTINS | set(_BARE_DANGEROUS)})
#: The global names whose references :meth:`_Module._tops` reports wherever they appear
#: (torch's namespaces, dangerous builtins, ``getattr``), made once.
_WORTH = frozenset(name for name, meaning in _GLOBALS.items() if meaning[0] != "builtin" or
                   name in _BARE_DANGEROUS or name == "getattr")


class _Scope:
    """Names bound in one module, class or function body (flow-insensitive: TorchScript
    looks a name up in the enclosing scopes until it is assigned, so an assignment adds to
    what the name can mean; a parameter replaces it)."""

    def __init__(self, parent: _Scope | None, function: bool) -> None:
        self.parent = parent
        self.function = function
        self.params: set[str] = set()
        self.bound: dict[str, set[Meaning]] = {}

    def lookup(self, name: str) -> set[Meaning]:
        scope: _Scope | None = self
        out: set[Meaning] = set()
        bound = False
        while scope is not None:
            if name in scope.bound:
                out |= scope.bound[name]
                bound = True
            if name in scope.params:
                return out | {_VALUE}
            scope = scope.parent
        if name in _GLOBALS:
            return out | {_GLOBALS[name]}
        return out if bound else {("unbound", name)}


class _Module:
    """One member's parse tree: its scopes, bindings, and the references in it."""

    def __init__(self, text: str, tree: ast.Module) -> None:
        self.tree = tree
        # the byte offset of each line as Python's tokenizer counts lines (\n, \r\n, \r)
        if text.isascii():  # (serialized code mostly is) a character is a byte
            starts = [0, *(end.end() for end in _LINE_END.finditer(text))]
        else:
            starts, last = [0], 0
            for end in _LINE_END.finditer(text):
                starts.append(starts[-1] + len(text[last:end.end()].encode("utf-8",
                                                                           "replace")))
                last = end.end()
        self.starts = starts
        self.scope_of: dict[int, _Scope] = {}
        self.parent: dict[int, ast.AST] = {}
        #: (scope, name, value or None) for each binding site, value None: a plain value.
        self.bindings: list[tuple[_Scope, str, ast.expr | None]] = []
        self.candidates: list[ast.AST] = []

    def offset(self, node: ast.AST) -> int:
        if not isinstance(node, (ast.expr, ast.stmt)):
            return 0
        return self.starts[min(node.lineno, len(self.starts)) - 1] + node.col_offset

    def calls(self) -> list[ScriptCall]:
        self._walk()
        if not self._propagate():
            return [ScriptCall("", 0, problem="names alias torch's namespaces through more "
                               f"than {_MAX_ROUNDS} assignments or {_MAX_MEANINGS} meanings")]
        out: list[ScriptCall] = []
        for node, scope in self._tops():
            out.extend(self._report(node, scope))
        out.sort(key=lambda c: c.offset)
        return out

    # -- the walk: scopes, parents, binding sites -------------------------------------------

    def _walk(self) -> None:
        """One pass over the tree: each node's scope and parent, the binding sites, and the
        candidate references (names read, attributes, calls, imports)."""
        module = _Scope(None, False)
        stack: list[tuple[ast.AST, _Scope]] = [(self.tree, module)]
        scope_of, parent, candidates = self.scope_of, self.parent, self.candidates
        AST = ast.AST
        kinds = _KINDS
        parented = _PARENTED
        Name, Load = ast.Name, ast.Load
        push = stack.append
        pop = stack.pop
        while stack:
            node, scope = pop()
            kind = type(node)
            if kind is Name:  # most nodes: a reference or a binding, and no children
                scope_of[id(node)] = scope
                if type(node.ctx) is Load:  # type: ignore[attr-defined]
                    candidates.append(node)
                elif node.id not in scope.bound:  # type: ignore[attr-defined]
                    self._bind(scope, node.id, None)  # type: ignore[attr-defined]
                continue
            info = kinds.get(kind)
            if info is None:
                info = kinds[kind] = _kind_info(kind)
            fields, role = info
            inner = scope
            outside: tuple[ast.AST | None, ...] = ()
            if role:
                if role & _CANDIDATE:
                    scope_of[id(node)] = scope
                    candidates.append(node)
                if role & _BINDING:
                    self._binding_sites(node, scope, module)
                if role & _FUNCTION:
                    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                             ast.Lambda))
                    if not isinstance(node, ast.Lambda):
                        self._bind(scope, node.name, None)
                        outside = (*node.decorator_list, node.returns, node.args)
                    else:
                        outside = (node.args,)
                    outer = scope
                    while outer.parent is not None and not outer.function:
                        outer = outer.parent  # a method sees the module, not its class
                    inner = _Scope(outer, True)
                    args = node.args
                    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                              *([args.vararg] if args.vararg else []),
                              *([args.kwarg] if args.kwarg else [])]:
                        inner.params.add(a.arg)
                elif role & _CLASS:
                    assert isinstance(node, ast.ClassDef)
                    self._bind(scope, node.name, None)
                    inner = _Scope(scope, False)
                    outside = (*node.bases, *node.keywords, *node.decorator_list)
            if not fields:
                continue
            # the children, in the order of the node's fields (what ast.iter_child_nodes
            # yields, without its generators, and no Load/Store/Del context or operator);
            # a parent kept for the nodes whose parent is asked (:data:`_PARENTED`)
            attrs = vars(node)
            for field in fields:
                value = attrs.get(field)
                if type(value) is not list:
                    if not isinstance(value, AST):
                        continue
                    value = (value,)
                for child in value:
                    if not isinstance(child, AST):
                        continue  # None in a Dict's keys or a default's place
                    if type(child) in parented:
                        parent[id(child)] = node
                    # decorators, defaults, annotations of parameters, bases: read outside
                    push((child, scope if outside and any(child is o for o in outside)
                          else inner))

    def _bind(self, scope: _Scope, name: str, value: ast.expr | None) -> None:
        self.bindings.append((scope, name, value))
        scope.bound.setdefault(name, set())

    def _binding_sites(self, node: ast.AST, scope: _Scope, module: _Scope) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._pair(scope, target, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
            self._pair(scope, node.target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
            self._pair(scope, node.target, None)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._pair(scope, node.optional_vars, None)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self._bind(scope, node.name, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for _, name, bound, _ in _imported(node):
                self._bind(scope, name, None)
                scope.bound[name] |= {m for m in bound if m[0] in _NAMESPACE_KINDS}
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:  # assignments there bind here too: be general
                self._bind(module, name, None)

    def _pair(self, scope: _Scope, target: ast.AST, value: ast.expr | None) -> None:
        """Bind the names in ``target`` to the parts of ``value`` (element by element where
        both are tuple or list literals of one length, else each to the whole value)."""
        work: list[tuple[ast.AST, ast.expr | None]] = [(target, value)]
        while work:
            t, v = work.pop()
            if isinstance(t, ast.Name):
                self._bind(scope, t.id, v)
            elif isinstance(t, (ast.Tuple, ast.List)):
                if isinstance(v, (ast.Tuple, ast.List)) and len(v.elts) == len(t.elts) and \
                        not any(isinstance(e, ast.Starred) for e in [*t.elts, *v.elts]):
                    work += zip(t.elts, v.elts, strict=True)
                else:
                    work += [(e, None) for e in t.elts]
            elif isinstance(t, ast.Starred):
                work.append((t.value, None))

    # -- what names can stand for ------------------------------------------------------------

    def _propagate(self) -> bool:
        """Bind each name to the namespaces its values can be, until nothing changes. A
        value that is no reference chain, conditional or walrus (a constant, an operation,
        a subscript …; None: a plain value) is a plain value whatever the names mean: after
        the first round its binding cannot change, and later rounds skip it."""
        work = self.bindings
        for _ in range(_MAX_ROUNDS):
            changed = False
            for scope, name, value in work:
                got = {m for m in self._values(value, scope) if m[0] in _NAMESPACE_KINDS}
                got.add(_VALUE)
                have = scope.bound[name]
                if not got <= have:
                    have |= got
                    changed = True
                    if len(have) > _MAX_MEANINGS:
                        return False
            if not changed:
                return True
            if work is self.bindings:
                work = [b for b in work if type(b[2]) in _FOLLOWED_VALUES]
        return False

    def _values(self, value: ast.expr | None, scope: _Scope) -> set[Meaning]:
        out: set[Meaning] = set()
        work = [value]
        while work:
            v = work.pop()
            if v is None:
                out.add(_VALUE)
            elif isinstance(v, ast.IfExp):
                work += [v.body, v.orelse]
            elif isinstance(v, ast.NamedExpr):
                work.append(v.value)
            elif self._chain(v) is not None:
                out |= self.meanings(v, scope)
            else:
                out.add(_VALUE)
        return out

    def _chain(self, node: ast.AST) -> tuple[ast.AST, list[str]] | None:
        """The base and attribute names of a reference chain (``torch.ops.aten.x``,
        ``getattr(torch, "x")``), or None for any other expression."""
        attrs: list[str] = []
        while True:
            if isinstance(node, ast.Attribute):
                attrs.append(node.attr)
                node = node.value
            elif self._getattr(node):
                assert isinstance(node, ast.Call)
                arg = node.args[1]
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                attrs.append(arg.value)
                node = node.args[0]
            elif isinstance(node, ast.Name):
                attrs.reverse()
                return node, attrs
            else:
                return None if not attrs else (node, attrs[::-1])

    def _getattr(self, node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and
                isinstance(node.args[1].value, str)):
            return False
        scope = self.scope_of.get(id(node.func))
        return scope is not None and ("builtin", "getattr") in scope.lookup(node.func.id)

    def meanings(self, node: ast.AST, scope: _Scope) -> set[Meaning]:
        chain = self._chain(node)
        if chain is None:
            return {_VALUE}
        base, attrs = chain
        got = scope.lookup(base.id) if isinstance(base, ast.Name) else {_VALUE}
        for name in attrs:
            got = {_attr(m, name) for m in got}
        return got

    # -- the references ----------------------------------------------------------------------

    def _tops(self) -> Iterator[tuple[ast.AST, _Scope]]:
        """Every outermost reference chain (a name or attribute not itself the base of a
        longer chain) that can stand for something of torch's, and every import."""
        worth = set(_WORTH)
        for scope, name, _ in self.bindings:
            if any(m[0] in _NAMESPACE_KINDS for m in scope.bound[name]):
                worth.add(name)
        for node in self.candidates:
            kind = type(node)
            if kind is ast.Call and not self._getattr(node):
                continue
            up = self.parent.get(id(node))
            if type(up) is ast.Attribute or (type(up) is ast.Call and self._getattr(up) and
                                             up.args[0] is node):
                continue
            if kind is ast.Name:
                name = node.id  # type: ignore[attr-defined]
                if name not in worth and (name in _GLOBALS or not (
                        type(up) is ast.Call and up.func is node)):
                    continue  # a vetted builtin, a value or type not called
            yield node, self.scope_of[id(node)]
    def _report(self, node: ast.AST, scope: _Scope) -> Iterable[ScriptCall]:
        """What one reference can stand for, each operator once."""
        at = self.offset(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return self._imports(node, at)
        out: list[ScriptCall] = []
        up = self.parent.get(id(node))
        called = isinstance(up, ast.Call) and up.func is node
        for m in sorted(self.meanings(node, scope)):
            kind = m[0]
            if kind == "op":
                out.append(_classify(m[1], at))
            elif kind == "class" or (kind == "classes" and m[1]):
                out.append(_classify_class(m[1], at))
            elif kind == "builtin" and m[1] in _BARE_DANGEROUS:
                op = _BARE_DANGEROUS[m[1]]
                out.append(ScriptCall(op, at, DANGEROUS[op]))
            elif kind == "method" and m[1] in DANGEROUS_METHODS:
                op = DANGEROUS_METHODS[m[1]]
                out.append(ScriptCall(op, at, DANGEROUS[op]))
            elif kind == "unbound" and called:
                out.append(ScriptCall(f"builtin {m[1]}", at, unvetted=True))
            elif kind in ("ns", "ops", "classes") and not self._followed(node):
                out.append(ScriptCall(f"namespace {'.'.join(m)}", at, unvetted=True))
        return list({c.op: c for c in reversed(out)}.values())[::-1]

    def _followed(self, node: ast.AST) -> bool:
        """Whether a namespace used here is one the bindings follow (the value of an
        assignment, a branch of a conditional there, a statement of its own)."""
        while True:
            up = self.parent.get(id(node))
            if isinstance(up, ast.NamedExpr) or (isinstance(up, ast.IfExp) and
                                                 node is not up.test):
                node = up
            elif isinstance(up, (ast.Tuple, ast.List)) and isinstance(
                    self.parent.get(id(up)), ast.Assign):
                assign = self.parent[id(up)]
                assert isinstance(assign, ast.Assign)
                return assign.value is up and all(
                    isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(up.elts)
                    for t in assign.targets)
            else:
                return (isinstance(up, (ast.Assign, ast.AnnAssign)) and up.value is node) \
                    or isinstance(up, ast.Expr)

    def _imports(self, node: ast.Import | ast.ImportFrom, at: int) -> list[ScriptCall]:
        """An import names torch's namespaces and operators like the dotted names do;
        anything else it names is unvetted (torch's compiler would refuse it, or see
        something we cannot)."""
        out: list[ScriptCall] = []
        for path, _, _, named in _imported(node):
            for m in sorted(named):
                if m[0] == "op":
                    out.append(_classify(m[1], at))
                elif m[0] == "class" or (m[0] == "classes" and m[1]):
                    out.append(_classify_class(m[1], at))
                elif m[0] not in _NAMESPACE_KINDS:
                    out.append(ScriptCall(f"import {path}", at, unvetted=True))
        return out


def _imported(node: ast.Import | ast.ImportFrom
              ) -> list[tuple[str, str, set[Meaning], set[Meaning]]]:
    """For each name an import binds: the dotted path it imports, the name bound, what the
    name stands for and what the path names (``import torch.ops`` binds ``torch``, and
    names ``ops``)."""
    out: list[tuple[str, str, set[Meaning], set[Meaning]]] = []
    for alias in node.names:
        if isinstance(node, ast.ImportFrom):
            path = f"{'.' * node.level}{node.module or ''}.{alias.name}".replace("..", ".")
            name = alias.asname or alias.name
        else:
            path = alias.name
            name = alias.asname or alias.name.split(".")[0]
        parts = path.split(".")
        got = _GLOBALS.get(parts[0], _VALUE) if parts[0] in ("torch", "ops", "__torch__") \
            and not (isinstance(node, ast.ImportFrom) and node.level) else _VALUE
        for part in parts[1:]:
            got = _attr(got, part)
        bound = {got}
        if isinstance(node, ast.Import) and alias.asname is None:
            bound = {_GLOBALS.get(parts[0], _VALUE) if parts[0] in ("torch", "ops",
                                                                   "__torch__") else _VALUE}
        out.append((path, name, bound, {got}))
    return out
