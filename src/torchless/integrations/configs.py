"""The config types of training programs in inert files: OmegaConf (Hydra's configs) and
dataclasses, registered in a :class:`~torchless.TypeRegistry` so that they load back as
themselves, not as inert :class:`~torchless.Opaque` records.

    register_omegaconf()          # DictConfig, ListConfig (and TupleConfig) round-trip
    register_dataclass(MyConfig)  # and a dataclass of the program's own

:mod:`torchless.integrations.lightning` calls :func:`register_omegaconf` when it is imported
(Lightning saves a ``save_hyperparameters(cfg)`` config, and its class, in every checkpoint).
A file is only ever read through what the loading program registered: a program that did not
register a type reads its objects as inert records, and nothing is imported.

An OmegaConf config is written as ``OmegaConf.to_container(cfg, resolve=False)`` (so
interpolations such as ``${a}`` and missing values ``???`` stay as they were, unresolved)
with the flags set on each of its nodes (``struct``, ``readonly``, ``allow_objects`` …), and
read back as the same class holding that content with those flags. What ``to_container``
leaves out is not kept: the dataclass a structured config was made from (it loads as a plain
``DictConfig`` of the same values) and the key or element types of typed containers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchless.errors import FormatError
from torchless.inert.schema import TypeRegistry, default_types

__all__ = ["register_dataclass", "register_omegaconf"]


def register_omegaconf(registry: TypeRegistry | None = None) -> bool:
    """Register OmegaConf's ``DictConfig`` and ``ListConfig`` (and ``TupleConfig`` where
    this OmegaConf has it) in ``registry`` (default: the one :func:`torchless.save` and
    :func:`torchless.load` use). Returns False, registering nothing, when OmegaConf is not
    installed. Registering again is harmless."""
    try:
        import omegaconf
    except ImportError:
        return False
    reg = registry if registry is not None else default_types
    kinds: list[type[Any]] = [omegaconf.DictConfig, omegaconf.ListConfig]
    tuple_config = vars(omegaconf).get("TupleConfig")  # OmegaConf 2.4 and later
    if isinstance(tuple_config, type):
        kinds.append(tuple_config)
    for cls in kinds:
        reg.register(cls, _omegaconf_state, _omegaconf_decoder(cls))
    return True


def _omegaconf_state(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return {"content": OmegaConf.to_container(cfg, resolve=False),
            "flags": [[path, dict(flags)] for path, flags in _node_flags(cfg, [])]}


def _node_flags(node: Any, path: list[Any]) -> list[tuple[list[Any], dict[str, Any]]]:
    """``(path of keys, flags)`` of each node of the config under ``node`` that has flags of
    its own, in pre-order."""
    from omegaconf import Container, DictConfig

    out: list[tuple[list[Any], dict[str, Any]]] = []
    if node._metadata.flags:
        out.append((path, dict(node._metadata.flags)))
    if not isinstance(node, Container) or node._is_none() or (
            node._is_missing() or node._is_interpolation()):
        return out
    container: Any = node  # a DictConfig by its keys, a ListConfig / TupleConfig by index
    keys = list(container.keys()) if isinstance(node, DictConfig) else range(len(container))
    for key in keys:
        out.extend(_node_flags(container._get_node(key), [*path, key]))
    return out


def _omegaconf_decoder(cls: type[Any]) -> Any:
    def decode(state: Any) -> Any:
        from omegaconf import Container
        from omegaconf.errors import OmegaConfBaseException

        if not isinstance(state, dict) or set(state) != {"content", "flags"} or not (
                isinstance(state["flags"], list)):
            raise FormatError(f"a {cls.__name__} is stored as {{content, flags}}")
        for entry in state["flags"]:
            if not isinstance(entry, list) or len(entry) != 2 or not isinstance(
                    entry[0], list) or not isinstance(entry[1], dict) or not all(
                    type(k) is str and (v is None or type(v) is bool)
                    for k, v in entry[1].items()):
                raise FormatError(f"a {cls.__name__}'s flags are [[path, {{flag: "
                                  "bool or null}], ...]")
        root = [flags for path, flags in state["flags"] if not path]
        try:  # the root's flags first: allow_objects decides what the content may hold
            cfg = cls(state["content"], flags=root[-1] if root else None)
            for path, flags in state["flags"]:
                node = cfg
                for key in path:
                    node = node._get_node(key) if isinstance(node, Container) else None
                    if node is None:
                        raise FormatError(f"a {cls.__name__}'s flags name the node "
                                          f"{path!r}, which it does not have")
                for flag, value in flags.items():
                    node._set_flag(flag, value)
        except OmegaConfBaseException as e:
            raise FormatError(f"OmegaConf cannot rebuild this {cls.__name__}: "
                              f"{type(e).__name__}: {e}") from None
        return cfg

    return decode


def register_dataclass(cls: type[Any], *, registry: TypeRegistry | None = None,
                       name: str | None = None) -> None:
    """Register the dataclass ``cls`` in ``registry`` (default: the one
    :func:`torchless.save` and :func:`torchless.load` use): an instance is written as its
    attributes (``vars(obj)``, what pickle keeps) and read back as pickle rebuilds it, an
    instance made without calling ``__init__`` with those attributes set (frozen ones too).

    Raises:
        TypeError: ``cls`` is not a dataclass, or its instances have no ``__dict__``
            (``slots=True``: register it with :func:`torchless.register_type`).
    """
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise TypeError("register_dataclass() needs a dataclass")
    if "__slots__" in vars(cls):
        raise TypeError(f"{cls.__qualname__} has __slots__: register it with "
                        "torchless.register_type(cls, encode, decode)")
    fields = tuple(f.name for f in dataclasses.fields(cls))

    def encode(obj: Any) -> dict[str, Any]:
        return dict(vars(obj))

    def decode(state: Any) -> Any:
        if not isinstance(state, dict) or not all(
                type(k) is str and k.isidentifier() and not k.startswith("__") for k in state):
            raise FormatError(f"a {cls.__qualname__} is stored as an object of attributes")
        missing = [f for f in fields if f not in state]
        if missing:
            raise FormatError(f"the stored {cls.__qualname__} has no value for the field(s) "
                              f"{', '.join(missing)}")
        obj = cls.__new__(cls)
        vars(obj).update(state)
        return obj

    (registry if registry is not None else default_types).register(cls, encode, decode,
                                                                   name=name)
