"""`--sglang-config` YAML: layouts resolve to the right GPUs; every mistake is one line naming its key.

0-GPU configuration checks: in the CPU tier and, as in the original, registered
as cpu_only entries of the `sglang_config` GPU suite.
"""

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slime.backends.engine.sglang_config import SglangConfigError, describe, load, parse

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[1]


def _yaml(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


MIXED = """
sglang:
  - name: actor
    offload: true
    engine_groups:
      - num_gpus: 4
        num_gpus_per_engine: 2
        overrides: {mem_fraction_static: 0.8, context_length: 4096}
      - worker_type: placeholder
        num_gpus: 2
  - name: ref
    update_weights: false
    model_path: /models/ref
    engine_groups:
      - num_gpus: 2
        offload: false
"""


def test_mixed_layout_resolves_gpus_engines_and_roles(tmp_path):
    cfg = load(_yaml(tmp_path, MIXED), rollout_num_gpus=8)
    actor, ref = cfg.models
    assert cfg.num_gpus == 8
    assert [g.gpu_offset for g in actor.groups] + [ref.groups[0].gpu_offset] == [0, 4, 6]
    assert actor.groups[0].engine_gpus() == ((0, 1), (2, 3))
    assert actor.groups[1].num_engines == 0  # the placeholder starts nothing
    assert ref.frozen and not actor.frozen
    assert ref.model_path == "/models/ref" and actor.model_path is None
    specs = cfg.engines()
    assert [(s.name, s.gpus, s.update_weights, s.offload) for s in specs] == [
        ("actor-g0-e0", (0, 1), True, True),
        ("actor-g0-e1", (2, 3), True, True),
        ("ref-g0-e0", (6,), False, False),
        ("ref-g0-e1", (7,), False, False),
    ]
    assert dict(specs[0].overrides) == {"mem_fraction_static": 0.8, "context_length": 4096}
    # No two engines share a GPU, and the placeholder's GPUs are left free.
    used = [g for s in specs for g in s.gpus]
    assert len(used) == len(set(used)) and not {4, 5} & set(used)


def test_config_is_frozen(tmp_path):
    cfg = load(_yaml(tmp_path, MIXED), rollout_num_gpus=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.models[0].groups[0].num_gpus = 3  # type: ignore[misc]


def test_cli_defaults_apply_where_the_file_is_silent(tmp_path):
    doc = {"sglang": [{"name": "a", "engine_groups": [{"num_gpus": 4}]}]}
    cfg = parse(doc, rollout_num_gpus=4, num_gpus_per_engine=2, offload=True)
    (g,) = cfg.models[0].groups
    assert (g.num_gpus_per_engine, g.num_engines, g.offload, g.worker_type) == (2, 2, True, "regular")


def test_describe_names_every_group(tmp_path):
    text = describe(load(_yaml(tmp_path, MIXED), rollout_num_gpus=8))
    assert "actor (updatable, --hf-checkpoint)" in text
    assert "group 1: placeholder, GPUs 4-5" in text
    assert "ref (frozen, /models/ref)" in text


BASE = {"name": "actor", "engine_groups": [{"num_gpus": 4, "num_gpus_per_engine": 2}]}


def _doc(**changes):
    model = {**BASE, **changes}
    return {"sglang": [model]}


def _group(**g):
    return _doc(engine_groups=[g])


CASES = [
    # (document, rollout GPUs, expected error line)
    ({"sglang": [{**BASE, "num_gpu_per_engine": 2}]}, 4,
     "sglang[0].num_gpu_per_engine: unknown key; did you mean 'num_gpus_per_engine'?"),
    (_group(num_gpus=4, colour="red"), 4,
     "sglang[0].engine_groups[0].colour: unknown key; an engine group takes worker_type, num_gpus, "
     "num_gpus_per_engine, offload, overrides"),
    (_group(num_gpus="four"), 4,
     "sglang[0].engine_groups[0].num_gpus: expected a positive integer, got 'four' (str)"),
    (_group(num_gpus=True), 4,
     "sglang[0].engine_groups[0].num_gpus: expected a positive integer, got True (bool)"),
    (_group(num_gpus=0), 4,
     "sglang[0].engine_groups[0].num_gpus: expected a positive integer, got 0 (int)"),
    (_group(), 4, "sglang[0].engine_groups[0].num_gpus: missing; give a positive integer"),
    (_group(num_gpus=3, num_gpus_per_engine=2), 3,
     "sglang[0].engine_groups[0].num_gpus: 3 GPUs do not split into engines of 2; make num_gpus a "
     "multiple of num_gpus_per_engine (2)"),
    (_group(num_gpus=16, num_gpus_per_engine=16), 16,
     "sglang[0].engine_groups[0].num_gpus_per_engine: an engine of 16 GPUs does not fit a node of 8; "
     "use at most 8"),
    (_doc(), 8,
     "sglang: the groups take 4 GPUs but the rollout has 8 (--rollout-num-gpus); make the num_gpus of "
     "all groups, placeholders included, add up to 8"),
    ({"sglang": [BASE, {**BASE, "update_weights": False}]}, 8,
     "sglang[1].name: 'actor' is already the name of sglang[0]; names must be unique"),
    (_doc(engine_groups=[{"num_gpus": 2}, {"worker_type": "placeholder", "num_gpus": 2,
                                           "num_gpus_per_engine": 1}]), 4,
     "sglang[0].engine_groups[1].num_gpus_per_engine: a placeholder reserves GPUs and starts no engine; "
     "remove this key or make the group worker_type: regular"),
    (_doc(engine_groups=[{"num_gpus": 2}, {"worker_type": "placeholder", "num_gpus": 2,
                                           "model_path": "/m"}]), 4,
     "sglang[0].engine_groups[1].model_path: a placeholder reserves GPUs and starts no engine; "
     "remove this key or make the group worker_type: regular"),
    (_doc(engine_groups=[{"worker_type": "placeholder", "num_gpus": 4}]), 4,
     "sglang[0].engine_groups: model 'actor' has only placeholder groups and serves nothing; add a "
     "regular group or move the placeholders to another model"),
    (_group(num_gpus=4, worker_type="worker"), 4,
     "sglang[0].engine_groups[0].worker_type: 'worker' is not a worker type; use one of regular, "
     "prefill, decode, placeholder"),
    (_doc(engine_groups=[{"worker_type": "prefill", "num_gpus": 4}]), 4,
     "sglang[0].engine_groups: prefill and decode groups come in pairs; add the missing one or use "
     "worker_type: regular"),
    (_doc(update_weights="no"), 4, "sglang[0].update_weights: expected true or false, got 'no' (str)"),
    (_doc(update_weights=False), 4,
     "sglang: every model has update_weights: false, so the trainer's weights reach no engine; set "
     "update_weights: true on the actor"),
    (_group(num_gpus=4, overrides=[1, 2]), 4,
     "sglang[0].engine_groups[0].overrides: expected engine server arguments (a mapping of keys), got list"),
    (_group(num_gpus=4, overrides={"x": [1]}), 4,
     "sglang[0].engine_groups[0].overrides.x: expected a number, string or boolean, got list"),
    (_doc(name=""), 4, "sglang[0].name: expected a non-empty name, got ''"),
    (_doc(model_path=3), 4, "sglang[0].model_path: expected a path, got int"),
    (_doc(engine_groups=[]), 4, "sglang[0].engine_groups: expected a non-empty list of groups, got list"),
    (_doc(engine_groups=["x"]), 4,
     "sglang[0].engine_groups[0]: expected an engine group (a mapping of keys), got str"),
    ({"sglang": {}}, 4, "sglang: expected a non-empty list of models, got dict"),
    ({"sglan": []}, 4, "<top>.sglan: unknown key; did you mean 'sglang'?"),
    ([1], 4, "<top>: expected a document with a top-level 'sglang' key (a mapping of keys), got list"),
]


@pytest.mark.parametrize(("doc", "gpus", "message"), CASES, ids=[c[2].split(":")[0] + f"#{i}"
                                                                    for i, c in enumerate(CASES)])
def test_each_mistake_is_one_line_naming_its_key(doc, gpus, message):
    with pytest.raises(SglangConfigError) as info:
        parse(doc, rollout_num_gpus=gpus)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_file_errors_name_the_file_and_line(tmp_path):
    bad = _yaml(tmp_path, "sglang:\n  - name: a\n    engine_groups: [\n", name="bad.yaml")
    with pytest.raises(SglangConfigError, match=r"bad\.yaml: YAML syntax error at line 4, column 1: "):
        load(bad, rollout_num_gpus=1)
    with pytest.raises(SglangConfigError, match=r"nope\.yaml: cannot read the file \(No such file"):
        load(tmp_path / "nope.yaml", rollout_num_gpus=1)
    wrong = _yaml(tmp_path, "sglang:\n  - name: a\n    engine_groups: [{num_gpus: 2}]\n", name="w.yaml")
    with pytest.raises(SglangConfigError, match=r"^.*w\.yaml: sglang: the groups take 2 GPUs but the rollout has 4"):
        load(wrong, rollout_num_gpus=4)


def test_cli_checks_a_file_as_a_real_process(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "slime.backends.engine.sglang_config", *args],
                              capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
                              timeout=60)

    ok = cli(str(_yaml(tmp_path, MIXED)), "--rollout-num-gpus", "8")
    assert ok.returncode == 0, ok.stderr
    assert "group 0: regular, 2 × 2 GPU engines, GPUs 0-3, offload on" in ok.stdout
    bad = cli(str(_yaml(tmp_path, MIXED)), "--rollout-num-gpus", "6")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "the groups take 8 GPUs but the rollout has 6" in bad.stderr
    assert bad.stdout == ""


def test_the_yaml_check_starts_without_torch_and_the_package_names_still_resolve():
    # The CLI is a quick pre-flight check: importing the engine package must not pull in
    # torch through the server (it did: ~1.3 s a call).
    code = ("import sys, slime.backends.engine.sglang_config; print('torch' in sys.modules); "
            "import slime.backends.engine as e; print(sorted(e.__all__) == sorted(e._WHERE)); "
            "print(all(getattr(e, n).__name__ == n for n in e.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
