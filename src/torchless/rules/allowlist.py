"""The vetted allowlist: what ``torch.load(weights_only=False)`` may do to a file's say-so.

The scanner models each action the unpickler would take (:mod:`torchless.scanner.model`):
an **import** (``GLOBAL``, ``STACK_GLOBAL``, ``INST``), a **call** (``REDUCE``, ``NEWOBJ``,
``NEWOBJ_EX``, ``INST``, ``OBJ``), a **build** (``BUILD`` reaching ``__setstate__`` or
``__setattr__``) and an **update** (``APPEND``/``SETITEM`` on an object). An action is
clean only when this module vets it, each entry with the reason it is safe. Everything else
is **dangerous** (known to run code, touch files, processes or the network, or a rule that
forwards a callable the file chose) or **unvetted** (the code of a package nobody vetted
would run; the verdict names the package).

Three kinds of entry, because a class can be safe to *re-create* and unsafe to *call*:

* :data:`CALLS`: safe to call with the data a pickle holds (``REDUCE``/``INST``/``OBJ``);
  also safe to create with ``__new__`` and to build;
* :data:`NEW_ONLY`: safe to create through ``cls.__new__(cls, …)`` (``NEWOBJ``,
  ``copyreg.__newobj__``) and to restore with ``BUILD``, but calling the class runs
  ``__init__``/``__post_init__`` code that was not vetted (``TrainingArguments`` sets up
  devices);
* :data:`FORWARDS`: vetted calls that call something the file passes them (``functools.partial``,
  ``copyreg._reconstructor``, ``_rebuild_from_type_v2``, NumPy's RNG constructors, ``getattr``):
  the scanner vets the forwarded call on its own, and a forwarded callable that is not in
  :data:`CALLS` makes the file dangerous.

A name only *referenced* runs its module's import (:func:`import_verdict`); but a callable
the file hands on (kept in the value torch.load returns, or given to a callable) may be
called by duck typing (``Parameter`` calls ``data.detach()``, ``dict`` calls ``x.keys()``) or
by the program, so it counts as called unless :data:`ANY_ARGS` vets it for any arguments (an
activation function kept as a module attribute, ``numpy.float32`` as a dtype). What each
vetted callable does with its arguments is in :data:`SPECS` (read from its code); one without
a spec counts every callable it is handed as called.

Adding an entry: put the exact ``module.name`` (as the pickle spells it, after Python 2 names
are mapped) in the right table with one line saying why loading it cannot run unvetted code,
its :data:`SPECS` entry if it calls into or keeps what it is handed, and add a file to the
labelled set (``tests/scanner/labelled``) that shows it in real output.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Literal, NamedTuple

from torchless.pickle.values import Global
from torchless.rules.policy import DENIED_MODULE_FAMILIES, PYTHON_CONSTANTS, torch_constant

__all__ = ["ANY_ARGS", "CALLS", "DANGEROUS", "FORWARDS", "HANDED_ON", "IMPORT_PACKAGES",
           "METHODS_CALLED", "NEW_ONLY", "SPECS", "ArgSpec", "Severity", "Spec",
           "call_verdict", "import_verdict", "method_verdict", "package_of"]

#: What the scanner makes of one action.
Severity = Literal["vetted", "unvetted", "dangerous"]

_TORCH_REBUILD = "a torch rebuild function: makes a tensor or storage view from data arguments"
_ENUM = "an Enum: calling it with a value looks the member up, no other code runs"
_DATACLASS = ("a plain data class: __new__ is object's and BUILD fills __dict__ (no "
              "__setstate__ of its own)")

#: Callables safe to call with pickled data (and to create with __new__ and build).
CALLS: dict[str, str] = {
    **{f"torch._utils.{n}": _TORCH_REBUILD for n in (
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_device_tensor_from_cpu_tensor",
        "_rebuild_sparse_tensor",
        "_rebuild_sparse_csr_tensor", "_rebuild_nested_tensor", "_rebuild_qtensor",
        "_rebuild_meta_tensor_no_storage", "_rebuild_xla_tensor", "_rebuild_mtia_tensor")},
    "torch.nested._internal.nested_tensor._rebuild_njt": _TORCH_REBUILD,
    "torch.serialization._get_layout": "looks a layout up by name in torch's own table",
    **{f"torch.jit._pickle.{n}": "TorchScript list tag: returns its list argument" for n in (
        "build_intlist", "build_floatlist", "build_boollist", "build_doublelist",
        "build_tensorlist", "build_complexlist", "restore_type_tag")},
    "torch.Size": "a tuple of ints", "torch.device": "parses a device string",
    "torch._C.Generator": "a random generator; __setstate__ sets its state tensor",
    "torch.Generator": "a random generator; __setstate__ sets its state tensor",
    "torch.Tensor": "the tensor class (the oldest saves call it, then __setstate__)",
    "torch._tensor.Tensor": "the tensor class (the oldest saves call it, then __setstate__)",
    "torch.nn.parameter.Parameter": "wraps a tensor; __setstate__ restores flags",
    "torch.nn.parameter.Buffer": "wraps a tensor",
    "torch.nn.parameter.UninitializedParameter": "a placeholder without data",
    "torch.nn.parameter.UninitializedBuffer": "a placeholder without data",
    "torch.torch_version.TorchVersion": "a str subclass",
    **{f"builtins.{n}": "a builtin value type: builds a value from data" for n in (
        "set", "frozenset", "list", "dict", "tuple", "int", "float", "str", "bool",
        "complex", "bytes", "bytearray", "slice", "range", "object")},
    "collections.OrderedDict": "a dict", "collections.deque": "a list-like container",
    "collections.Counter": "a dict of counts",
    "collections.defaultdict": "a dict; its factory (a callable the file hands it, judged "
                               "as called) runs on a missing key: no vetted __setstate__ "
                               "reads one (Module's and Optimizer's update __dict__, RNNBase's "
                               "reads only keys it tested with `in`)",
    "collections.ChainMap": "a list of mappings: pickled as NEWOBJ + BUILD of its __dict__ "
                            "(maps); no __setstate__ of its own, nothing is looked up",
    "torch._dynamo.decorators._DimRange": "a frozen slotted dataclass of three ints: "
                                          "dataclasses' __setstate__ sets its fields",
    "copyreg.__newobj__": "cls.__new__(cls, *args): vetted as the NEWOBJ it stands for",
    "copyreg.__newobj_ex__": "cls.__new__(cls, *args, **kw): vetted as the NEWOBJ it stands for",
    "_codecs.encode": "str.encode with a text codec (other codecs are not vetted)",
    **{f"datetime.{n}": "a datetime value from numbers and a tzinfo" for n in (
        "datetime", "date", "time", "timedelta", "timezone")},
    "zoneinfo.ZoneInfo": "a time zone; the key is validated (no absolute path, no ..) and "
                         "only a zone file is read",
    "zoneinfo.ZoneInfo._unpickle": "a time zone from its key (validated, reads a zone file)",
    **{f"pathlib.{n}": "a path object: constructing it touches no file" for n in (
        "Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")},
    "argparse.Namespace": "an attribute bag", "types.SimpleNamespace": "an attribute bag",
    "uuid.UUID": "a 128-bit value; __setstate__ sets its int",
    # torch_geometric's Inspector keeps inspect.Parameter.empty as the "no default" of the
    # signatures it records (every torch.save of a PyG model holds it)
    "inspect._empty": "the empty class inspect marks \"no default, no annotation\" with "
                      "(Parameter.empty): a sentinel, its body is a docstring",
    "uuid.SafeUUID": _ENUM,
    "re._compile": "compiles a regular expression (nothing is matched at load)",
    "re.compile": "compiles a regular expression (nothing is matched at load)",
    "re.RegexFlag": _ENUM,
    "decimal.Decimal": "a number from a string", "fractions.Fraction": "a number",
    # Address.__reduce__ gives (cls, (int,)), Network/Interface (cls, (str,)): __init__
    # takes an int, bytes, a tuple, or str() of anything else, and parses it
    **{f"ipaddress.IPv{v}{n}": "an IP address, network or interface parsed from a number "
       "or a string" for v in (4, 6) for n in ("Address", "Network", "Interface")},
    "array.array": "a typed array from data",
    "array._array_reconstructor": "a typed array from bytes",
    "enum.Enum": _ENUM,
    "numpy.core.multiarray._reconstruct": "an empty array of a vetted class; BUILD fills it",
    "numpy._core.multiarray._reconstruct": "an empty array of a vetted class; BUILD fills it",
    "numpy.ndarray": "the array class; __setstate__ copies the bytes",
    "numpy.dtype": "a dtype from its code; __setstate__ sets byte order and fields",
    "numpy.core.multiarray.scalar": "a scalar from a dtype and its bytes",
    "numpy._core.multiarray.scalar": "a scalar from a dtype and its bytes",
    "numpy.core.numeric._frombuffer": "an array from bytes", "numpy._core.numeric._frombuffer":
        "an array from bytes",
    "numpy.ma.core._mareconstruct": "a masked array; BUILD fills data and mask",
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence":
        "Cython's unpickle helper: checks a checksum, creates a SeedSequence, sets its state",
    "numpy.random.bit_generator.SeedSequence": "entropy pool state",
    **{f"numpy.random.{m}.{c}": "a NumPy bit generator; its state is set from numbers" for m, c
       in (("_mt19937", "MT19937"), ("_pcg64", "PCG64"), ("_pcg64", "PCG64DXSM"),
           ("_philox", "Philox"), ("_sfc64", "SFC64"))},
    "numpy.random._generator.Generator": "a Generator over a vetted bit generator",
    "numpy.random.mtrand.RandomState": "a RandomState over a vetted bit generator",
    "accelerate.utils.dataclasses.DistributedType": _ENUM,
    "accelerate.utils.dataclasses.DynamoBackend": _ENUM,
    "accelerate.utils.dataclasses.PrecisionType": _ENUM,
}
for _m, _names in {
    "transformers.trainer_utils": ("IntervalStrategy", "SaveStrategy", "HubStrategy",
                                   "SchedulerType", "EvaluationStrategy", "HPSearchBackend",
                                   "FSDPOption"),
    "accelerate.utils.dataclasses": ("DDPCommunicationHookType", "SageMakerDistributedType",
                                     "FP8BackendType", "ComputeEnvironment", "LoggerType",
                                     "RNGType", "CustomDtype"),
    "transformers.training_args": ("OptimizerNames", "ParallelMode"),
    "transformers.debug_utils": ("DebugOption",),
    "transformers.utils.generic": ("PaddingStrategy", "TensorType", "ExplicitEnum"),
    "transformers.trainer_callback": ("IntervalStrategy",),
    "lightning.pytorch.trainer.states": ("TrainerFn", "TrainerStatus", "RunningStage"),
    "pytorch_lightning.trainer.states": ("TrainerFn", "TrainerStatus", "RunningStage"),
    "lightning.fabric.utilities.enums": ("LightningEnum",),
    "omegaconf.base": ("SCMode",),
    # Megatron-Core's args (common.pt, model_optim_rng.pt) hold its plain enums
    "megatron.core.transformer.enums": ("ModelType", "LayerType", "AttnType", "AttnMaskType",
                                        "AttnBackend", "CudaGraphScope"),
    "megatron.core.enums": ("ModelType", "Fp8Recipe"),
}.items():
    for _n in _names:
        CALLS[f"{_m}.{_n}"] = _ENUM

#: Classes safe to create with __new__ and restore with BUILD, but not vetted to be called.
NEW_ONLY: dict[str, str] = {
    "transformers.training_args.TrainingArguments": _DATACLASS,
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments": _DATACLASS,
    "transformers.trainer_pt_utils.AcceleratorConfig": _DATACLASS,
    "transformers.generation.configuration_utils.GenerationConfig":
        "a config: BUILD fills __dict__",
    "transformers.configuration_utils.PretrainedConfig": "a config: BUILD fills __dict__",
    "accelerate.state.PartialState": "NEWOBJ + BUILD of the state dict only: __init__ (which "
                                     "sets up processes) is not called",
    "accelerate.state.AcceleratorState": "NEWOBJ + BUILD of the state dict only",
    "omegaconf.dictconfig.DictConfig": "__setstate__ restores the node tree; interpolations "
                                       "and resolvers run only when a value is read",
    "omegaconf.listconfig.ListConfig": "__setstate__ restores the node tree",
    "omegaconf.base.Metadata": _DATACLASS, "omegaconf.base.ContainerMetadata": _DATACLASS,
    "lightning.fabric.utilities.data.AttributeDict": "a dict subclass with attribute access",
    "lightning_fabric.utilities.data.AttributeDict": "a dict subclass with attribute access",
    "pytorch_lightning.utilities.parsing.AttributeDict": "a dict subclass",
    "lightning.pytorch.utilities.parsing.AttributeDict": "a dict subclass",
}
for _n in ("AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs",
           "InitProcessGroupKwargs", "DataLoaderConfiguration", "ProjectConfiguration",
           "GradientAccumulationPlugin", "TorchDynamoPlugin", "TensorInformation"):
    NEW_ONLY[f"accelerate.utils.dataclasses.{_n}"] = _DATACLASS
NEW_ONLY["lightning.pytorch.trainer.states.TrainerState"] = _DATACLASS
NEW_ONLY["pytorch_lightning.trainer.states.TrainerState"] = _DATACLASS
# DeepSpeed's ZeRO optimizer partitions (deepspeed 0.19): the loss scalers are plain classes
# (no __setstate__, __setattr__ or __reduce__; DeepSpeedConfigObject adds only __repr__),
# fragment_address is a two-int @dataclass, ZeroStageEnum an int Enum
for _m, _n in (("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
               ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
               ("deepspeed.utils.tensor_fragment", "fragment_address")):
    NEW_ONLY[f"{_m}.{_n}"] = _DATACLASS
CALLS["deepspeed.runtime.zero.config.ZeroStageEnum"] = _ENUM
_DCP = ("a torch.distributed.checkpoint metadata dataclass: NEWOBJ + BUILD fill its fields "
        "(TensorProperties' own __setstate__ only decodes the memory format from its enum)")
for _m, _n in (("torch.distributed.checkpoint.metadata", "Metadata"),
               ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
               ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
               ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
               ("torch.distributed.checkpoint.metadata", "TensorProperties"),
               ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
               ("torch.distributed.checkpoint.metadata", "StorageMeta"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
               ("torch.distributed.checkpoint._hf_utils", "_HFStorageInfo"),
               ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
               # Megatron-Core (0.16) stores every rank's save plan in .metadata
               # (state_dict_saver.py: global_metadata.all_local_plans): frozen dataclasses
               ("torch.distributed.checkpoint.planner", "SavePlan"),
               ("torch.distributed.checkpoint.planner", "WriteItem"),
               ("torch.distributed.checkpoint.planner", "TensorWriteData"),
               ("torch.distributed.checkpoint.planner", "BytesIOWriteData")):
    NEW_ONLY[f"{_m}.{_n}"] = _DCP
NEW_ONLY["megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata"] = (
    "Megatron-Core's DCP Metadata: a dataclass subclass of torch's with one more field "
    "(mcore_data), or the empty placeholder class later versions keep to load it; NEWOBJ + "
    "BUILD fill its fields")
CALLS["torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING"] = _ENUM
CALLS["torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING"] = _ENUM
CALLS["torch.distributed.checkpoint.planner.WriteItemType"] = _ENUM
# What a DTensor and a ShardedTensor pickle (FSDP2, verl's and FSDP1's per-rank files; read
# in torch 2.13): dataclasses and NamedTuples whose BUILD fills their fields (DTensorSpec's
# __setattr__ only checks a shard order; the layouts are frozen dataclasses BUILD writes
# directly), placements whose C++ __setstate__ sets their dim, DeviceMesh's __setstate__
# (its dict, then a lookup of its process groups by name), ShardedTensor's __setstate__ (its
# fields, then comparisons with the current process group: it raises without one), and the
# tensor subclasses themselves, made by _rebuild_wrapper_subclass without their __new__
_DISTRIBUTED = ("a torch.distributed record of a sharded tensor: NEWOBJ + BUILD (or its "
                "own __setstate__) set its fields; nothing else runs")
for _m, _n in (("torch.distributed.tensor", "DTensor"),
               ("torch.distributed.tensor._api", "DTensor"),
               ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
               ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
               ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
               ("torch.distributed.tensor.placement_types", "Shard"),
               ("torch.distributed.tensor.placement_types", "Replicate"),
               ("torch.distributed.tensor.placement_types", "_StridedShard"),
               ("torch.distributed.tensor.placement_types", "Partial"),
               ("torch.distributed.device_mesh", "DeviceMesh"),
               ("torch.distributed._mesh_layout", "_MeshLayout"),
               ("torch.distributed._mesh_layout", "_FlatLayout"),
               ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor"),
               ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor.ProcessGroupState"),
               ("torch.distributed._shard.sharded_tensor.shard", "Shard"),
               ("torch.distributed._shard.sharded_tensor.metadata", "ShardedTensorMetadata"),
               ("torch.distributed._shard.metadata", "ShardMetadata"),
               ("torch.distributed._shard.sharding_spec.chunk_sharding_spec",
                "ChunkShardingSpec"),
               ("torch.distributed.remote_device", "_remote_device")):
    NEW_ONLY[f"{_m}.{_n}"] = _DISTRIBUTED
NEW_ONLY["torch.nested._internal.nested_tensor.NestedTensor"] = (
    "a jagged nested tensor: _rebuild_njt makes it from its tensors (shape and device checks), "
    "and _rebuild_from_type_v2 restores its state with _set_obj_state's setattr (it has no "
    "__setstate__)")
NEW_ONLY["omegaconf.base.UnionNode"] = "an omegaconf union node: BUILD restores its value"
for _n in ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "EnumNode",
           "PathNode", "BytesNode", "InterpolationResultNode", "ValueNode", "NoneNode",
           "LiteralNode"):
    NEW_ONLY[f"omegaconf.nodes.{_n}"] = "an omegaconf value node: BUILD restores its value"

#: Vetted calls that call what the file passes them: name -> what is forwarded.
FORWARDS: dict[str, str] = {
    "functools.partial": "stores a callable; calling the partial calls it (BUILD may swap it)",
    "copyreg._reconstructor": "base.__new__(cls, state) and base.__init__(obj, state)",
    "torch._tensor._rebuild_from_type_v2": "calls func(*args), then restores new_type's state",
    "torch._tensor._rebuild_from_type": "calls func(*args), then sets new_type's __dict__",
    "torch._utils._rebuild_wrapper_subclass": "makes an instance of the class it is given",
    "numpy.random._pickle.__generator_ctor": "calls bit_generator_ctor(bit_generator_name)",
    "numpy.random._pickle.__randomstate_ctor": "calls bit_generator_ctor(bit_generator_name)",
    "numpy.random._pickle.__bit_generator_ctor": "calls the class it is given, or looks a "
                                                 "name up in NumPy's table",
    "builtins.getattr": "reads one attribute; calling what it read calls a method",
    "builtins.type": "type(x) reads the type of x; type(name, bases, ns) makes a class",
    "operator.getitem": "subscripts its first argument (typing.Optional[int] is pickled so)",
    # protocols 4 and 5 name it by its __module__, the C module operator re-exports
    "_operator.getitem": "subscripts its first argument (typing.Optional[int] is pickled so)",
    # list[int] and int | None are pickled as these calls (judged by the caller: they keep
    # or combine classes; reduce calls its function, | runs its operands' __or__)
    "types.GenericAlias": "keeps a class and its arguments (list[int] is pickled so)",
    "functools.reduce": "calls its function on the items in turn (int | None is pickled as "
                        "reduce(operator.or_, (int, NoneType)))",
    "_functools.reduce": "calls its function on the items in turn (protocols 4 and 5 name "
                         "functools.reduce so)",
    "operator.or_": "a | b: runs the __or__ of its operands' classes",
    "_operator.or_": "a | b: runs the __or__ of its operands' classes",
    "hmac.new": "calls its digestmod", "hmac.HMAC": "calls its digestmod",
    "hmac.digest": "calls its digest",
}

_OPTIMIZER = ("a torch optimizer: __init__ checks its numbers and keeps the params it is given "
              "in plain dicts (Optimizer.__init__); what the program adds is the program's")
_SCHEDULER = ("a torch learning-rate schedule: __init__ keeps its numbers and reads the "
              "optimizer the program gives it (a callable the file hands it is judged)")
for _m, _n in (("adadelta", "Adadelta"), ("adagrad", "Adagrad"), ("adam", "Adam"),
               ("adamax", "Adamax"), ("adamw", "AdamW"), ("asgd", "ASGD"), ("lbfgs", "LBFGS"),
               ("nadam", "NAdam"), ("radam", "RAdam"), ("rmsprop", "RMSprop"),
               ("rprop", "Rprop"), ("sgd", "SGD"), ("sparse_adam", "SparseAdam"),
               ("_adafactor", "Adafactor")):
    CALLS[f"torch.optim.{_m}.{_n}"] = CALLS[f"torch.optim.{_n}"] = _OPTIMIZER
for _n in ("StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
           "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "PolynomialLR", "OneCycleLR",
           "CyclicLR", "ReduceLROnPlateau"):  # LambdaLR calls the function it is given
    CALLS[f"torch.optim.lr_scheduler.{_n}"] = _SCHEDULER

_PURE = "pure tensor computation on what it is given (no file, process or import)"
_NUMPY_SCALAR = "a NumPy scalar type: calling it converts a number (pure computation)"
_TYPING = "a typing form: subscripting or checking it builds a type alias, nothing else"
#: References vetted to be called with *any* arguments (the program's own included): a
#: function or class kept as a value (an activation function as a module attribute,
#: ``numpy.float32`` as a dtype, a ``typing`` form) that the program, or a duck-typed call,
#: may call. Each was read: its code is pure computation on its arguments.
ANY_ARGS: dict[str, str] = {
    **{f"torch.nn.functional.{n}": _PURE for n in (
        "gelu", "relu", "relu6", "silu", "mish", "elu", "selu", "celu", "leaky_relu",
        "hardswish", "hardsigmoid", "hardtanh", "softplus", "softsign", "tanhshrink",
        "sigmoid", "tanh", "glu", "logsigmoid", "softmax", "log_softmax", "gumbel_softmax",
        "normalize", "dropout", "linear", "layer_norm", "group_norm", "rms_norm", "prelu",
        "rrelu", "threshold", "softmin", "hardshrink", "softshrink", "silu")},
    **{f"torch._C._nn.{n}": _PURE for n in (
        "gelu", "silu", "mish", "elu", "leaky_relu", "hardswish", "hardsigmoid", "hardtanh",
        "softplus", "relu6", "glu", "log_sigmoid", "softshrink", "linear")},
    **{f"torch.{n}": _PURE for n in (
        "sigmoid", "tanh", "relu", "exp", "log", "sin", "cos", "abs", "sqrt", "rsqrt",
        "erf", "softmax", "log_softmax", "selu", "celu", "square", "neg", "sign",
        "zeros_like", "ones_like")},
    # protocol 2 pickles torch.zeros_like as getattr(torch._C._VariableFunctionsClass, name)
    # (normflows' MaskedAffineFlow keeps it as an attribute)
    **{f"torch._C._VariableFunctionsClass.{n}": _PURE for n in (
        "sigmoid", "tanh", "relu", "exp", "log", "sqrt", "softmax", "log_softmax",
        "zeros_like", "ones_like")},
    **{f"torch.{n}Tensor": "a legacy tensor type (the TAR layout's tensors pickle names it): "
       "calling it makes a tensor from sizes or data" for n in (
        "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
        "ComplexFloat", "ComplexDouble")},
    **{f"torch.nn.init.{n}": "a torch initializer: fills the tensor it is given in place "
       "under no_grad (tensor.normal_() …), pure tensor computation" for n in (
        "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
        "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
        "orthogonal_", "sparse_")},
    **{path: "a storage class: calling it makes a storage of a size or from a sequence "
       "(THPStorage_pynew, TypedStorage.__new__); from_file is a classmethod of its own, "
       "never reached by calling the class" for path in (
        "torch.storage.UntypedStorage", "torch.UntypedStorage", "torch.storage.TypedStorage",
        "torch.TypedStorage")},
    **{f"math.{n}": "a math function: pure computation on numbers" for n in (
        "sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "tanh", "erf", "floor",
        "ceil", "pow", "fabs", "isfinite", "isnan", "isinf", "gcd", "prod", "fsum")},
    **{f"numpy.{n}": _NUMPY_SCALAR for n in (
        "float16", "float32", "float64", "longdouble", "half", "single", "double",
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "intc",
        "intp", "uintp", "longlong", "ulonglong", "bool_", "bool", "complex64", "complex128",
        "clongdouble", "int_", "float_", "complex_", "str_", "bytes_", "void",
        "datetime64", "timedelta64", "generic", "number", "integer", "floating")},
    **{f"typing.{n}": _TYPING for n in (
        "Any", "Optional", "Union", "List", "Dict", "Tuple", "Set", "FrozenSet", "Type",
        "Callable", "Sequence", "Mapping", "Iterable", "Iterator", "Literal", "Final",
        "ClassVar", "Annotated", "MutableMapping", "MutableSequence", "Collection")},
    **{f"builtins.{n}": "a builtin value type: builds a value from what it is given" for n in (
        "int", "float", "str", "bool", "complex", "bytes", "tuple", "list", "dict", "set",
        "frozenset", "object", "slice", "range", "bytearray")},
}

#: What the vetted callables (CALLS, NEW_ONLY, FORWARDS) do with what they are handed,
#: read from their code. Every position takes plain data (str, bytes, numbers, None, and
#: tuples, lists, dicts and sets of those), storages and values vetted calls made, without
#: calling into them; a callable value anywhere else in the arguments or BUILD state counts
#: as called (torch's code, or the program, may call it by duck typing). ``HANDED_ON``: the
#: positions (and keywords) whose callable the model judges as the call the rule forwards
#: it to, so they are not counted twice.
HANDED_ON: dict[str, tuple[frozenset[int], frozenset[str]]] = {
    "functools.partial": (frozenset(range(256)), frozenset({"*"})),  # judged with its function
    "copyreg._reconstructor": (frozenset({0, 1}), frozenset()),
    "copyreg.__newobj__": (frozenset({0}), frozenset()),
    "copyreg.__newobj_ex__": (frozenset({0}), frozenset()),
    "torch._tensor._rebuild_from_type_v2": (frozenset({0, 1, 2}), frozenset()),
    "torch._tensor._rebuild_from_type": (frozenset({0, 1, 2}), frozenset()),
    "torch._utils._rebuild_wrapper_subclass": (frozenset({0}), frozenset()),
    "numpy.random._pickle.__generator_ctor": (frozenset({1}), frozenset({"bit_generator_ctor"})),
    "numpy.random._pickle.__randomstate_ctor": (frozenset({1}),
                                                frozenset({"bit_generator_ctor"})),
    "numpy.random._pickle.__bit_generator_ctor": (frozenset({0}), frozenset({"bit_generator"})),
    "builtins.getattr": (frozenset({0}), frozenset()),
    "builtins.type": (frozenset({0}), frozenset()),
    "operator.getitem": (frozenset({0, 1}), frozenset()),
    "_operator.getitem": (frozenset({0, 1}), frozenset()),
    "types.GenericAlias": (frozenset({0, 1}), frozenset()),
    "functools.reduce": (frozenset({0, 1, 2}), frozenset()),
    "_functools.reduce": (frozenset({0, 1, 2}), frozenset()),
    "operator.or_": (frozenset({0, 1}), frozenset()),
    "_operator.or_": (frozenset({0, 1}), frozenset()),
    "hmac.new": (frozenset({2}), frozenset({"digestmod"})),
    "hmac.HMAC": (frozenset({2}), frozenset({"digestmod"})),
    "hmac.digest": (frozenset({2}), frozenset({"digest"})),
}

class ArgSpec(NamedTuple):
    """What a vetted callable does with one argument (or its BUILD state), read from its code:
    the methods it looks up on it and calls (``__getitem__``: it subscripts it, which runs a
    ``defaultdict``'s factory on a missing key), and whether the result keeps it (then it is
    part of the object graph, and a method looked up on the result later may reach it)."""

    methods: frozenset[str] = frozenset()
    keeps: bool = False


class Spec(NamedTuple):
    """An entry's argument spec: by position, then any other position or keyword, then the
    BUILD state."""

    args: tuple[ArgSpec, ...] = ()
    rest: ArgSpec = ArgSpec()
    state: ArgSpec = ArgSpec(keeps=True)


def _calling(*names: str, keeps: bool = False) -> ArgSpec:
    return ArgSpec(frozenset(names), keeps)


_KEPT = ArgSpec(keeps=True)
_DATA = ArgSpec()
_MAPPING = _calling("keys", keeps=True)  # dict(x) / dict.update(x): x.keys(), then x[k] of each
_ITERATED = _KEPT  # iter(x) is a type slot: only the class's own code runs
#: The argument specs read so far. An entry of CALLS, NEW_ONLY or FORWARDS not here is
#: judged conservatively: every callable anywhere in what it is handed counts as called.
#: C's load_build (torch.load uses the C unpickler) sets a state with no __setstate__ by
#: PyDict_Next over a real dict (and PyObject_SetAttr for slot state): no method is called.
SPECS: dict[str, Spec] = {
    # argparse.Namespace.__init__: setattr(self, name, kwargs[name]) for each keyword
    "argparse.Namespace": Spec(rest=_KEPT),
    # SimpleNamespace(**kw) (3.11); 3.13's positional mapping is merged with PyDict_Update
    "types.SimpleNamespace": Spec((_MAPPING,), _KEPT),
    # dict_update_arg: a non-dict with .keys is merged by keys() and __getitem__
    "builtins.dict": Spec((_MAPPING,), _KEPT),
    # odict's mutablemapping_update: .keys() (else .items()) of a non-dict
    "collections.OrderedDict": Spec((_calling("keys", "items", keeps=True),), _KEPT),
    # Counter.update: a Mapping's .items(), else dict.update (keys) or counting elements
    "collections.Counter": Spec((_calling("keys", "items", keeps=True),), _KEPT),
    # defaultdict(factory, mapping): the factory is kept (called on a missing key)
    "collections.defaultdict": Spec((_KEPT, _MAPPING), _KEPT),
    "collections.deque": Spec((_ITERATED, _DATA)),  # iterable, maxlen (an index)
    **{f"builtins.{n}": Spec((_ITERATED,)) for n in ("list", "tuple", "set", "frozenset")},
    # object.__new__ ignores the NEWOBJ arguments; BUILD sets maps in __dict__ (C load_build)
    "collections.ChainMap": Spec(),
    # UUID(hex): hex.replace('urn:', '').replace('uuid:', ''); bytes, bytes_le, fields and
    # int are measured, sliced and unpacked (type slots); __setstate__: state['int']
    "uuid.UUID": Spec((_calling("replace"),), _DATA, _calling("__getitem__", keeps=True)),
    # Parameter.__new__: a tensor of an exact tensor type is wrapped, anything else:
    # data.detach().requires_grad_(requires_grad)
    "torch.nn.parameter.Parameter": Spec((_calling("detach"), _DATA)),
    "torch._utils._rebuild_parameter": Spec((_calling("detach"), _DATA, _KEPT)),
    # … then _set_obj_state(param, state): state.items() of its dict part
    "torch._utils._rebuild_parameter_with_state": Spec((_calling("detach"), _DATA, _KEPT,
                                                        _calling("items", keeps=True))),
    # _rebuild_tensor reads storage.dtype and storage._untyped_storage (no call); size and
    # stride are parsed by C; backward_hooks is kept; metadata goes to C
    "torch._utils._rebuild_tensor": Spec((_DATA, _DATA, _DATA, _DATA)),
    "torch._utils._rebuild_tensor_v2": Spec((_DATA, _DATA, _DATA, _DATA, _DATA, _KEPT,
                                             _DATA)),
    "torch.Size": Spec((_DATA,)), "torch.device": Spec((_DATA, _DATA)),  # parsed by C
    "datetime.timedelta": Spec(rest=_DATA),  # numbers (type slots)
}

#: Methods a vetted callable calls on an argument that is not plain data (position, method;
#: -1: the BUILD state), as its code reads: named in the report of a callable it reaches
#: (for the entries without a :data:`SPECS` entry yet).
METHODS_CALLED: dict[str, tuple[tuple[int, str], ...]] = {
    "torch.optim.Optimizer": ((-1, "setdefault"),),  # __setstate__: defaults.setdefault
    "torch.nn.modules.rnn.RNNBase": ((-1, "__getitem__"),),  # self._all_weights[0][0]
    "torch._utils._rebuild_qtensor": ((4, "__getitem__"),),  # quantizer_params[0]
}


#: Top-level packages whose import (module code run by ``import``) is vetted, with why.
IMPORT_PACKAGES: dict[str, str] = {
    "torch": "the loader itself (torch.load imported it)",
    "__torch__": "TorchScript class names: torch.jit builds them from the archive's code/, "
                 "nothing is imported",
    "numpy": "a torch dependency", "omegaconf": "config library vetted for its nodes",
    "transformers": "vetted for configs and TrainingArguments",
    "accelerate": "imported by transformers' TrainingArguments",
    "lightning": "vetted for checkpoints", "lightning_fabric": "vetted for checkpoints",
    "pytorch_lightning": "vetted for checkpoints",
}

#: Modules and names known to run code, touch files, processes or the network when called or
#: imported, beyond DENIED_MODULE_FAMILIES (prefixes: a module and its submodules, or exact
#: module.name).
DANGEROUS: dict[str, str] = {
    "wave": "wave.open / Wave_write open the file they are given for writing",
    "aifc": "aifc.open / Aifc_write open the file they are given",
    "sunau": "sunau.open / Au_write open the file they are given",
    "_pyio": "the pure-Python io module opens files",
    "argparse.FileType": "an instance called with a path opens that file",
    "torch.utils._zip": "writes ZIP files", "torch.PyTorchFileWriter": "writes a file",
    "torch.PyTorchFileReader": "opens a file", "torch.from_file": "maps a file",
    "torch.load": "a nested torch.load", "torch.save": "writes a file",
    "torch.storage._load_from_bytes": "a nested torch.load(weights_only=False) of bytes the "
                                      "file holds",
    "torch.fx.graph_module": "reduce_graph_module execs Python source from the file",
    "fsspec": "opens local and remote files (LocalFileOpener …)",
    "sympy": "sympy constructors parse and evaluate strings (sympify)",
    "_sitebuiltins": "Quitter exits the process, _Printer reads files, _Helper runs pydoc",
    "netrc": "reads a file", "uu": "writes files", "binhex": "writes files",
    "zipapp": "writes archives", "mimetypes": "reads files", "trace": "runs code",
    "numpy.memmap": "maps a file", "numpy.lib._npyio_impl": "loads files",
    "numpy.fromfile": "reads a file", "numpy.load": "loads (and unpickles) a file",
    "numpy.save": "writes a file", "numpy.savez": "writes a file",
    "numpy.savez_compressed": "writes a file", "numpy.savetxt": "writes a file",
    "numpy.lib.npyio": "loads and writes files",
    "antigravity": "opens a web browser on import", "this": "prints on import",
    "__hello__": "prints on import", "__phello__": "prints on import",
    "idlelib": "starts IDLE", "turtledemo": "starts a GUI",
    "_aix_support": "runs shell commands", "_osx_support": "runs shell commands",
    "_pyrepl": "its pager runs shell commands", "test": "CPython's test helpers run processes",
    "codecs.open": "opens a file", "codecs.EncodedFile": "wraps a file",
    "ensurepip": "runs pip", "venv": "creates environments and runs pip",
    "_bootlocale": "imports by name", "_posixshmem": "shared memory",
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENT}(?:\.{_IDENT})*\Z")
_STDLIB = frozenset(sys.stdlib_module_names)
_HF_CONFIG = re.compile(r"transformers\.models\.[a-z0-9_]+\.configuration_[a-z0-9_]+\Z")


def package_of(module: str) -> str:
    """The top-level package whose code an import of ``module`` runs."""
    return module.split(".", 1)[0]


def _in(prefixes: dict[str, str] | frozenset[str], path: str) -> str | None:
    """The longest key of ``prefixes`` that is ``path`` or a dotted prefix of it."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in prefixes:
            return key
    return None


