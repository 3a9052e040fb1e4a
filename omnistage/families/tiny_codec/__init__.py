"""A tiny causal code vocoder and the three-stage pipeline around it (thinker -> talker ->
vocoder), the smallest multi-stage pipeline: tests and benchmarks run on it."""

from omnistage.models.family import Family

FAMILY = Family(
    name="tiny_codec",
    generation_models={
        "OmnistageTinyCodeVocoder": "omnistage.families.tiny_codec.vocoder:TinyCodeVocoder"
    },
)
