"""What a rank starts from. The zygote makes a generated scenario's machine once before it
forks a run's ranks (each then finds it in load_scenario's cache instead of generating it
again); a scenario file is never cached there, since it may change between the runs one
zygote serves. A rank's program is compiled as `python PROG` compiles it, forked (once, in
the zygote, reused only for the same bytes) or in process: without the __future__ flags of
the commsim module that compiles it."""

from __future__ import annotations

from pathlib import Path

from commsim.launch.config import RunConfig, load_scenario
from commsim.launch.zygote_main import program_code, warm_program, warm_run

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, scenario: str) -> dict[str, str]:
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.json"
    RunConfig(scenario=scenario, mode="procs", command=["prog.py"]).dump(str(path))
    return {"COMMSIM_HOSTING": str(path)}


def test_a_generated_id_is_built_before_the_fork(tmp_path):
    load_scenario.cache_clear()
    warm_run(_config(tmp_path, "s3-5"), str(tmp_path))
    assert load_scenario.cache_info().currsize == 1
    hits = load_scenario.cache_info().hits
    sc = load_scenario("s3-5")                     # what a forked rank then asks for
    assert load_scenario.cache_info().hits == hits + 1
    assert sc.world_size >= 1


def test_a_scenario_file_and_a_run_without_hosting_are_left_alone(tmp_path):
    load_scenario.cache_clear()
    toml = next(p for p in sorted((ROOT / "scenarios").rglob("*.toml")))
    warm_run(_config(tmp_path, str(toml)), str(tmp_path))
    warm_run({}, str(tmp_path))
    (tmp_path / "s0-1").write_text("")            # a file named like an id, in the rank's cwd
    warm_run(_config(tmp_path, "s0-1"), str(tmp_path))
    assert load_scenario.cache_info().currsize == 0


def test_a_forked_rank_compiles_its_program_as_python_does(tmp_path):
    # zygote_main itself has `from __future__ import annotations`; the program must not.
    prog = tmp_path / "prog.py"
    prog.write_text("def f(x: int) -> None:\n    pass\n")
    ns: dict = {}
    exec(program_code(str(prog)), ns)
    assert ns["f"].__annotations__ == {"x": int, "return": None}


def test_a_program_compiled_in_the_zygote_is_reused_only_for_the_same_bytes(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("X = 1\n")
    warm_program(["prog.py", "--flag"], str(tmp_path))
    first = program_code("prog.py", str(tmp_path))
    assert program_code("prog.py", str(tmp_path)) is first
    prog.write_text("X = 2\n")                    # changed between two runs of a sweep
    ns: dict = {}
    exec(program_code("prog.py", str(tmp_path)), ns)
    assert ns["X"] == 2


def test_an_in_process_rank_compiles_its_program_as_python_does(tmp_path):
    from commsim.launch.inproc import main_module
    prog = tmp_path / "prog.py"
    prog.write_text("def f(x: int) -> None:\n    pass\n")
    mod, code = main_module([str(prog)])
    exec(code, mod.__dict__)
    assert mod.f.__annotations__ == {"x": int, "return": None}
