from __future__ import annotations

import copy

import pytest
import yaml

from accelbench.core.params import ParamsError, load_params, parse_params
from helpers import REPO, small_params


@pytest.fixture
def raw() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_repository_params_are_valid() -> None:
    params = load_params(REPO / "params.yaml")
    assert {"cpu", "gpu", "amp"} <= set(params.variants)
    assert params.variants["cpu"].device == "cpu"
    assert params.variants["gpu"].device == "cuda"
    assert params.variants["amp"].precision in ("fp16", "bf16")


def _error(raw: dict) -> str:
    with pytest.raises(ParamsError) as info:
        parse_params(raw)
    return str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("train", "batch_size"), 0, ["train.batch_size", "0", "greater than 0"]),
        (("train", "batch_size"), -8, ["train.batch_size", "-8"]),
        (("train", "epochs"), 0, ["train.epochs", "greater than 0"]),
        (
            ("variants", "amp", "precision"),
            "fp8",
            ["variants.amp.precision", "'fp8'", "'fp32', 'fp16' or 'bf16'"],
        ),
        (("variants", "cpu", "device"), "tpu", ["variants.cpu.device", "'tpu'", "'cpu' or 'cuda'"]),
        (("variants", "cpu", "precision"), "fp16", ["variants.cpu", "fp16", "needs device 'cuda'"]),
        (
            ("variants", "gpu", "compile"),
            "fast",
            ["variants.gpu.compile", "'fast'", "reduce-overhead"],
        ),
        (
            ("variants", "gpu", "batches"),
            "stream",
            ["variants.gpu.batches", "'resident' or 'dataloader'"],
        ),
    ],
)
def test_bad_values_are_named_with_allowed_values(raw, path, value, expected) -> None:
    bad = copy.deepcopy(raw)
    target = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    message = _error(bad)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_unknown_key_in_a_variant_lists_allowed_keys(raw) -> None:
    raw["variants"]["gpu"]["precison"] = "bf16"
    message = _error(raw)
    assert "variants.gpu.precison: unknown key" in message
    assert "precision" in message and "device" in message and "batches" in message


def test_unknown_top_level_and_train_keys(raw) -> None:
    raw["train"]["learning_rate"] = 0.1
    raw["extra"] = 1
    message = _error(raw)
    assert "train.learning_rate: unknown key" in message and "lr" in message
    assert "extra: unknown key" in message


def test_every_problem_is_reported_at_once(raw) -> None:
    raw["train"]["batch_size"] = 0
    raw["variants"]["amp"]["precision"] = "fp8"
    message = _error(raw)
    assert "train.batch_size" in message and "variants.amp.precision" in message


def test_variant_without_device_and_bad_name(raw) -> None:
    raw["variants"]["x"] = {"precision": "fp32"}
    assert "variants.x.device: required key is missing" in _error(raw)
    raw["variants"] = {"bad name!": {"device": "cpu"}}
    assert "'bad name!'" in _error(raw)


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "nope.yaml")
    broken = tmp_path / "params.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(broken)
    broken.write_text("- a list\n")
    with pytest.raises(ParamsError, match="expected a mapping"):
        load_params(broken)
    for empty in ("", "# only a comment\n"):  # was "expected a mapping ..., got NoneType"
        broken.write_text(empty)
        with pytest.raises(ParamsError, match=r"holds no params \(empty, or comments only\); it"):
            load_params(broken)


def test_a_yaml_error_says_where_and_what_without_the_parsers_asides(tmp_path) -> None:
    """A duplicate key's error quoted ruamel's excerpt of the file, a caret and its advice
    ("To suppress this check see: https://yaml.dev/..."), cut off at 300 characters."""
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  seed: 1\n  epochs: 2\n  seed: 0\n")
    with pytest.raises(ParamsError) as raised:
        load_params(path)
    assert str(raised.value) == (
        f'{path}: not valid YAML: line 4, column 3: found duplicate key "seed" with value "0" '
        '(original value: "1")'
    )


@pytest.mark.parametrize(("key", "kind"), [("true", "boolean"), ("1", "number"), ("null", "null")])
def test_a_variant_key_yaml_reads_as_no_name_says_to_quote_it(raw, key, kind) -> None:
    """`true:` as a variant's name read "variants.1.[key] = True: Input should be a valid
    string": the wrong path, and no word on why."""
    raw["variants"][yaml.safe_load(key)] = {"device": "cpu"}
    assert _error(raw) == (
        f"params.yaml: variants: the key {key} is read by YAML as a {kind}, not a name; "
        f'quote it ("{key}":) or choose another name'
    )


