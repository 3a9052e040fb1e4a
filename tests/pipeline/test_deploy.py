"""Deploy file loading and validation: good files load, every bad one names file, key and value."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import yaml

from omnistage.pipeline.deploy import (
    ConnectorSpec,
    DeployError,
    EdgeSpec,
    StageSpec,
    load_deploy,
    packaged_deploy_path,
    single_model_deploy,
)

VALID = {
    "name": "demo",
    "stages": [
        {
            "id": 0,
            "name": "thinker",
            "kind": "ar",
            "model_part": "thinker",
            "engine_args": {"async_scheduling": True, "max_num_seqs": 64, "dtype": "float64"},
            "default_sampling": {"temperature": 0.0, "max_tokens": 32},
            "final_output": True,
            "final_output_type": "text",
            "input_timeout_s": 30,
            "output_keys": ["hidden_states.output", "ids.output"],
        },
        {"id": 1, "name": "talker", "kind": "ar", "model": "smollm2"},
        {
            "id": 2,
            "name": "vocoder",
            "kind": "generation",
            "final_output": True,
            "final_output_type": "audio",
        },
    ],
    "edges": [
        {
            "from": "thinker",
            "to": "talker",
            "processor": "hidden_to_embeds",
            "transfer": "payload",
            "connector": "shm",
        },
        {
            "from": 1,
            "to": "vocoder",
            "processor": "ids_to_codes",
            "transfer": "stream",
            "connector": "remote",
            "chunk_size": 8,
            "first_chunk_size": 2,
            "left_context": 4,
        },
    ],
    "connectors": {"remote": {"kind": "zmq", "host": "127.0.0.1"}},
}


def _write(tmp_path, data, name="deploy.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _bad(tmp_path, edit, *fragments):
    """Apply `edit` to a copy of VALID, load it from a file, and check the error message."""
    data = copy.deepcopy(VALID)
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(DeployError) as info:
        load_deploy(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# --- good files ---------------------------------------------------------------------------


def test_valid_file_loads(tmp_path):
    spec = load_deploy(_write(tmp_path, VALID))
    assert spec.name == "demo" and spec.source.endswith("deploy.yaml")
    thinker = spec.stage("thinker")
    assert thinker == StageSpec(
        id=0,
        name="thinker",
        kind="ar",
        model=None,
        model_part="thinker",
        engine_args={"async_scheduling": True, "max_num_seqs": 64, "dtype": "float64"},
        default_sampling={"temperature": 0.0, "max_tokens": 32},
        final_output=True,
        final_output_type="text",
        input_timeout_s=30.0,
        output_keys=("hidden_states.output", "ids.output"),
    )
    assert spec.stage("talker").input_timeout_s == 60.0
    assert spec.edges_from("talker") == (
        EdgeSpec("talker", "vocoder", "ids_to_codes", "stream", "remote", 8, 2, 4),
    )
    assert spec.edges_into("talker")[0].src == "thinker"
    assert spec.edges_into("talker")[0].chunk_size == 16  # defaults kept for non-stream edges
    assert spec.connectors["remote"] == ConnectorSpec("remote", "zmq", {"host": "127.0.0.1"})
    assert spec.connectors["shm"].kind == "shm" and "inproc" in spec.connectors
    assert spec.topological_order() == ("thinker", "talker", "vocoder")
    assert [s.name for s in spec.entry_stages] == ["thinker"]
    assert [s.name for s in spec.final_stages] == ["thinker", "vocoder"]


def test_mapping_source_and_with_model():
    spec = load_deploy(copy.deepcopy(VALID))
    assert spec.source == "<dict>"
    filled = spec.with_model("/models/omni")
    assert [s.model for s in filled.stages] == ["/models/omni", "smollm2", "/models/omni"]
    assert spec.stage("thinker").model is None  # original untouched


def test_stream_defaults_and_topological_order_of_a_join(tmp_path):
    data = copy.deepcopy(VALID)
    data["edges"][1] = {
        "from": "talker",
        "to": "vocoder",
        "processor": "ids_to_codes",
        "transfer": "stream",
        "connector": "shm",
        "chunk_size": 5,
    }
    data["edges"].append(
        {"from": "thinker", "to": "vocoder", "processor": "text_to_prompt", "transfer": "prompt"}
    )
    spec = load_deploy(_write(tmp_path, data))
    stream = spec.edges_from("talker")[0]
    assert (stream.chunk_size, stream.first_chunk_size, stream.left_context) == (5, 5, 0)
    assert (stream.chunk_growth, stream.max_chunk_size) == (1, None)
    data["edges"][1].update(chunk_growth=2, max_chunk_size=20)
    grown = load_deploy(_write(tmp_path, data)).edges_from("talker")[0]
    assert (grown.chunk_size, grown.chunk_growth, grown.max_chunk_size) == (5, 2, 20)
    assert spec.topological_order() == ("thinker", "talker", "vocoder")
    assert len(spec.edges_into("vocoder")) == 2


def test_packaged_tiny_three_stage_loads():
    path = packaged_deploy_path("tiny-three-stage")
    spec = load_deploy(path)
    assert spec.name == "tiny-three-stage"
    assert spec.topological_order() == ("thinker", "talker", "vocoder")
    assert spec.stage("vocoder").kind == "generation"
    assert spec.stage("vocoder").final_output_type == "audio"
    stream = spec.edges_into("vocoder")[0]
    assert (stream.transfer, stream.processor, stream.connector) == (
        "stream",
        "ids_to_codes",
        "shm",
    )
    assert (stream.chunk_size, stream.first_chunk_size, stream.left_context) == (8, 2, 4)
    assert spec.edges_into("talker")[0].transfer == "payload"


def test_packaged_unknown_name_lists_available():
    with pytest.raises(DeployError, match=r"'nope'.*available: .*tiny-three-stage"):
        packaged_deploy_path("nope")


def test_single_model_deploy():
    spec = single_model_deploy("smollm2", {"max_num_seqs": 4}, {"temperature": 0.0})
    (stage,) = spec.stages
    assert (stage.name, stage.kind, stage.model) == ("llm", "ar", "smollm2")
    assert stage.final_output and stage.final_output_type == "text"
    assert stage.engine_args == {"max_num_seqs": 4} and spec.edges == ()
    assert spec.topological_order() == ("llm",) and spec.entry_stages == (stage,)
    with pytest.raises(DeployError, match=r"stages\[0\]\.engine_args\.max_num_seqs"):
        single_model_deploy("smollm2", {"max_num_seqs": 0})


def test_error_pickles():
    err = DeployError("f.yaml", "stages[0].id", "expected an integer")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.key_path == "stages[0].id"


# --- file and top level -------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(
        DeployError, match=re.escape(f"{tmp_path / 'no.yaml'}: deploy file not found")
    ):
        load_deploy(tmp_path / "no.yaml")


def test_not_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("stages: [\n  - id: 0\n  name: {")
    with pytest.raises(DeployError, match=re.escape(f"{path}: not valid YAML")):
        load_deploy(path)


def test_top_level_not_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(DeployError, match=r"list\.yaml: expected a mapping, got list \[1, 2\]"):
        load_deploy(path)


def test_unknown_top_level_key(tmp_path):
    _bad(tmp_path, lambda d: d.update(stagez=[]), "stagez: unknown key 'stagez'", "'stages'")


@pytest.mark.parametrize("stages", [None, [], "thinker"], ids=["missing", "empty", "not-a-list"])
def test_stages_missing_empty_or_not_list(tmp_path, stages):
    def edit(d):
        d.pop("edges")
        if stages is None:
            d.pop("stages")
        else:
            d["stages"] = stages

    expected = (
        "missing required key 'stages'" if stages is None else "stages: expected a non-empty list"
    )
    _bad(tmp_path, edit, expected)


def test_edges_not_a_list(tmp_path):
    _bad(tmp_path, lambda d: d.update(edges={}), "edges: expected a list of edges, got dict {}")


# --- stages -------------------------------------------------------------------------------


def test_stage_unknown_key(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["stages"][1].update(enginge_args={}),
        "stages[1].enginge_args: unknown key 'enginge_args'",
        "did you mean 'engine_args'",
    )


@pytest.mark.parametrize("key", ["id", "name", "kind"])
def test_stage_missing_required(tmp_path, key):
    _bad(tmp_path, lambda d: d["stages"][2].pop(key), f"stages[2]: missing required key '{key}'")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("id", "one", "stages[1].id: expected an integer >= 0, got str 'one'"),
        ("id", True, "stages[1].id: expected an integer >= 0, got bool True"),
        (
            "name",
            "tal ker",
            "stages[1].name: expected a name matching [A-Za-z0-9_-]+, got str 'tal ker'",
        ),
        ("name", "", "stages[1].name: expected a name"),
        ("kind", "llm", "stages[1].kind: expected one of ar, generation, diffusion, got str 'llm'"),
        ("final_output", "yes", "stages[1].final_output: expected true or false, got str 'yes'"),
        ("input_timeout_s", 0, "stages[1].input_timeout_s: expected a positive number, got int 0"),
        (
            "input_timeout_s",
            "30",
            "stages[1].input_timeout_s: expected a positive number, got str '30'",
        ),
        ("model", 7, "stages[1].model: expected a non-empty string or null, got int 7"),
        ("output_keys", "ids", "stages[1].output_keys: expected a list of strings, got str 'ids'"),
        (
            "output_keys",
            ["ids", 3],
            "stages[1].output_keys[1]: expected a non-empty string, got int 3",
        ),
    ],
)
def test_stage_bad_values(tmp_path, key, value, expected):
    _bad(tmp_path, lambda d: d["stages"][1].update({key: value}), expected)


@pytest.mark.parametrize("key", ["id", "name"])
def test_duplicate_stage_id_or_name(tmp_path, key):
    _bad(
        tmp_path,
        lambda d: d["stages"][2].update({key: d["stages"][0][key]}),
        f"stages[2].{key}: duplicate {key}",
        "also stages[0]",
    )


def test_final_output_without_type(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["stages"][2].pop("final_output_type"),
        "stages[2].final_output_type: expected one of text, audio, image, tokens, latents, got null",
    )


def test_final_output_unknown_type(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["stages"][2].update(final_output_type="wav"),
        "stages[2].final_output_type",
        "got str 'wav'",
    )


def test_unknown_engine_arg_lists_close_matches(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["stages"][0]["engine_args"].update(max_num_seq=8),
        "stages[0].engine_args.max_num_seq: unknown key 'max_num_seq'",
        "did you mean 'max_num_seqs'",
    )


def test_engine_arg_model_is_not_allowed(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["stages"][0]["engine_args"].update(model="x"),
        "stages[0].engine_args.model: unknown key",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            {"max_num_seqs": 0},
            "stages[0].engine_args.max_num_seqs: must be a positive integer, got 0",
        ),
        ({"dtype": "int8"}, "stages[0].engine_args.dtype: unknown dtype 'int8'"),
        (
            {"async_scheduling": "yes"},
            "stages[0].engine_args.async_scheduling: expected true or false, got str 'yes'",
        ),
        ({"device": 0}, "stages[0].engine_args.device: expected a string, got int 0"),
    ],
)
def test_engine_arg_bad_values(tmp_path, args, expected):
    _bad(tmp_path, lambda d: d["stages"][0]["engine_args"].update(args), expected)


def test_unknown_sampling_key(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["stages"][0]["default_sampling"].update(temprature=0.5),
        "stages[0].default_sampling.temprature: unknown key 'temprature'",
        "did you mean 'temperature'",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"temperature": -1.0}, "stages[0].default_sampling.temperature: must be >= 0, got -1.0"),
        ({"top_p": 0}, "stages[0].default_sampling.top_p: must be in (0, 1], got 0"),
        (
            {"stop": 5},
            "stages[0].default_sampling.stop: must be a string or a list of strings (got int 5)",
        ),
    ],
)
def test_sampling_bad_values(tmp_path, args, expected):
    _bad(tmp_path, lambda d: d["stages"][0]["default_sampling"].update(args), expected)


# --- edges --------------------------------------------------------------------------------


def test_edge_unknown_key(tmp_path):
    _bad(tmp_path, lambda d: d["edges"][0].update(via="x"), "edges[0].via: unknown key 'via'")


@pytest.mark.parametrize(("key", "ref"), [("from", "thinkr"), ("to", 9)])
def test_edge_unknown_stage(tmp_path, key, ref):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].update({key: ref}),
        f"edges[0].{key}: unknown stage {ref!r}",
        "known stages: thinker (id 0), talker (id 1), vocoder (id 2)",
    )


def test_edge_self_loop(tmp_path):
    _bad(tmp_path, lambda d: d["edges"][0].update(to=0), "edges[0]: self-loop", "'thinker'")


def test_duplicate_edge(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"].append(dict(d["edges"][0], transfer="prompt", connector=None)),
        "edges[2]: duplicate edge thinker -> talker (also edges[0])",
    )


def test_unknown_processor(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].update(processor="hidden_to_embed"),
        "edges[0].processor: unknown processor 'hidden_to_embed'",
        "did you mean 'hidden_to_embeds'",
    )


def test_unknown_transfer(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].update(transfer="push"),
        "edges[0].transfer: expected one of prompt, payload, stream, got str 'push'",
    )


def test_connector_required_for_payload(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].pop("connector"),
        "edges[0].connector: required for transfer: payload",
    )


def test_connector_forbidden_for_prompt(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].update(transfer="prompt"),
        "edges[0].connector: must be absent for transfer: prompt, got str 'shm'",
    )


def test_unknown_connector(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][1].update(connector="remot"),
        "edges[1].connector: unknown connector 'remot'",
        "did you mean 'remote'",
    )


def test_a_processor_without_a_stream_key_cannot_stream(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].update(processor="prior_tokens", transfer="stream"),
        "edges[0].transfer: processor 'prior_tokens' cannot stream (it declares no "
        "stream_key, the key whose rows make chunks): use transfer: payload",
    )


def test_stream_option_on_payload_edge(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"][0].update(chunk_size=4),
        "edges[0].chunk_size: only valid with transfer: stream, got transfer: payload",
    )


@pytest.mark.parametrize(
    ("key", "value", "low"),
    [
        ("chunk_size", 0, 1),
        ("first_chunk_size", "2", 1),
        ("left_context", -1, 0),
        ("right_context", -2, 0),
        ("chunk_growth", 0, 1),
        ("max_chunk_size", 7, 8),  # below the edge's chunk_size
    ],
)
def test_stream_bad_ints(tmp_path, key, value, low):
    got = f"{type(value).__name__} {value!r}"
    _bad(
        tmp_path,
        lambda d: d["edges"][1].update({key: value}),
        f"edges[1].{key}: expected an integer >= {low}, got {got}",
    )


def test_right_context_only_into_a_generation_stage(tmp_path):
    data = copy.deepcopy(VALID)
    data["edges"][1]["right_context"] = 3
    stream = load_deploy(_write(tmp_path, data)).edges_into("vocoder")[0]
    assert (stream.left_context, stream.right_context) == (4, 3)
    assert load_deploy(VALID).edges_into("vocoder")[0].right_context == 0

    def into_talker(d):
        d["edges"][0].update(transfer="stream", right_context=2)

    _bad(
        tmp_path,
        into_talker,
        "edges[0].right_context: only valid into a generation stage, 'talker' is ar",
    )


# --- graph --------------------------------------------------------------------------------


def test_cycle_reported_as_path(tmp_path):
    def edit(d):
        d["edges"].append(
            {"from": "vocoder", "to": "talker", "processor": "ids_to_prompt", "transfer": "prompt"}
        )

    _bad(
        tmp_path,
        edit,
        "edges: expected an acyclic graph, got the cycle talker -> vocoder -> talker",
    )


def test_unreachable_stages_in_a_cycle(tmp_path):
    # talker <-> vocoder is cut off from the entry; acyclicity + one entry is what makes every
    # stage reachable, so this is reported as the cycle.
    def edit(d):
        d["edges"] = [
            {"from": "talker", "to": "vocoder", "processor": "ids_to_codes", "transfer": "prompt"},
            {"from": "vocoder", "to": "talker", "processor": "ids_to_prompt", "transfer": "prompt"},
        ]

    _bad(tmp_path, edit, "cycle talker -> vocoder -> talker")


def test_more_than_one_entry_stage(tmp_path):
    _bad(
        tmp_path,
        lambda d: d["edges"].pop(0),
        "edges: expected exactly one entry stage, got 2: thinker, talker",
    )


def test_no_final_output_stage(tmp_path):
    def edit(d):
        for stage in d["stages"]:
            stage["final_output"] = False
            stage.pop("final_output_type", None)

    _bad(tmp_path, edit, "stages: expected at least one stage with final_output: true, got none")


# --- connectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("connectors", "expected"),
    [
        (
            {"remote": {"kind": "tcp"}},
            "connectors.remote.kind: expected one of inproc, shm, zmq, got str 'tcp'",
        ),
        (
            {"remote": {"host": "x"}},
            "connectors.remote.kind: expected one of inproc, shm, zmq, got null",
        ),
        (
            {"remote": "zmq"},
            "connectors.remote: expected a mapping with a 'kind' key, got str 'zmq'",
        ),
        (
            {"remote": {"kind": "zmq"}, "bad name": {"kind": "shm"}},
            "connectors.bad name: expected a name",
        ),
    ],
)
def test_bad_connectors(tmp_path, connectors, expected):
    _bad(tmp_path, lambda d: d.update(connectors=connectors), expected)


def test_unused_connector_allowed_and_implicit_ones_present(tmp_path):
    data = copy.deepcopy(VALID)
    data["connectors"]["spare"] = {"kind": "inproc"}
    spec = load_deploy(_write(tmp_path, data))
    assert set(spec.connectors) == {"inproc", "shm", "remote", "spare"}


def test_diffusion_stages_take_diffusion_parameters(tmp_path):
    """A diffusion stage's default_sampling holds DiffusionParams fields, checked by value."""

    def draw(sampling):
        def edit(data):
            data["stages"][2]["kind"] = "diffusion"
            data["stages"][2]["final_output_type"] = "image"
            data["stages"][2]["default_sampling"] = sampling
            data["edges"][1].update(processor="prior_tokens", transfer="payload")
            data["edges"][1].pop("chunk_size"), data["edges"][1].pop("first_chunk_size")
            data["edges"][1].pop("left_context")

        return edit

    ok = copy.deepcopy(VALID)
    draw({"num_inference_steps": 4, "guidance_scale": 2.0})(ok)
    spec = load_deploy(_write(tmp_path, ok, "ok.yaml"))
    assert spec.stage("vocoder").default_sampling == {
        "num_inference_steps": 4,
        "guidance_scale": 2.0,
    }
    _bad(tmp_path, draw({"temperature": 1.0}), "stages[2].default_sampling", "temperature")
    _bad(tmp_path, draw({"num_inference_steps": 0}), "default_sampling.num_inference_steps")
    _bad(tmp_path, draw({"guidance_scale": -1}), "default_sampling.guidance_scale")


