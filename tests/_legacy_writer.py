"""Writers of the legacy stream and the pre-0.1.10 TAR layout, for tests.

They follow torch's own writer (torch.serialization._legacy_save) and the TAR reader
(torch.serialization._legacy_load.legacy_load) so that torch itself can check the files,
and add what torch.save no longer writes: pickle protocols 0/1 choices, big-endian data,
storage views with view metadata, and the TAR layout.
"""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
from typing import Any

MAGIC = 0x1950A86A20F9469CFC6C


def swap(data: bytes, itemsize: int, complex_: bool) -> bytes:
    unit = itemsize // 2 if complex_ else itemsize
    if unit == 1:
        return data
    return b"".join(data[i:i + unit][::-1] for i in range(0, len(data), unit))


def _storage_bytes(torch: Any, storage: Any) -> bytes:
    return bytes(storage._untyped_storage.cpu().numpy().tobytes()) if hasattr(
        storage._untyped_storage, "numpy") else bytes(
        torch.tensor([], dtype=torch.uint8).set_(storage._untyped_storage).numpy().tobytes())


def storages_needed(torch: Any, obj: Any) -> bool:
    """Whether obj holds tensors (protocol 0 cannot write their persistent ids)."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(storages_needed(torch, v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(storages_needed(torch, v) for v in obj)
    return False


def write_legacy(torch: Any, obj: Any, f: Any, *, protocol: int = 2, big_endian: bool = False,
                 count_big_endian: bool = False,
                 views: dict[int, tuple[Any, int]] | None = None) -> None:
    """A legacy stream like torch.save(..., _use_new_zipfile_serialization=False).

    ``views`` maps the data_ptr of a storage to (root tensor, element offset): that storage is
    written as a view of the root's storage with view metadata, as torch < 0.4 did."""
    views = views or {}
    storages: dict[str, Any] = {}
    seen_classes: set[type] = set()

    class Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, type) and issubclass(o, torch.nn.Module):
                if o in seen_classes:
                    return None
                seen_classes.add(o)
                return ("module", o, "<test>", "")
            if isinstance(o, torch.storage.TypedStorage):
                storage_type = getattr(torch, o._pickle_storage_type())
                view = views.get(o._untyped_storage.data_ptr())
                if view is not None:
                    root = view[0].untyped_storage()
                    root_typed = view[0].storage()
                    key = str(root._cdata)
                    storages[key] = root_typed
                    return ("storage", storage_type, key, "cpu", root_typed._size(),
                            (str(o._cdata), view[1], o._size()))
                key = str(o._cdata)
                storages[key] = o
                return ("storage", storage_type, key, "cpu", o._size(), None)
            return None

    sys_info = {"protocol_version": 1001, "little_endian": not big_endian,
                "type_sizes": {"short": 2, "int": 4, "long": 4}}
    for value in (MAGIC, 1001, sys_info):
        pickle.dump(value, f, protocol=protocol)
    Pickler(f, protocol=max(protocol, 1) if storages_needed(torch, obj) else protocol).dump(obj)
    keys = sorted(storages)
    pickle.dump(keys, f, protocol=protocol)
    for key in keys:
        st = storages[key]
        itemsize = torch._utils._element_size(st.dtype)
        data = torch.empty(0, dtype=torch.uint8).set_(st._untyped_storage).numpy().tobytes()
        if big_endian:
            data = swap(data, itemsize, st.dtype.is_complex)
        f.write(struct.pack(">q" if count_big_endian else "<q", st._size()))
        f.write(data)