def _known_danger(module: str, name: str, *, called: bool) -> str | None:
    path = f"{module}.{name}"
    key = _in(DANGEROUS, path)
    if key is not None:
        return f"{DANGEROUS[key]} ({key})"
    if module.split(".")[-1] == "__main__" and module != "__main__":
        return "runs a program's __main__ on import"
    if _in(DENIED_MODULE_FAMILIES, module) is not None and (called or not top_is(module, "torch")):
        # torch's own native and JIT modules hold plain functions a module keeps as an
        # attribute (torch._C._nn.gelu): a reference to them runs nothing
        return "belongs to a module that can run code, touch files, processes or the network"
    return None


@functools.lru_cache(maxsize=4096)
def import_verdict(module: str, name: str, *, called: bool = False) -> tuple[Severity, str]:
    """What importing ``module`` and reading ``name`` from it would run (a reference)."""
    path = f"{module}.{name}"
    if not _DOTTED.match(module) or not _DOTTED.match(name):
        return "dangerous", "is not a valid dotted Python name"
    if any(s.startswith("__") and s.endswith("__") for s in name.split(".")):
        return "dangerous", "reaches a dunder attribute"
    if path in CALLS or path in NEW_ONLY or path in FORWARDS:
        return "vetted", (CALLS.get(path) or NEW_ONLY.get(path) or FORWARDS[path])
    if module in ("builtins", "__builtin__") and name in PYTHON_CONSTANTS:
        return "vetted", "a constant of the language (... or NotImplemented), not code"
    if "." in name and torch_constant(module, name) is not None:
        return "vetted", ("a torch constant (a memory format) as pickle protocols 4 and 5 name "
                          "it: importing torch is vetted, the walk ends at an inert value")
    segments = name.split(".")
    if len(segments) > 1 and not all(s[:1].isupper() for s in segments):
        return "dangerous", "walks attributes through a dotted name"
    danger = _known_danger(module, name, called=called)
    if danger is not None:
        return "dangerous", danger
    top = package_of(module)
    if top in IMPORT_PACKAGES:
        return "vetted", f"a reference; importing {top} is vetted: {IMPORT_PACKAGES[top]}"
    if top == "__main__":
        return "vetted", ("a reference to the running program's own name (__main__ is the "
                          "program that calls torch.load, already imported: nothing new runs)")
    if top in _STDLIB:
        return "vetted", (f"a reference; importing the standard library's {top} runs no "
                          "unvetted code")
    return "unvetted", f"importing {module} runs the code of the {top} package, not vetted"


