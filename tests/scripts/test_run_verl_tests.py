"""scripts/run_verl_tests.py: verl's tests are ported by rewriting only imports and device strings."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_verl_tests.py"


def load_script():
    spec = importlib.util.spec_from_file_location("run_verl_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_porting_points_verl_imports_at_hyflow_and_cuda_at_cpu():
    source = (
        "from verl import DataProto\n"
        "from verl.single_controller.base.decorator import Dispatch, register\n"
        "import verl.trainer.ppo.core_algos\n"
        "x = torch.zeros(2, device='cuda'); dist.init_process_group(backend=\"nccl\")\n"
    )
    ported = load_script().port_source(source)
    assert ported == (
        "from hyflow.protocol import DataProto\n"
        "from hyflow.controller.decorator import Dispatch, register\n"
        "import hyflow.algorithms\n"
        "x = torch.zeros(2, device='cpu'); dist.init_process_group(backend=\"gloo\")\n"
    )


def test_copying_ports_every_test_file_under_a_folder(tmp_path):
    verl = tmp_path / "verl"
    (verl / "tests" / "unit").mkdir(parents=True)
    (verl / "tests" / "unit" / "test_a.py").write_text("from verl.protocol import DataProto\n")
    (verl / "tests" / "unit" / "helpers.py").write_text("import verl.protocol\n")
    copied = load_script().copy_tests(verl, ["tests/unit"], tmp_path / "work")
    assert [p.name for p in copied] == ["test_a.py"]
    assert (tmp_path / "work" / "tests" / "unit" / "helpers.py").read_text() == "import hyflow.protocol\n"


def test_copying_one_file_brings_the_package_markers_above_it(tmp_path):
    verl = tmp_path / "verl"
    (verl / "tests" / "tools").mkdir(parents=True)
    (verl / "tests" / "__init__.py").write_text("")
    (verl / "tests" / "tools" / "__init__.py").write_text("import verl.protocol\n")
    (verl / "tests" / "tools" / "test_b.py").write_text("")
    load_script().copy_tests(verl, ["tests/tools/test_b.py"], tmp_path / "work")
    assert (tmp_path / "work" / "tests" / "__init__.py").read_text() == ""
    assert (tmp_path / "work" / "tests" / "tools" / "__init__.py").read_text() == "import hyflow.protocol\n"


def _resolve(dotted: str):
    import importlib

    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


def test_every_hyflow_name_of_the_table_exists():
    for _, target in load_script().MODULES:
        if not target.startswith("from "):  # whole import statements, e.g. `from hyflow.utils import ...`
            assert _resolve(target) is not None, target


def test_target_strings_of_verl_configs_point_at_hyflows_classes():
    ported = load_script().port_source('{"_target_": "verl.workers.config.FSDPActorConfig"}')
    target = ported.split('"')[3]
    from hyflow.config.verl_workers import FSDPActorConfig

    assert _resolve(target) is FSDPActorConfig
