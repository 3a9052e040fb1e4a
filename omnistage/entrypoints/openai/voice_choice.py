"""Which voice a pipeline request speaks with: the talker's named speakers, its default,
or an uploaded voice (a TTS model that clones), as `PipelineClient` checks them."""

from __future__ import annotations

import functools
from typing import Any

from omnistage.entrypoints.openai.errors import OpenAIError


class VoiceChoice:
    """Mixin of `PipelineClient` (which has `deploy` and `speaks`)."""

    deploy: Any
    speaks: bool

    @functools.cached_property
    def voices(self) -> list[str] | None:
        """The speakers of the pipeline's talker checkpoint (`voices.speakers_of`), or None
        when it has no talker to choose a speaker of."""
        from omnistage.pipeline.voices import speakers_of

        return speakers_of(self.deploy)

    @property
    def default_voice(self) -> str | None:
        from omnistage.pipeline.voices import default_voice

        voice = default_voice(self.deploy)
        if voice is not None:
            return voice
        return "default" if self.speaks else None

    def check_voice(self, voice: str | None, param: str) -> str | None:
        """The request's `voice` as the pipeline takes it (`generate(voice=...)`): one of
        `voices` (any case), None for None or a pipeline without voices to choose from
        given its default, an uploaded voice's id (a TTS model that clones); any other is a
        400 naming `param` with the choices."""
        if voice is None:
            return None
        if self.voice_store is not None and self.voice_store.is_voice_id(voice):
            if self.voice_store.get(voice) is None:
                raise OpenAIError(f"{param}: no uploaded voice {voice!r}", param=param)
            return voice
        choices = self.voices
        if choices is None:
            default = self.default_voice
            if default is not None and voice.lower() == default.lower():
                return None
            raise OpenAIError(
                f"{param}: {voice!r} is not available; this model speaks only with its "
                f"default voice {default!r}",
                param=param,
            )
        by_lower = {c.lower(): c for c in choices}
        if voice.lower() not in by_lower:
            raise OpenAIError(
                f"{param}: {voice!r} is not one of {', '.join(sorted(by_lower))}", param=param
            )
        return by_lower[voice.lower()]

    @functools.cached_property
    def voice_store(self) -> Any:
        """The uploaded voices of the pipeline's TTS talker (`VoiceStore`), or None."""
        from omnistage.pipeline.voices import voice_store

        return voice_store(self.deploy)
