"""The reader's side of the vetted allowlist: which calls ``torchless.open`` refuses.

The reader never calls anything; it refuses a call so that it agrees with ``torchless scan``,
which calls these dangerous (:mod:`torchless.scanner.model`): a function nobody vetted, a
vetted rule that would forward a callable the file chose and nobody vetted
(``_rebuild_from_type_v2``'s func, ``copyreg._reconstructor``'s base, NumPy's RNG constructor
callback, ``hmac``'s digestmod, a ``functools.partial``'s function or keywords), or a call of
an object the file built. An unvetted *class* called with data stays an inert record.
"""

from __future__ import annotations

from typing import Any

from torchless.errors import type_phrase
from torchless.pickle.known import Known
from torchless.pickle.values import Global, Opaque
from torchless.rules.allowlist import FORWARDS, call_verdict, forwarded
from torchless.rules.stdlib import calls_a_method

__all__ = ["call_refusal", "describe"]


def describe(value: Any) -> str:
    """A name for what a refusal is about."""
    if isinstance(value, Global):
        return value.path
    if isinstance(value, Opaque):
        return f"<{value.class_path} object>"
    return type_phrase(value)


def _vetted(target: Any, allow: frozenset[str]) -> bool:
    if isinstance(target, Global):
        return target.path in allow or call_verdict(target.module, target.name)[0] == "vetted"
    return False


def _forwarding(path: str, args: tuple[Any, ...], kwargs: dict[Any, Any] | None,
                allow: frozenset[str], what: str) -> str | None:
    for target, _ in forwarded(path, args, kwargs):
        if not _vetted(target, allow):
            return f"{what} would call {describe(target)}, a callable the file chose that " \
                   "is not vetted"
    return None


def call_refusal(func: Any, args: Any, allow: frozenset[str]) -> str | None:
    """Why calling ``func(*args)`` is refused, or None."""
    if isinstance(func, Global):
        if func.path in FORWARDS and isinstance(args, tuple):
            reason = _forwarding(func.path, args, None, allow, func.path)
            if reason is not None:
                return reason
        if isinstance(func, Known) or func.path in allow:
            return None
        severity, why = call_verdict(func.module, func.name)
        function = func.name.split(".")[-1].lstrip("_")[:1].islower()
        if severity == "dangerous" or (severity == "unvetted" and function):
            return f"calling {func.path}: {why}"
        return None
    if not isinstance(func, Opaque) or calls_a_method(func):
        return None  # a method call is refused by the rules themselves (METHOD_CALL_HINT)
    c = func.callable
    if not (isinstance(c, Known) and c.path == "functools.partial"):
        return f"calling an object the file built ({func.class_path})"
    state = func.state
    whole = isinstance(state, tuple) and len(state) == 4
    target = state[0] if isinstance(state, tuple) and state else (
        func.args[0] if func.args else None)
    if isinstance(target, Known) and target.rule == "class_new":
        return None
    if not _vetted(target, allow):
        return f"calling a functools.partial of {describe(target)}, which is not vetted"
    if isinstance(target, Global) and target.path in FORWARDS:
        p_args = state[1] if whole and isinstance(state[1], tuple) else func.args[1:]
        p_kw = state[2] if whole and isinstance(state[2], dict) else func.kwargs
        extra = args if isinstance(args, tuple) else ()
        return _forwarding(target.path, (*p_args, *extra), p_kw, allow,
                           f"a functools.partial of {target.path}")
    return None
