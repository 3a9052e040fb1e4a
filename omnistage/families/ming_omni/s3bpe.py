"""The speech BPE between Ming-Omni's talker and its vocoder (the reference's
`s3bpe_tokenizer.S3BpeTokenizer.decode`).

The talker writes BPE ids over "characters", one character per S3 speech code
(`s3_bpe/char_mapping.txt`: `code<TAB>char` lines); decoding is the BPE tokenizer's
decode (`s3_bpe/tokenizer.json`, read with `tokenizers`), spaces removed, each character
mapped back to its code. The files sit beside the vocoder's, in the checkpoint's
`talker/` folder (the reference reads them under the talker's `_name_or_path`).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

BPE_DIR = "s3_bpe"


class S3Bpe:
    """BPE ids -> S3 speech codes."""

    def __init__(self, talker_dir: Path) -> None:
        folder = talker_dir / BPE_DIR
        for name in ("tokenizer.json", "char_mapping.txt"):
            if not (folder / name).is_file():
                raise ValueError(f"model: {folder / name} is missing (Ming-Omni's speech BPE)")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.code_of: dict[str, int] = {}
        for line in (folder / "char_mapping.txt").read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            code, char = line.strip().split("\t")
            self.code_of[char] = int(code)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def decode(self, ids: list[int]) -> list[int]:
        """The S3 codes of BPE ids (ValueError on an id outside the BPE vocabulary)."""
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"speech BPE id {bad[0]} is outside [0, {self.vocab_size})")
        text = self.tokenizer.decode(ids).replace(" ", "")
        unknown = [c for c in text if c not in self.code_of]
        if unknown:
            raise ValueError(f"speech BPE: {unknown[0]!r} has no S3 code in char_mapping.txt")
        return [self.code_of[c] for c in text]
