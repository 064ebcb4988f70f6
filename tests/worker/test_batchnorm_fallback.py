"""The batch-norm fallback: torch's own BatchNorm, module for module, and never cuDNN's or MIOpen's.

On a CPU the fallback and the native path run the same ATen kernel, so outputs, gradients and running statistics
must be equal exactly (the tolerance here is zero): what these tests check is that the patch passes every argument
through as torch.nn.functional.batch_norm does and only turns ``cudnn_enabled`` off, which is what keeps ATen's
dispatcher away from cudnn_batch_norm and miopen_batch_norm. On a GPU (the test at the end, skipped without one)
native means cuDNN, and the tolerances are stated there.
"""

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from worker.patches import batchnorm as fallback
from worker.patches import conv2d

FIXTURES = Path(__file__).parents[1] / "fixtures" / "doctor"


@pytest.fixture(autouse=True)
def restore_native():
    yield
    fallback.disable()
    conv2d.disable()


def batch_norm_calls(fn) -> list[bool]:
    """The ``cudnn_enabled`` argument of every aten::batch_norm the dispatcher saw while fn ran: False means ATen's
    _batch_norm_impl_index cannot pick cudnn_batch_norm or miopen_batch_norm."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [e.concrete_inputs[-1] for e in prof.events() if e.name == "aten::batch_norm"]


def run(module: torch.nn.Module, steps: int, dtype=None, seed: int = 0, shape=(4, 5, 6)) -> dict[str, list[torch.Tensor]]:
    """``steps`` training steps (forward, backward) then one in eval mode; every output, gradient and buffer."""
    g = torch.Generator().manual_seed(seed)
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(name, t):
        seen.setdefault(name, []).append(None if t is None else t.detach().clone())

    for step in range(steps + 1):
        module.train(step < steps)
        n, h, w = shape
        x = (torch.randn(n, module.num_features, h, w, generator=g) * 3 + 2).requires_grad_()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            y = module(x)
        gy = torch.randn(y.shape, generator=g).to(y.dtype)
        y.backward(gy)
        keep("out", y)
        keep("grad input", x.grad)
        for name, p in module.named_parameters():
            keep(f"grad {name}", p.grad)
            p.grad = None
        for name, b in module.named_buffers():
            keep(name, b)
    return seen


def twin_batchnorms(channels: int, kwargs: dict) -> tuple[torch.nn.BatchNorm2d, torch.nn.BatchNorm2d]:
    """Two equal BatchNorm2d (affine parameters away from 1 and 0): one to run natively, one under the fallback."""
    torch.manual_seed(0)
    native = torch.nn.BatchNorm2d(channels, **kwargs)
    if native.affine:
        with torch.no_grad():
            native.weight.uniform_(0.5, 1.5)
            native.bias.uniform_(-0.5, 0.5)
    patched = type(native)(channels, **kwargs)
    patched.load_state_dict(native.state_dict())
    return native, patched


def assert_within_rounding(got: torch.Tensor, expected: torch.Tensor, share: float, what: str) -> None:
    """``got`` differs from ``expected`` by at most ``share`` of the tensor's largest magnitude. Element by element is
    the wrong scale here: a weight's gradient sums N*H*W = 2**15 values, and summed in another order (the rows route,
    or ATen's NCHW kernel with another thread count) it moves by about sqrt(2**15) roundings of its largest terms, which
    is far more than one rounding of a small element; a half-precision gradient moves by its rounding at that scale."""
    diff = float((got.double() - expected.double()).abs().max())
    scale = float(expected.double().abs().max())
    assert diff <= share * scale, f"{what}: {diff:.3g} apart at scale {scale:.3g} (allowed {share:g} of it)"


CONFIGS = [
    {},
    {"momentum": None},  # cumulative moving average, from num_batches_tracked
    {"momentum": 0.3, "eps": 1e-3},
    {"affine": False},
    {"track_running_stats": False},
    {"affine": False, "track_running_stats": False},
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_equal_to_torch_batchnorm2d_train_and_eval(kwargs):
    native, patched = twin_batchnorms(3, kwargs)
    expected = run(native, steps=3)
    fallback.enable()
    got = run(patched, steps=3)
    assert expected.keys() == got.keys()
    for name in expected:
        for step, (e, o) in enumerate(zip(expected[name], got[name])):
            torch.testing.assert_close(o, e, rtol=0, atol=0, msg=f"{name} at step {step}")
    if native.track_running_stats:
        assert int(patched.num_batches_tracked) == 3
        # The statistics did move: the comparison above is not of untouched buffers.
        assert not torch.equal(patched.running_mean, torch.zeros(3))


def batch_norm_input_dims(fn) -> list[int]:
    """The number of dimensions of every aten::batch_norm input the dispatcher saw while fn ran."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [len(e.input_shapes[0]) for e in prof.events() if e.name == "aten::batch_norm"]