@functools.lru_cache(maxsize=4096)
def call_verdict(module: str, name: str, *, new: bool = False) -> tuple[Severity, str]:
    """What calling ``module.name`` (``new``: creating it with ``__new__`` and building it)
    would run."""
    path = f"{module}.{name}"
    if path in CALLS:
        return "vetted", CALLS[path]
    if path in ANY_ARGS:
        return "vetted", ANY_ARGS[path]
    if path in FORWARDS and not path.startswith("hmac."):
        return "vetted", f"{FORWARDS[path]} (what it calls is judged on its own)"
    if new and path in NEW_ONLY:
        return "vetted", NEW_ONLY[path]
    severity, reason = import_verdict(module, name, called=True)
    if severity == "dangerous":
        return severity, reason
    if new and name[:1].isupper() and (top_is(module, "torch.nn.modules")
                                       or top_is(module, "torch.optim")):
        return "vetted", "a torch module or optimizer class: __new__ is object's and " \
                         "__setstate__ restores its __dict__"
    if new and name.endswith("Config") and _HF_CONFIG.match(module):
        return "vetted", "a transformers model config (PretrainedConfig): __new__ is " \
                         "object's and BUILD fills __dict__ (no __setstate__ of its own)"
    if new and module == "__main__" and name[:1].isupper() and "." not in name:
        return "vetted", "a class of the loading program itself (__main__) created with " \
                         "__new__ and built: code the user already runs"
    if top_is(module, "torch.return_types") or top_is(module, "__torch__"):
        return "vetted", "a torch struct sequence, or a TorchScript class torch.jit builds " \
                         "from the archive's code/"
    if path in NEW_ONLY:
        return "unvetted", (f"calling {path} runs its __init__, which is not vetted (only "
                            "__new__ + BUILD is)")
    top = package_of(module)
    verb = "creating" if new else "calling"
    if top == "__main__":
        return "unvetted", (f"{verb} {path} runs code of the running program (__main__: "
                            "whatever script calls torch.load), which is not vetted")
    where = "the standard library's" if top in _STDLIB else "the"
    return "unvetted", f"{verb} {path} runs code of {where} {top} package that is not vetted"