def test_packaged_image_deploys_load():
    demo = load_deploy(packaged_deploy_path("demo-image"))
    assert [(s.name, s.kind) for s in demo.stages] == [("thinker", "ar"), ("draw", "diffusion")]
    assert demo.edges_into("draw")[0].processor == "recaption_to_prompt"
    glm = load_deploy(packaged_deploy_path("glm-image"))
    assert glm.stage("prior").model_part == "vision_language_encoder"
    assert glm.edges_into("draw")[0].processor == "prior_tokens"


# --- where stages run (backend, ray) ---------------------------------------------------------


def test_ray_backend_options_load_with_defaults():
    data = copy.deepcopy(VALID)
    data["stages"][1].update(
        backend="ray", ray={"num_cpus": 2, "replicas": 2, "labels": {"node": "b"}}
    )
    data["stages"][2]["backend"] = "ray"
    spec = load_deploy(data)
    talker, vocoder = spec.stage("talker"), spec.stage("vocoder")
    assert spec.stage("thinker").backend == "process" and spec.stage("thinker").ray is None
    assert (talker.ray.num_cpus, talker.ray.replicas, talker.ray.labels) == (2, 2, {"node": "b"})
    assert talker.instances == ("talker#0", "talker#1")
    assert (vocoder.ray.replicas, vocoder.ray.max_restarts, vocoder.ray.num_gpus) == (1, 3, 0.0)
    assert vocoder.instances == ("vocoder",)


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        ({"backend": "slurm"}, "stages[1].backend: expected one of process, inprocess, ray"),
        (
            {"ray": {"replicas": 2}},
            "stages[1].ray: only valid with backend: ray, got backend: process",
        ),
        (
            {"backend": "inprocess", "ray": {}},
            "stages[1].ray: only valid with backend: ray, got backend: inprocess",
        ),
        (
            {"backend": "ray", "ray": {"replicas": 0}},
            "stages[1].ray.replicas: expected an integer >= 1, got 0",
        ),
        (
            {"backend": "ray", "ray": {"replicas": True}},
            "stages[1].ray.replicas: expected an integer >= 1, got True",
        ),
        (
            {"backend": "ray", "ray": {"max_restarts": -1}},
            "stages[1].ray.max_restarts: expected an integer >= 0, got -1",
        ),
        (
            {"backend": "ray", "ray": {"num_gpus": -0.5}},
            "stages[1].ray.num_gpus: expected a finite number >= 0, got -0.5",
        ),
        (
            {"backend": "ray", "ray": {"labels": {"node": 3}}},
            "stages[1].ray.labels: expected a mapping of string to string",
        ),
        ({"backend": "ray", "ray": {"gpus": 1}}, "stages[1].ray.gpus: unknown key 'gpus'"),
    ],
)
def test_bad_backend_or_ray_options_are_refused(tmp_path, stage, expected):
    _bad(tmp_path, lambda d: d["stages"][1].update(stage), expected)  # a DeployError: ValueError


def test_ray_backend_without_ray_installed_names_the_setting(monkeypatch):
    import sys

    from omnistage.pipeline.ray_stage import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ImportError, match="backend: ray needs the package 'ray'"):
        import_ray()