# Few channels over large planes: ATen's channels-last kernels on rows of channels (2**15 values per channel here).
ROWS_SHAPE = (8, 64, 64)


def test_the_rows_route_is_for_few_channels_over_large_planes():
    # YOLOv8n's widest batch norms at batch 16, 640 px take it; from 64 channels, or on small planes, NCHW stays.
    assert fallback.is_rows_route((16, 16, 320, 320)) and fallback.is_rows_route((16, 32, 160, 160))
    assert not fallback.is_rows_route((16, 64, 80, 80)) and not fallback.is_rows_route((16, 256, 20, 20))
    assert not fallback.is_rows_route((4, 3, 5, 6)) and not fallback.is_rows_route((16, 32, 40))
    bn = torch.nn.BatchNorm2d(4)
    fallback.enable()
    x = torch.randn(8, 4, 64, 64, requires_grad=True)
    assert batch_norm_input_dims(lambda: bn(x).sum().backward()) == [2]
    assert batch_norm_input_dims(lambda: bn(x[:, :, :8]).sum().backward()) == [4]  # too few values per channel
    assert batch_norm_input_dims(lambda: torch.nn.BatchNorm2d(40)(torch.randn(8, 40, 64, 64)).sum()) == [4]
    bn.eval()  # running statistics: one elementwise pass, nothing to gain
    assert batch_norm_input_dims(lambda: bn(x).sum().backward()) == [4]
    cl = x.detach().contiguous(memory_format=torch.channels_last)  # ATen picks its channels-last kernels itself
    bn.train()
    assert batch_norm_input_dims(lambda: bn(cl)) == [4]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_rows_route_equal_to_torch_batchnorm2d_train_and_eval(kwargs):
    """The same arithmetic by ATen's other kernels: equal to float32 rounding (the sums run in another order)."""
    native, patched = twin_batchnorms(4, kwargs)
    expected = run(native, steps=3, shape=ROWS_SHAPE)
    fallback.enable()
    got = run(patched, steps=3, shape=ROWS_SHAPE)
    assert expected.keys() == got.keys()
    for name in expected:
        for step, (e, o) in enumerate(zip(expected[name], got[name])):
            assert_within_rounding(o, e, 1e-4, f"{name} at step {step}")
            if name == "out" or name == "grad input":
                assert o.is_contiguous()  # NCHW out, as natively
    if native.track_running_stats:
        assert int(patched.num_batches_tracked) == 3
        assert not torch.equal(patched.running_mean, torch.zeros(4))


def cpu_batch_norm_supports(dtype) -> bool:
    try:
        torch.nn.functional.batch_norm(torch.ones(2, 1, 2, 2, dtype=dtype), None, None, training=True)
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("dtype", [d for d in (torch.bfloat16, torch.float16) if cpu_batch_norm_supports(d)])
@pytest.mark.parametrize("shape", [(4, 5, 6), ROWS_SHAPE], ids=["nchw", "rows"])
def test_equal_under_cpu_autocast(dtype, shape):
    torch.manual_seed(0)
    conv_bn = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, padding=1), torch.nn.BatchNorm2d(3))
    conv_bn.num_features = 3  # run() draws inputs of this many channels
    copy = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, padding=1), torch.nn.BatchNorm2d(3))
    copy.num_features = 3
    copy.load_state_dict(conv_bn.state_dict())
    expected = run(conv_bn, steps=2, dtype=dtype, shape=shape)
    fallback.enable()
    got = run(copy, steps=2, dtype=dtype, shape=shape)
    assert got["out"][0].dtype == expected["out"][0].dtype == dtype  # the convolution's output dtype, as natively
    assert got["1.running_mean"][0].dtype == torch.float32
    # NCHW: the same kernel, exactly; rows: float statistics summed in another order, one half-precision rounding of
    # the output or its gradient apart at most.
    for name in expected:
        for step, (e, o) in enumerate(zip(expected[name], got[name])):
            if shape == (4, 5, 6):
                torch.testing.assert_close(o, e, rtol=0, atol=0, msg=name)
            elif name == "grad 0.bias":  # the sum of the conv output's half-precision gradient, whose roundings
                # are at the scale of its terms, not of the sum (which cancels): judged at the weight's gradient's
                scale = float(expected["grad 0.weight"][step].abs().max())
                assert float((o - e).abs().max()) <= 2e-2 * scale, name
            else:
                assert_within_rounding(o, e, 2e-2, name)