#: Methods that touch files, processes or the network although their class is vetted to be
#: created (prefixes of ``class.method``, as :data:`DANGEROUS`): a bound method of one, read
#: with ``getattr`` and kept, is dangerous.
DANGEROUS_METHODS: dict[str, str] = {
    "pathlib": "a path object's methods read, write and delete the file it names (touch, "
               "write_text, unlink, open …)",
    "numpy.ndarray.tofile": "writes a file", "numpy.ndarray.dump": "writes a pickle file",
    "array.array.tofile": "writes to a file",
}


def method_verdict(cls: Global, attr: str, cls_severity: Severity) -> tuple[Severity, str]:
    """What ``getattr(obj, attr)`` runs, ``obj`` created by ``cls.__new__`` (NEWOBJ,
    ``copyreg.__newobj__``, ``copyreg._reconstructor``) with ``cls_severity`` (its
    :func:`call_verdict` with ``new``), ``attr`` a plain identifier, not a dunder: the class's
    attribute lookup (``__getattribute__``, ``__getattr__``, descriptors), and the method it
    finds, kept and so counted as called with unknown arguments. Code of the class: unvetted,
    unless the class or the method is on a dangerous list, or the class is an unvetted one of
    the standard library (its objects are files, sockets, processes …); vetted only for a
    method vetted by name."""
    path = f"{cls.path}.{attr}"
    if cls_severity == "dangerous":
        return "dangerous", f"looks up {path} on an object of a dangerous class"
    key = _in(DANGEROUS_METHODS, path)
    if key is not None:
        return "dangerous", f"looks up and may call {path}: {DANGEROUS_METHODS[key]} ({key})"
    danger = _known_danger(cls.module, f"{cls.name}.{attr}", called=True)
    if danger is not None:
        return "dangerous", f"looks up and may call {path}: {danger}"
    if path in CALLS or path in ANY_ARGS:
        return "vetted", CALLS.get(path) or ANY_ARGS[path]
    top = package_of(cls.module)
    if cls_severity != "vetted" and top in _STDLIB:
        return "dangerous", (f"looks up and may call {path}: an unvetted class of the standard "
                             "library (its objects include files, sockets and processes)")
    whose = "the running program (__main__)" if top == "__main__" else f"the {top} package"
    return "unvetted", (f"looks up and may call {path}: the attribute lookup and the method "
                        f"are code of {cls.path} ({whose}), which is not vetted")


