"""The family registry: every family's record resolves, agrees with its code, stays light,
and a new folder is a new family."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import omnistage.families
from omnistage.models import registry
from omnistage.models.family import Family
from omnistage.pipeline.deploy import load_deploy
from omnistage.pipeline.processors import processor_names

REFERENCE_FIELDS = (
    "models",
    "generation_models",
    "generation_parts",
    "input_encoders",
    "stage_prompters",
    "diffusion_pipelines",
    "edges",
)


def test_every_reference_a_family_declares_resolves() -> None:
    names = [f.name for f in registry.families()]
    assert {"llama", "qwen3_omni", "qwen25_omni", "glm_image", "text_to_image"} <= set(names)
    for family in registry.families():
        for field in REFERENCE_FIELDS:
            for key, reference in getattr(family, field).items():
                assert registry.resolve(reference) is not None, (family.name, field, key)
        for voices in family.voices.values():
            assert callable(registry.resolve(voices.reader))
        for demo in family.demos.values():
            assert callable(registry.resolve(demo.maker))


def test_model_classes_serve_the_architectures_their_family_names() -> None:
    for family in registry.families():
        for arch, reference in family.models.items():
            assert arch in registry.resolve(reference).architectures, (family.name, arch)
        for (model_type, part), spec in family.parts.items():
            assert spec.architecture in family.models, (family.name, model_type, part)


def test_every_packaged_deploy_parses_and_names_known_processors() -> None:
    deploys = registry.packaged_deploys()
    demos = registry.demos()
    assert {"demo-omni", "demo-image", "qwen3-omni", "glm-image", "tiny-three-stage"} <= set(
        deploys
    )
    for demo in demos.values():
        assert demo.deploy in deploys
    for family in registry.families():
        for name in [*family.deploys_by_model_type.values()]:
            assert name in deploys
        for name in family.deploys_by_pipeline_class.values():
            assert name in deploys
    known = set(processor_names())
    for name, path in deploys.items():
        spec = load_deploy(path)
        assert {e.processor for e in spec.edges} <= known, name


def test_reading_the_records_imports_no_torch() -> None:
    """Frontends (the server, the CLI) read demos, deploys and architectures at start-up."""
    code = textwrap.dedent(
        """
        import sys
        from omnistage.models import registry
        registry.supported_architectures(); registry.demos(); registry.packaged_deploys()
        registry.renders_own_prompt("glm_image"); registry.deploys_by_model_type()
        print("torch" in sys.modules, "transformers" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_two_families_claiming_one_architecture_is_an_error() -> None:
    a = Family(name="a", models={"XForCausalLM": "m:A"})
    b = Family(name="b", models={"XForCausalLM": "m:B"})
    with pytest.raises(TypeError, match="XForCausalLM.*claimed by a and b"):
        registry._merge([a, b])


def test_a_new_folder_is_a_new_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a family is adding a folder: its architectures, deploys and demos appear."""
    folder = tmp_path / "zz_example"
    (folder / "deploys").mkdir(parents=True)
    (folder / "__init__.py").write_text(
        "from omnistage.models.family import Demo, Family\n"
        "FAMILY = Family(name='zz_example',\n"
        "    models={'ExampleForCausalLM': 'omnistage.families.llama.model:LlamaForCausalLM'},\n"
        "    demos={'demo-example': Demo('an example', 'x:y', 'example')})\n"
    )
    (folder / "deploys" / "example.yaml").write_text("stages: []\n")
    monkeypatch.setattr(
        omnistage.families, "__path__", [*omnistage.families.__path__, str(tmp_path)]
    )
    registry._discovered.cache_clear()
    try:
        assert "zz_example" in [f.name for f in registry.families()]
        assert "ExampleForCausalLM" in registry.supported_architectures()
        assert registry.packaged_deploys()["example"] == folder / "deploys" / "example.yaml"
        assert registry.demos()["demo-example"].deploy == "example"
    finally:
        monkeypatch.undo()
        registry._discovered.cache_clear()
        sys.modules.pop("omnistage.families.zz_example", None)


def test_an_unknown_architecture_names_the_supported_ones() -> None:
    class Config:
        architectures = ["NopeForCausalLM"]

    with pytest.raises(ValueError, match="NopeForCausalLM.*supported: .*LlamaForCausalLM"):
        registry.model_class_for(Config())
