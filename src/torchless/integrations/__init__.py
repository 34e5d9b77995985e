"""Optional adapters for training frameworks: Lightning (:mod:`.lightning`), the Hugging Face
Trainer (:mod:`.transformers`) and accelerate (:mod:`.accelerate`).

Each runs only inside a program that uses its framework (installed with the extra of the
same name, e.g. ``pip install 'torchless[lightning]'``), so it may use torch: never by
``import torch`` (the library's rule, which lint and tests/project enforce for all of src/),
but through the module the framework has already imported, as :func:`torchless.load` with
``framework="pt"`` does. Nothing else in torchless imports this package.
"""
