"""The Bagel checkpoint folder, seen as the two-stage pipeline omnistage serves.

A Bagel folder has no `config.json` (see `config.py`); `convert(src, out)` writes its
view once (the registry finds the folder by its `llm_config.json`; `models/layout_cache`
keeps the view), copying no weights — every file is a relative symbolic link:

- `out/*`: every file of `src` (the denoising stage reads the folder as Bagel's);
- `out/model_index.json`: `_class_name: OmnistageBagelPipeline`, which picks the
  `bagel` deploy and the denoising stage's model (`draw.BagelDraw`);
- `out/config.json`: `llm_config.json` with model type `bagel_understanding`: the
  folder is also the AR stage's checkpoint (`understanding.BagelUnderstanding` takes its
  expert's weights from `ema.safetensors` and ignores every other tensor).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omnistage.families.bagel.config import LLM_CONFIG, WEIGHTS
from omnistage.families.bagel.understanding import ARCHITECTURE, MODEL_TYPE

PIPELINE_CLASS = "OmnistageBagelPipeline"


def _link(target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target.resolve(), link.parent.resolve()), link)


def convert(src: Path, out: Path) -> None:
    """Write the view of Bagel folder `src` into `out` (ValueError: `src` is no Bagel folder)."""
    src, out = Path(src), Path(out)
    for name in (LLM_CONFIG, WEIGHTS, "ae.safetensors", "tokenizer.json"):
        if not (src / name).is_file():
            raise ValueError(f"{src}: not a Bagel checkpoint (no {name})")
    out.mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in src.iterdir() if p.is_file()):
        if not (out / file.name).exists():
            _link(file, out / file.name)
    index = {"_class_name": PIPELINE_CLASS, "understanding": ["omnistage", ARCHITECTURE]}
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    llm = json.loads((src / LLM_CONFIG).read_text())
    llm |= {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "qk_norm": True}
    llm["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(llm, indent=2) + "\n")
