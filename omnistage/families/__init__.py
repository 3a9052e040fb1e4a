"""Model families: one folder each, everything about one kind of model.

A folder holds its model classes, multimodal input encoder, edge processors,
deploy files (`deploys/*.yaml`), the maker of its tiny random-weight checkpoint
and its built-in demo, and declares them in its `__init__.py` as one
`FAMILY = Family(...)` record (`omnistage.models.family`). The registry
(`omnistage.models.registry`) finds the folders and imports a family's code
only when a lookup needs it; nothing outside this package imports a family
module (an import-linter contract in `make test`). Adding a family is adding a
folder and its tests. A family may build on another's model classes
(Qwen3-Omni's talker is a Qwen3-MoE decoder).
"""