def test_the_loader_belongs_to_the_variant_that_uses_it(raw) -> None:
    raw["train"]["loader"] = {"num_workers": 2}
    assert "train.loader: moved: set it on the variant that uses it" in _error(raw)
    del raw["train"]["loader"]
    raw["variants"]["cpu"]["loader"] = {"num_workers": 2}
    assert "only by variants with batches 'dataloader'" in _error(raw)


def test_report_baselines_name_variants_of_the_right_kind(raw) -> None:
    params = parse_params(raw)
    assert params.report.speedup_baseline == "cpu" and params.report.scaling_baselines == {
        "ddp": "gpu"
    }
    bad = copy.deepcopy(raw)
    bad["report"]["speedup_baseline"] = "tpu"
    assert "report.speedup_baseline = 'tpu': not a variant (params.yaml defines: cpu" in _error(bad)
    bad = copy.deepcopy(raw)
    bad["report"]["scaling_baselines"] = {"gpu": "cpu"}
    assert "report.scaling_baselines.gpu: 'gpu' is not a variant with a distributed:" in _error(bad)
    bad["report"]["scaling_baselines"] = {"ddp": "ddp"}
    assert "the baseline must be a single-process variant" in _error(bad)
    bad = copy.deepcopy(raw)  # the ddp variant removed, its baseline left behind
    del bad["variants"]["ddp"]
    said = _error(bad)
    assert "report.scaling_baselines.ddp: 'ddp' is not a variant (params.yaml defines: cpu" in said
    assert "remove the key, or define the variant" in said


def test_the_recipe_is_the_train_section_less_what_no_training_output_depends_on() -> None:
    from accelbench.core.params import TrainParams, TrainRecipe

    assert set(TrainParams.model_fields) - set(TrainRecipe.model_fields) == {
        "target_accuracy",
        "require_gpu",
    }


def test_params_refuse_indivisible_batches_nccl_on_cpu_and_graphs_they_cannot_capture() -> None:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["variants"] = {"ddp": {"device": "cpu", "distributed": {"nproc_per_node": 3}}}
    with pytest.raises(ParamsError, match="batch_size 512 must be divisible by the world size 3"):
        parse_params(raw)
    raw["variants"] = {"ddp": {"device": "cpu", "distributed": {"backend": "nccl"}}}
    with pytest.raises(ParamsError, match="'nccl' needs device 'cuda'"):
        parse_params(raw)
    raw["variants"] = {
        "ddp": {"device": "cuda", "cuda_graph": True, "distributed": {"backend": "gloo"}}
    }
    with pytest.raises(ParamsError, match=r"captures the gradient all-reduce.*not 'gloo'"):
        parse_params(raw)
    for mode in ("reduce-overhead", "max-autotune"):  # their own CUDA graphs inside ours
        raw["variants"] = {"gpu": {"device": "cuda", "cuda_graph": True, "compile": mode}}
        with pytest.raises(ParamsError, match=rf"already captures the step.*not '{mode}'"):
            parse_params(raw)
    raw["variants"] = {"ddp": {"device": "cpu", "distributed": {"nprocs": 2}}}
    with pytest.raises(ParamsError, match=r"distributed\.nprocs: unknown key .*nproc_per_node"):
        parse_params(raw)
    for mode in ("none", "max-autotune-no-cudagraphs"):  # no kernels, or tuned by design
        raw["variants"] = {"gpu": {"device": "cuda", "compile": mode, "kernel_autotune": False}}
        with pytest.raises(ParamsError, match=rf"option of compile 'default'.*not '{mode}'"):
            parse_params(raw)


# --- read as DVC reads it: YAML 1.2, no coercion --------------------------------------------


def _edited(tmp_path, old: str, new: str):
    text = (REPO / "params.yaml").read_text()
    assert old in text
    path = tmp_path / "params.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_a_leading_zero_is_decimal_as_in_dvc(tmp_path) -> None:
    """YAML 1.1 (PyYAML) reads 0512 as octal 330; YAML 1.2 (DVC) as 512."""
    params = load_params(_edited(tmp_path, "batch_size: 512", "batch_size: 0512"))
    assert params.train.batch_size == 512


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("epochs: 10", "epochs: yes", "train.epochs = 'yes'"),  # YAML 1.1: True, pydantic: 1
        ("epochs: 10", "epochs: true", "train.epochs = True"),
        ("epochs: 10", "epochs: '10'", "train.epochs = '10'"),
        ("deterministic: false", "deterministic: 0", "train.deterministic = 0"),
        ("deterministic: false", "deterministic: off", "train.deterministic = 'off'"),
        ("lr: 0.001", "lr: '0.001'", "train.lr = '0.001'"),
        ("retries: 2", "retries: 2.0", "data.retries = 2.0"),
    ],
)
def test_numbers_booleans_and_strings_are_not_coerced(tmp_path, old, new, key) -> None:
    with pytest.raises(ParamsError) as info:
        load_params(_edited(tmp_path, old, new))
    assert key in str(info.value)