def top_is(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or one of its submodules."""
    return module == package or module.startswith(package + ".")


_Forward = list[tuple[object, tuple[object, ...]]]


def forwarded(path: str, args: tuple[object, ...],
              kwargs: dict[object, object] | None = None) -> _Forward:
    """The calls a vetted forwarding rule ``path`` makes with what the file gave it, as
    ``(callable, arguments)`` pairs (the callable as the file built it); [] when it forwards
    nothing for these arguments. ``functools.partial`` forwards when the partial is called,
    not here; ``builtins.getattr``, ``type``, ``operator.getitem``, ``types.GenericAlias``,
    ``functools.reduce`` and ``operator.or_`` are judged by the caller (the scanner's model
    of annotations)."""
    kw = kwargs or {}
    if path in ("torch._tensor._rebuild_from_type_v2", "torch._tensor._rebuild_from_type"):
        # func(*args) unpacks any iterable: a list, a dict's keys, a call's result
        if len(args) < 3 or args[2] is None or isinstance(args[2], (bool, int, float, complex)):
            return []  # not iterable: the call fails before func runs
        fargs = args[2]
        if isinstance(fargs, (tuple, list, dict)) and type(fargs) in (tuple, list, dict):
            return [(args[0], tuple(fargs))]
        return [(args[0], (fargs,))]  # items unknown (a str's characters, a call's result)
    if path == "copyreg._reconstructor":
        if len(args) == 3 and not _is_object(args[1]):
            return [(args[1], (args[2],))]
        return []
    if path in ("numpy.random._pickle.__generator_ctor",
                "numpy.random._pickle.__randomstate_ctor"):
        name = args[0] if args else kw.get("bit_generator_name", "MT19937")
        ctor = args[1] if len(args) > 1 else kw.get("bit_generator_ctor")
        if ctor is None:
            return forwarded("numpy.random._pickle.__bit_generator_ctor", (name,))
        return [(ctor, (name,))]
    if path == "numpy.random._pickle.__bit_generator_ctor":
        target = args[0] if args else kw.get("bit_generator")
        return [(target, ())] if _is_global(target) else []
    if path in ("hmac.new", "hmac.HMAC", "hmac.digest"):
        digest = args[2] if len(args) > 2 else kw.get("digestmod", kw.get("digest"))
        return [] if digest is None or isinstance(digest, str) else [(digest, ())]
    return []


def _is_global(value: object) -> bool:
    return isinstance(value, Global)


def _is_object(value: object) -> bool:
    return isinstance(value, Global) and value.name == "object" and \
        value.module in ("builtins", "__builtin__")
