"""`omnistage generate` for a pipeline (a deploy, an omni or image checkpoint, a demo):
one prompt through every stage; the text printed, text / audio / image written out.
"""

from __future__ import annotations

import argparse
import sys


def generate_pipeline(args: argparse.Namespace) -> int:
    """A pipeline from a deploy file: print the text, write text and audio under --out."""
    from omnistage import SamplingParams
    from omnistage.pipeline.omni import Omni

    given = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    given |= {"max_tokens": args.max_tokens, "seed": args.seed}
    fields = {k: v for k, v in given.items() if v is not None}
    modalities = args.modalities.split(",") if args.modalities else None
    with Omni(args.deploy, model=args.model, in_process=args.in_process) as omni:
        (entry,) = omni.deploy.entry_stages
        params: dict = (
            {entry.name: SamplingParams(**(entry.default_sampling | fields))} if fields else {}
        )
        params |= _diffusion_params(omni, args)
        prompt = args.prompt
        if args.chat:
            prompt = _chat_prompt(omni, args.prompt)
        speech = {"voice": args.voice, "instructions": args.instructions}
        (out,) = omni.generate(
            [prompt], params or None, modalities, language=args.language, **speech
        )
        thought = _thought_and_caption(omni, out)
    if out.error is not None:
        print(f"omnistage: error: {out.error}", file=sys.stderr)
        return 1
    if thought is not None:
        print(f"thought: {thought.thought}\ncaption: {thought.caption}")
    elif out.text is not None:
        print(out.text)
    if args.out:
        for path in write_outputs(out, args.out, thought):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _diffusion_params(omni, args: argparse.Namespace) -> dict:
    """The image flags, for each diffusion stage of the pipeline (on its defaults)."""
    from omnistage.diffusion.params import DiffusionParams

    given = {
        "height": args.height,
        "width": args.width,
        "num_inference_steps": args.num_inference_steps,
        "guidance_scale": args.guidance_scale,
        "seed": args.seed,
    }
    fields = {k: v for k, v in given.items() if v is not None}
    if args.negative_prompt:
        fields["negative_prompt"] = args.negative_prompt
    return {
        s.name: DiffusionParams.from_fields(s.default_sampling | fields)
        for s in omni.deploy.stages
        if s.kind == "diffusion"
    }


def _thought_and_caption(omni, out):
    """A think -> recaption pipeline's thought and caption (None for other pipelines)."""
    from omnistage.pipeline.recaption import split_thought

    for edge in omni.deploy.edges:
        if edge.processor == "recaption_to_prompt" and edge.src in out.outputs:
            model = omni.deploy.stage(edge.src).with_part_directory().model
            return split_thought(model, out.outputs[edge.src].token_ids)
    return None


def _chat_prompt(omni, content: str) -> str:
    from omnistage.models.loader import load_tokenizer, resolve_model

    (entry,) = omni.deploy.entry_stages
    tokenizer = load_tokenizer(resolve_model(entry.with_part_directory().model))
    messages = [{"role": "user", "content": content}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def write_outputs(out, directory: str, thought=None) -> list[str]:
    """`text.txt`, `audio.wav` (16-bit PCM), `image.png`, and for a think -> recaption
    pipeline `thought.txt` and `caption.txt`, as far as the output has them."""
    import wave
    from pathlib import Path

    import numpy as np

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    if out.text is not None:
        (root / "text.txt").write_text(out.text)
        written.append(str(root / "text.txt"))
    if out.audio is not None:
        pcm = (np.clip(out.audio, -1.0, 1.0) * 32767).astype("<i2")
        with wave.open(str(root / "audio.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(out.sample_rate)
            wav.writeframes(pcm.tobytes())
        written.append(str(root / "audio.wav"))
    if thought is not None:
        (root / "thought.txt").write_text(thought.thought)
        (root / "caption.txt").write_text(thought.caption or "")
        written += [str(root / "thought.txt"), str(root / "caption.txt")]
    if out.image is not None:
        out.image.save(root / "image.png")
        written.append(str(root / "image.png"))
    return written