def write_tar(torch: Any, tensors: dict[str, Any], path: str, *, big_endian: bool = False,
              views: bool = True, module: Any = None) -> None:
    """The pre-0.1.10 TAR layout: {name: tensor} stored with one storage per distinct storage.

    With ``module``, the pickle holds that whole module (its tensors become persistent ids,
    its classes source records) instead of the dict."""
    if module is not None:
        tensors = {f"_m{i}": t for i, t in enumerate(
            list(module.parameters()) + list(module.buffers()))}
    storage_ids: dict[int, int] = {}
    storage_list: list[Any] = []
    for t in tensors.values():
        st = t.untyped_storage()
        if st.data_ptr() not in storage_ids:
            storage_ids[st.data_ptr()] = len(storage_ids) + 1
            storage_list.append((storage_ids[st.data_ptr()], t))
    out = io.BytesIO()
    pickle.dump(len(storage_list), out, protocol=2)
    for key, t in storage_list:
        st = t.untyped_storage()
        itemsize = t.element_size()
        storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[t.dtype])
        pickle.dump((key, "cpu", storage_type), out, protocol=2)
        data = torch.empty(0, dtype=torch.uint8).set_(st).numpy().tobytes()
        if big_endian:
            data = swap(data, itemsize, t.dtype.is_complex)
        out.write(struct.pack("<q", len(data) // itemsize))
        out.write(data)
    view_list = []
    if views and storage_list:
        # a storage view of the first storage: elements 1.. of it, under key 1000
        key, t = storage_list[0]
        n = t.untyped_storage().nbytes() // t.element_size()
        if n > 1:
            view_list.append((1000, key, 1, n - 1))
    pickle.dump(view_list, out, protocol=2)
    storages_member = out.getvalue()

    out = io.BytesIO()
    pickle.dump(len(tensors), out, protocol=2)
    tensor_keys = {}
    for i, (name, t) in enumerate(tensors.items()):
        key = 5000 + i
        tensor_keys[name] = key
        skey = storage_ids[t.untyped_storage().data_ptr()]
        pickle.dump((key, skey, type(t)), out, protocol=2)
        out.write(struct.pack("<i", t.dim()) + b"\0\0\0\0")
        out.write(struct.pack(f"<{t.dim()}q", *t.shape))
        out.write(struct.pack(f"<{t.dim()}q", *t.stride()))
        out.write(struct.pack("<q", t.storage_offset()))
    tensors_member = out.getvalue()

    by_id = {id(tensors[name]): key for name, key in tensor_keys.items()}
    seen_classes: set[type] = set()

    class Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, Ref):
                return str(o.key)
            if isinstance(o, torch.Tensor) and id(o) in by_id:
                return str(by_id[id(o)])
            if isinstance(o, type) and issubclass(o, torch.nn.Module):
                if o in seen_classes:  # as torch does: the id tuple holds the class itself
                    return None
                seen_classes.add(o)
                return (o, "<test>", "class source text")
            return None

    class Ref:
        def __init__(self, key: int) -> None:
            self.key = key

    out = io.BytesIO()
    root = module if module is not None else {name: Ref(k) for name, k in tensor_keys.items()}
    Pickler(out, protocol=2).dump(root)
    pickle_member = out.getvalue()
    sys_info = pickle.dumps({"protocol_version": 1000, "little_endian": not big_endian,
                             "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("sys_info", sys_info), ("pickle", pickle_member),
                           ("tensors", tensors_member), ("storages", storages_member)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def old_tensor_setstate(torch: Any, data: Any, *, offset: int, size: tuple[int, ...],
                        stride: tuple[int, ...]) -> bytes:
    """A legacy stream holding one float32 tensor in the oldest form torch reads:
    ``torch.Tensor()`` then ``__setstate__((storage, offset, size, stride))`` (the form of
    torch's own backwards-compatibility test). ``data`` is a float32 NumPy array."""

    class _Storage:
        pass

    class _OldTensor:
        def __reduce__(self) -> Any:
            return (torch.Tensor, (), (storage, offset, size, stride))

    storage = _Storage()
    f = io.BytesIO()

    class Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            if o is storage:
                return ("storage", torch.FloatStorage, "0", "cpu", int(data.size), None)
            return None

    sys_info = {"protocol_version": 1001, "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 4}}
    for value in (MAGIC, 1001, sys_info):
        pickle.dump(value, f, protocol=2)
    Pickler(f, protocol=2).dump(_OldTensor())
    pickle.dump(["0"], f, protocol=2)
    f.write(struct.pack("<q", int(data.size)))
    f.write(data.astype("<f4").tobytes())
    return f.getvalue()



