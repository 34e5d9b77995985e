"""The reader entry point ``/work/shared/hostile/check_reader.py --api`` grades.

``convert(inp, out)`` does what a converter would do up to the writing: open the checkpoint,
view every tensor's values and load the whole object. It writes nothing (there is no
safetensors writer yet), so the grader's "stray file" and "partial output" checks mean that
reading alone never creates a file. Any :class:`torchless.CheckpointError` is a clean
rejection for the grader; anything else counts as a crash.
"""

from __future__ import annotations

import torchless


def convert(inp: str, out: str) -> None:
    del out  # reading only: nothing is written
    with torchless.open(inp) as ckpt:
        for tensor in ckpt.tensors.values():
            tensor.numpy()
    torchless.load(inp)