def test_no_cudnn_or_miopen_batch_norm_can_be_chosen_while_enabled():
    bn = torch.nn.BatchNorm2d(4)
    sync = torch.nn.SyncBatchNorm(4).eval()  # one process, eval: its F.batch_norm path
    x = torch.randn(2, 4, 3, 3, requires_grad=True)

    def steps():
        bn.train()
        bn(x).sum().backward()
        bn.eval()
        bn(x).sum().backward()
        sync(x).sum().backward()

    # Control: natively torch.backends.cudnn.enabled (True) is passed, and on a GPU cuDNN/MIOpen would be chosen.
    assert batch_norm_calls(steps) == [True, True, True]
    fallback.enable()
    assert fallback.is_enabled()
    assert batch_norm_calls(steps) == [False, False, False]
    fallback.disable()
    assert not fallback.is_enabled() and batch_norm_calls(steps) == [True, True, True]


def test_the_global_cudnn_flag_is_off_for_the_call_alone(monkeypatch):
    """Newer ATen picks the backend from torch.backends.cudnn.enabled, not from the argument (torch 2.11 on an H100
    chose cuDNN with the argument off): the flag is off inside the call, and as it was after it, errors included."""
    seen = []
    real = torch.batch_norm

    def spy(*args):
        seen.append((torch.backends.cudnn.enabled, args[-1]))
        return real(*args)

    monkeypatch.setattr(torch, "batch_norm", spy)
    fallback.enable()
    bn = torch.nn.BatchNorm2d(4)
    bn(torch.randn(2, 4, 3, 3))
    assert seen == [(False, False)] and torch.backends.cudnn.enabled
    with pytest.raises(ValueError):
        bn(torch.randn(1, 4, 1, 1))  # one value per channel: torch's own error, raised before the call
    bn.eval()
    with pytest.raises(RuntimeError):
        bn(torch.randn(2, 5, 3, 3))  # a shape ATen refuses inside the call: the flag is restored all the same
    assert torch.backends.cudnn.enabled
    with torch.backends.cudnn.flags(enabled=False):
        bn(torch.randn(2, 4, 3, 3))
        assert not torch.backends.cudnn.enabled
    assert seen[-1] == (False, False) and torch.backends.cudnn.enabled


def test_enable_and_disable_are_idempotent_and_errors_are_torchs():
    native = torch.nn.functional.batch_norm
    fallback.enable()
    fallback.enable()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        torch.nn.BatchNorm2d(3)(torch.randn(1, 3, 1, 1))
    fallback.disable()
    fallback.disable()
    assert torch.nn.functional.batch_norm is native


