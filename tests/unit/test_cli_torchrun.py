"""torchrun's habits on `commsim exec`: its placement flags are aliases of commsim's, the rest
are refused by name with what to do instead, and `-- torchrun ...` is answered with the
commsim command that runs the same program."""

from pathlib import Path

import pytest

from commsim.cli import build_parser, main

PROG = str(Path(__file__).resolve().parents[2] / "examples" / "vllm_style_custom_allreduce.py")


def _parse(*flags: str):
    return build_parser().parse_args(["exec", "--machine", "gb200-nvl72", *flags, "--",
                                      "python", PROG])


@pytest.mark.parametrize("flags, per_host", [
    (["--nproc-per-node", "2"], 2),
    (["--nproc_per_node=3"], 3),
    (["--nproc-per-node", "gpu"], 0),        # one rank per GPU, commsim's default
    (["--nproc-per-host", "4"], 4),
])
def test_nproc_per_node_is_nproc_per_host(flags, per_host):
    assert _parse(*flags).nproc_per_host == per_host


def test_nnodes_takes_the_machines_first_hosts(capsys):
    assert main(["exec", "--machine", "gb200-nvl72", "--nnodes", "2", "--nproc_per_node=1",
                 "--standalone", "--mode", "inproc", "--quiet", "--", "python", PROG]) == 1
    err = capsys.readouterr().err
    assert "2 rank(s) on gb200-nvl72:2 (2 host(s) x 1)" in err
    assert "replay: commsim exec --machine gb200-nvl72:2 --nproc-per-host 1 " in err


@pytest.mark.parametrize("flags, words", [
    (["--node-rank", "0"], "--node-rank/--node_rank: torchrun's flag: commsim exec starts "
                           "every host's ranks in one command"),
    (["--master_port=29500"], "--master-port/--master_port: torchrun's flag: commsim exec is "
                              "the rendezvous"),
    (["--rdzv-endpoint", "h:1"], "gives each MASTER_ADDR/MASTER_PORT on loopback itself; drop it"),
    (["--max-restarts", "3"], "a hosted run is judged, never restarted"),
    (["--nproc-per-node", "cpu"], "argument --nproc-per-node/--nproc_per_node: 'cpu': commsim "
                                  "runs one rank per simulated GPU"),
    (["--nproc-per-node", "cuda"], "give a number of ranks per host or one of gpu, auto"),
    (["--nnodes", "1:4"], "(torchrun's elastic MIN:MAX does not apply); give --nnodes N"),
])
def test_other_torchrun_flags_are_refused_by_name(flags, words, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(*flags)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("machine, flags, words", [
    ("gb200-nvl72:4", ["--nnodes", "2"], "--nnodes 2 disagrees with --machine gb200-nvl72:4"),
    ("hgx-h100-8", ["--nnodes", "2"], "--nnodes 2 on --machine hgx-h100-8: cluster hgx-h100-8 "
                                      "has 1 hosts"),
])
def test_nnodes_that_the_machine_cannot_take_is_a_clear_error(machine, flags, words, capsys):
    assert main(["exec", "--machine", machine, *flags, "--", "python", PROG]) == 2
    assert words in capsys.readouterr().err


def test_refused_aliases_stay_out_of_help(capsys):
    with pytest.raises(SystemExit):
        main(["exec", "--help"])
    out = capsys.readouterr().out
    assert "--nproc-per-node" in out          # named in --nproc-per-host's help
    assert "--node-rank" not in out and "--master-port" not in out


@pytest.mark.parametrize("program, expect", [
    (["torchrun", "--nproc-per-node", "4", "--nnodes=2", "--node_rank", "0", "--master-port",
      "1234", PROG, "--tp", "8"],
     f"run `commsim exec --machine gb200-nvl72 --nproc-per-host 4 --nnodes 2 -- python {PROG} "
     f"--tp 8` (dropped --node_rank, --master-port: commsim has no use for them)"),
    (["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=gpu", "-m",
      "mypkg.worker"],
     "`python -m torch.distributed.run` is the launcher commsim stands in for: commsim starts "
     "the ranks itself and gives each torchrun's environment; run `commsim exec --machine "
     "gb200-nvl72 -- python -m mypkg.worker`"),
])
def test_exec_of_torchrun_suggests_the_commsim_command(program, expect, capsys):
    assert main(["exec", "--machine", "gb200-nvl72", "--", *program]) == 2
    err = capsys.readouterr().err
    assert expect in err and "python torchrun" not in err


def test_sweep_exec_of_torchrun_suggests_the_program_alone(capsys):
    assert main(["sweep", "--exec", f"torchrun --nproc_per_node=2 {PROG}", "--count", "1"]) == 2
    assert f"run `commsim sweep --exec {PROG}`" in capsys.readouterr().err