def test_an_integer_is_a_valid_float(raw) -> None:
    raw["train"]["lr"] = 1
    assert parse_params(raw).train.lr == 1.0


@pytest.mark.parametrize(
    "name", ["-cpu", "_cpu", "cpu.fast", "cpu/fast", "cpu fast", "ĉpu", "x" * 65, "cpu@1"]
)
def test_variant_names_that_dvc_or_the_file_system_would_refuse(raw, name) -> None:
    raw["variants"] = {name: {"device": "cpu"}}
    raw["report"] = {}
    assert f"variant name {name!r}" in _error(raw)


def test_variant_names_differing_only_in_case_are_refused(raw) -> None:
    raw["variants"] = {"cpu": {"device": "cpu"}, "CPU": {"device": "cpu"}}
    raw["report"] = {}
    assert "differ only in case" in _error(raw)


@pytest.mark.parametrize(
    ("mirror", "expected"),
    [
        ("ftp://example.com/mnist/", "unsupported scheme 'ftp'"),
        ("s3://bucket/mnist/", "unsupported scheme 's3'"),
        ("https:///mnist/", "no host"),
        ("", "empty"),
    ],
)
def test_mirrors_that_download_could_not_use_are_refused(raw, mirror, expected) -> None:
    raw["data"]["mirrors"] = [raw["data"]["mirrors"][0], mirror]
    message = _error(raw)
    assert "data.mirrors" in message and expected in message


def test_mirror_forms_download_can_use_are_accepted(raw) -> None:
    raw["data"]["mirrors"] = [
        "https://h/m/",
        "http://h:8000/m",
        "file:///srv/mnist",
        "/srv/m",
        "rel",
    ]
    assert len(parse_params(raw).data.mirrors) == 5


def test_quantized_variants_are_variants_named_once(raw) -> None:
    assert parse_params(raw).quantize.variants == ["cpu"]  # one model: the same network
    bad = copy.deepcopy(raw)
    bad["quantize"]["variants"] = ["cpu", "tpu"]
    assert "quantize.variants: 'tpu' is not a variant (params.yaml defines: cpu, gpu" in _error(bad)
    bad["quantize"]["variants"] = ["amp", "amp"]
    assert "quantize.variants ['amp', 'amp']: a variant is named twice" in _error(bad)
    bad["quantize"]["variants"] = []  # quantize nothing
    assert parse_params(bad).quantize.variants == []


@pytest.mark.parametrize(
    ("overrides", "edits"),
    [
        (["train.epochs=3"], [("  epochs: 10\n", "  epochs: 3\n")]),
        (
            ["quantize.variants=[cpu,amp]", "data.dataset=cifar10"],
            [("  - cpu\n  latency", "  - cpu\n  - amp\n  latency"), ("t: mnist", "t: cifar10")],
        ),
    ],
    ids=["a value", "a list and a value"],
)
def test_dvc_exp_run_set_param_changes_only_what_it_sets(tmp_path, overrides, edits) -> None:
    """`dvc exp run -S` writes params.yaml back through DVC's YAML round trip: a flow-style
    list became a block one, every list was re-indented and a comment after a list was
    dropped, so the file a user commits after an experiment carried that churn."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    expected = (REPO / "params.yaml").read_text()
    path.write_text(expected)
    apply_overrides(str(path), overrides)
    for old, new in edits:
        assert expected.count(old) == 1, old
        expected = expected.replace(old, new)
    assert path.read_text() == expected


def test_differences_name_each_changed_key_dotted_and_nothing_else() -> None:
    from accelbench.core.params import differences

    before, after = small_params(), small_params(epochs=5, lr=0.01)
    assert differences(before, before) == []
    assert differences(before.train, after.train) == ["epochs: 2 → 5", "lr: 0.001 → 0.01"]
    assert differences(before, after) == ["train.epochs: 2 → 5", "train.lr: 0.001 → 0.01"]
    assert differences({"a": [1]}, {"a": [2], "b": 1}) == ["a: [1] → [2]", "b: None → 1"]