def yolo_losses(steps: int, imgsz: int = 64) -> list[float]:
    """``steps`` SGD steps of YOLOv8n (Ultralytics' loss, Nesterov momentum) from the same seed, on one batch."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    model.args = get_cfg()
    model.train()
    g = torch.Generator().manual_seed(3)
    batch = {
        "img": torch.rand(2, 3, imgsz, imgsz, generator=g),
        "batch_idx": torch.tensor([0.0, 0.0, 1.0]),
        "cls": torch.tensor([[1.0], [5.0], [2.0]]),
        "bboxes": torch.tensor([[0.5, 0.5, 0.3, 0.4], [0.3, 0.6, 0.2, 0.2], [0.6, 0.4, 0.5, 0.3]]),
    }
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    losses = []
    for _ in range(steps):
        loss, _ = model.loss(batch)
        loss.sum().backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.sum().item())
    model.eval()
    with torch.no_grad():
        model(batch["img"])  # eval mode runs on the running statistics the steps left
    return losses


def test_yolov8n_trains_to_the_same_loss_with_both_fallbacks():
    native = yolo_losses(3)
    conv2d.enable()
    fallback.enable()
    both = yolo_losses(3)
    print(f"losses native {native}, both fallbacks {both}")
    assert len(set(native)) == 3  # each step moved the weights: later losses compare trained models
    # The conv fallback's matrix products round differently from the native convolution (1e-4 relative per layer).
    assert both == pytest.approx(native, rel=1e-3)


# -- should_enable -------------------------------------------------------------------------------

def test_should_enable_explicit_modes_and_bad_mode():
    assert fallback.should_enable("on", {}, conv_fallback=False, hip_version=None)[0] is True
    assert fallback.should_enable("off", {}, conv_fallback=True, hip_version="6.2.41133")[0] is False
    with pytest.raises(ValueError, match="batchnorm_fallback = 'maybe'"):
        fallback.should_enable("maybe", {}, conv_fallback=False)


def test_should_enable_auto_is_off_without_rocm():
    enabled, reason = fallback.should_enable("auto", {}, conv_fallback=True, root=FIXTURES / "rx5700xt", hip_version=None)
    assert not enabled and "not a ROCm build" in reason


def test_should_enable_auto_on_for_rdna1_even_as_gfx1030_with_a_database():
    # The RX 5700 XT (gfx1010): MIOpen's batch-norm backward fails on it whatever name the runtime reports.
    enabled, reason = fallback.should_enable("auto", {}, conv_fallback=False, root=FIXTURES / "rx5700xt",
                                             hip_version="6.3.42131")
    assert enabled and "gfx1010" in reason and "RDNA1" in reason
    env = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    enabled, reason = fallback.should_enable("auto", env, conv_fallback=False, root=FIXTURES / "rx5700xt",
                                             hip_version="6.3.42131")
    assert enabled and "the card is gfx1010" in reason


def test_should_enable_auto_follows_the_conv_fallback_and_the_database():
    root, hip = FIXTURES / "rx6900xt", "6.3.42131"  # gfx1030 with its gfx1030_40.kdb
    enabled, reason = fallback.should_enable("auto", {}, conv_fallback=False, root=root, hip_version=hip)
    assert not enabled and reason.endswith("gfx1030_40.kdb")
    enabled, reason = fallback.should_enable("auto", {}, conv_fallback=True, root=root, hip_version=hip)
    assert enabled and "Conv2d fallback is on" in reason
    enabled, reason = fallback.should_enable("auto", {}, conv_fallback=False, root=FIXTURES / "rx7900xtx",
                                             hip_version="6.2.41133")
    assert enabled and "no MIOpen kernel database for gfx1100" in reason


# -- on a GPU: against cuDNN (or MIOpen) ----------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: native there is cuDNN's or MIOpen's")
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "fp16-autocast"])
def test_on_the_gpu_equal_to_cudnn_within_tolerance(amp):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
    native_bn, patched_bn = torch.nn.BatchNorm2d(32).cuda(), torch.nn.BatchNorm2d(32).cuda()
    x = (torch.randn(8, 16, 40, 40, device="cuda") * 2 + 1)
    weights = torch.randn(8, 32, 40, 40, device="cuda")

    def step(bn):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            y = bn(conv(xi))
        # A fixed random projection: gradients of order 1 (no fp16 underflow) and no cancellation (the gradient of
        # y.square().sum() through a batch norm is nearly zero, its relative error all rounding).
        (y.float() * weights).sum().backward()
        grads = [xi.grad, bn.weight.grad, bn.bias.grad]
        xi.grad = bn.weight.grad = bn.bias.grad = conv.weight.grad = None
        return [y.float(), *grads, bn.running_mean.clone(), bn.running_var.clone()]

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        expected = step(native_bn)
    assert {"aten::cudnn_batch_norm", "aten::miopen_batch_norm"} & {e.name for e in prof.events()}
    fallback.enable()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = step(patched_bn)
    names = {e.name for e in prof.events()}
    assert "aten::native_batch_norm" in names and not {"aten::cudnn_batch_norm", "aten::miopen_batch_norm"} & names
    # Relative to the norm: float32 rounding apart (cuDNN sums in another order), or fp16 rounding of the output and
    # of the gradient it sends into the convolution (2^-11 each).
    tol = 5e-3 if amp else 1e-5
    for name, e, o in zip(["out", "grad input", "grad weight", "grad bias", "running_mean", "running_var"], expected, got):
        assert ((o - e).norm() / e.norm()).item() < tol, name
