"""nn.Module and nn.Parameter on hosted CUDA tensors: modules made on the device, moved
there and back (`.cuda()`, `.to()`, `.half()`, `.cpu()`: `param.data = ...`, torch_moves.py),
run under no_grad; autograd refused naming itself."""

from __future__ import annotations

import pytest
import torch

from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor
from commsim.sim.pointers import pointer_info
from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def _one(spec: str = "hgx-h100-8", gpu: int = 0):
    _, (r,) = ranks(spec, [(0, gpu)])
    return r


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_module_cuda_moves_each_parameter_in_place():
    """The parameter objects stay the ones the program holds (identity, attributes,
    Parameter-ness, requires_grad) and now live in the rank's simulated device memory."""
    r = _one(gpu=3)

    def program():
        m = _model()
        w = m[0].weight
        w.weight_loader = "kept"                      # as vLLM's set_weight_attrs does
        before = w.detach().clone()
        assert m.cuda() is m
        info = pointer_info(r.driver, w.data_ptr())
        return (m[0].weight is w, type(w) is HostedCudaTensor, isinstance(w, torch.nn.Parameter),
                w.device, w.requires_grad, w.weight_loader, torch.equal(w.detach().cpu(), before),
                info is not None and info.ordinal == 3,
                [n for n, _ in m.named_parameters()])
    got = solo(r, program)
    assert got[:8] == (True, True, True, torch.device("cuda", 3), True, "kept", True, True)
    assert got[8] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_moved_module_computes_what_the_cpu_computes_and_moves_back():
    def program():
        x = torch.linspace(-1, 1, 32).view(4, 8)
        want = _model()(x).detach()
        m = _model().to("cuda")
        with torch.no_grad():
            got = m(x.cuda())
        with torch.inference_mode():
            again = m(x.cuda())
        w = m[2].weight
        m.half()
        half = (w.dtype, w.device, m[2].weight is w)
        m.cpu()
        back = (type(w) is torch.nn.Parameter, w.device, w.dtype, w.requires_grad)
        return got.device, torch.allclose(got.cpu(), want), torch.equal(again.cpu(), got.cpu()), half, back
    dev, close, same, half, back = solo(_one(), program)
    assert dev == torch.device("cuda", 0) and close and same
    assert half == (torch.float16, torch.device("cuda", 0), True)
    assert back == (True, torch.device("cpu"), torch.float16, True)


def test_modules_made_on_the_device_and_state_dicts():
    def program():
        m = torch.nn.Linear(4, 3, device="cuda")
        src = torch.nn.Linear(4, 3)
        m.load_state_dict(src.state_dict())          # host -> device copies, under no_grad
        sd = m.state_dict()
        return (m.weight.device, isinstance(m.weight, torch.nn.Parameter), m.weight.requires_grad,
                torch.equal(m.weight.detach().cpu(), src.weight.detach()), sd["bias"].device,
                sd["bias"].requires_grad)
    assert solo(_one(), program) == (torch.device("cuda", 0), True, True, True,
                                     torch.device("cuda", 0), False)


def test_autograd_on_device_parameters_is_refused_naming_itself():
    def program():
        m = torch.nn.Linear(4, 2).cuda()
        x = torch.ones(1, 4, device="cuda")
        with pytest.raises(NotImplementedError) as e:
            m(x)
        frozen = m.requires_grad_(False)(x)          # nothing requires grad: runs
        return str(e.value), frozen.shape, frozen.requires_grad
    msg, shape, rg = solo(_one(), program)
    assert "autograd" in msg and "no_grad" in msg and "aten." in msg
    assert shape == (1, 2) and rg is False


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_a_program_moving_its_model_under_exec(mode):
    v, res, _ = hosted(PROGRAMS / "torch_module_move.py", "hgx-h100-8", mode=mode,
                       nproc_per_host=2)
    assert v.ok, v.format()
    assert sorted(res) == [0, 1]
    for rank, d in res.items():
        assert d == {"rank": rank, "device": f"cuda:{rank}", "same_param": True,
                     "param_device_after_cpu": "cpu", "matches_cpu": True}, d


def test_pickled_cuda_tensors_and_parameters_come_back_on_their_device(tmp_path):
    """pickle and torch.save (weights_only, torch.load's default) rebuild on the same device
    with the same values; a Parameter stays one."""
    import io
    import pickle

    def program():
        torch.cuda.set_device(1)
        x = torch.arange(6, dtype=torch.float32, device="cuda").view(2, 3)[:, 1:]
        m = torch.nn.Linear(3, 2).cuda()
        y = pickle.loads(pickle.dumps(x))
        buf = io.BytesIO()
        torch.save({"x": x, "w": m.weight}, buf)
        buf.seek(0)
        back = torch.load(buf)
        w = back["w"]
        return (type(y) is HostedCudaTensor, y.device, y.tolist(), y.data_ptr() != x.data_ptr(),
                back["x"].device, back["x"].tolist(), isinstance(w, torch.nn.Parameter),
                w.device, w.requires_grad, torch.equal(w.detach().cpu(), m.weight.detach().cpu()))
    got = solo(_one(), program)
    dev = torch.device("cuda", 1)
    assert got == (True, dev, [[1.0, 2.0], [4.0, 5.0]], True, dev, [[1.0, 2.0], [4.0, 5.0]],
                   True, dev, True, True)
