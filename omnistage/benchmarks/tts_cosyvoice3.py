"""`omnistage bench tts --model demo-cosyvoice3` against its reference: the peer's texts and
command, its per-request results summarized, and the comparison with ours at c=1.

The peer (`cosyvoice3_peer.py`, run with the reference venv's Python: `--peer-python`,
default `.reference/cosyvoice-env/bin/python`) speaks the texts our c=1 measurements
spoke, one request at a time, streamed and then whole, and reports per request the
speech tokens its LM wrote and spoke, the time to first audio, the wall time and the
audio seconds. Our side cannot see the LM's tokens (only final stages report to the
caller), so ours are counted from the audio: token2wav speaks each speech token as two
mel frames of 480 samples at 24 kHz, 25 tokens a second (the reference's spoken tokens
and audio obey the same identity, which `summarize` checks). Equal token counts mean both
sides did the same work per request; the ratio is the reference's median RTF over ours.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

DEFAULT_PYTHON = Path(".reference/cosyvoice-env/bin/python")
TOKENS_PER_AUDIO_S = 25.0
"""Speech tokens per second of token2wav's audio (2 mel frames x 480 samples at 24 kHz)."""
PEER_MODES = {"stream": "stream", "payload": "whole"}
"""Our mode -> the peer's: the reference's streamed `tts` and its whole-utterance one."""


def peer_texts(prompts: list[str], repeat: int) -> list[str]:
    """The texts of our c=1 measurements (`tts.run_mode`'s tags): one a mode and run."""
    return [f"{mode[:3]}{i} {p}" for i in range(repeat) for mode in PEER_MODES for p in prompts]


def command(python: Path, checkpoint: Path, texts: list[str], seed: int, mode: str) -> list[str]:
    script = Path(__file__).with_name("cosyvoice3_peer.py")
    return [str(python), str(script), str(checkpoint), json.dumps(texts), str(seed), mode]


def run_peer(cmd: list[str]) -> dict[str, Any]:
    """Run the peer; its last stdout line, parsed. RuntimeError with its stderr if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the CosyVoice3 reference peer failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(peer: dict[str, Any]) -> dict[str, Any]:
    """The peer's requests as ours are reported: median TTFA and RTF, audio s per wall s
    (one at a time: all audio over all wall time), and the tokens per request."""
    requests = peer["requests"]
    if not requests:
        raise ValueError("the peer reported no requests")
    for r in requests:
        if round(r["audio_s"] * TOKENS_PER_AUDIO_S) != r["spoken_tokens"]:
            raise ValueError(
                f"the peer spoke {r['spoken_tokens']} tokens as {r['audio_s']} s of audio: "
                f"not {TOKENS_PER_AUDIO_S} tokens a second, so ours cannot be counted so"
            )
    return {
        "mode": peer["mode"],
        "voice": peer["voice"],
        "requests": len(requests),
        "ttfa_median_s": statistics.median(r["first_audio_s"] for r in requests),
        "rtf_median": statistics.median(r["wall_s"] / r["audio_s"] for r in requests),
        "audio_s_per_s": sum(r["audio_s"] for r in requests) / sum(r["wall_s"] for r in requests),
        "tokens": [r["tokens"] for r in requests],
        "spoken_tokens": [r["spoken_tokens"] for r in requests],
        "budgets": [r["budget"] for r in requests],
    }


def our_tokens(audio_s: float) -> int:
    """The speech tokens our token2wav spoke as `audio_s` seconds."""
    return round(audio_s * TOKENS_PER_AUDIO_S)


def compare(ours: dict[str, dict[str, float]], peers: dict[str, dict[str, Any]]) -> dict:
    """Per mode at c=1: the reference's RTF and TTFA, its RTF over ours (how many times
    faster ours is), the tokens per request on each side and whether they agree.
    `ours`: mode -> our c=1 measurement; `peers`: mode -> `summarize`d peer."""
    fields: dict[str, Any] = {}
    for mode, peer in peers.items():
        mine = ours[mode]
        mine_tokens = our_tokens(mine["audio_s_per_request"])
        fields |= {
            f"reference_{mode}_c1_rtf": round(peer["rtf_median"], 4),
            f"reference_{mode}_c1_ttfa_s": round(peer["ttfa_median_s"], 4),
            f"reference_{mode}_c1_audio_s_per_s": round(peer["audio_s_per_s"], 4),
            f"reference_{mode}_tokens_per_request": peer["spoken_tokens"],
            f"{mode}_c1_tokens_per_request": mine_tokens,
            f"ratio_rtf_vs_reference_{mode}_c1": round(peer["rtf_median"] / mine["rtf_median"], 3),
            f"same_tokens_{mode}": set(peer["spoken_tokens"]) == {mine_tokens},
        }
    return fields


def print_rows(peers: dict[str, dict[str, Any]]) -> None:
    """The peer's rows of the table (`tts.main`'s columns: the mode 11 wide)."""
    for peer in peers.values():
        label = f"ref-{peer['mode']}"
        print(
            f"{label:<11}{1:>5}{peer['ttfa_median_s']:>9.3f}{peer['rtf_median']:>8.3f}"
            f"{peer['audio_s_per_s']:>11.2f}"
        )
