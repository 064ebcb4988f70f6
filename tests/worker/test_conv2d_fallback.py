"""The Conv2d fallback: equal to torch.nn.functional.conv2d, and no native convolution runs while on."""

import itertools
import pickletools
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from worker.patches import conv2d as fallback
from worker.wire.miopen_db import arch_from_override, arch_from_target_version, kernel_db_names

FIXTURES = Path(__file__).parents[1] / "fixtures" / "doctor"


@pytest.fixture(autouse=True)
def restore_native():
    yield
    fallback.disable()


def native_conv_ops(fn) -> set[str]:
    """ATen convolution ops the dispatcher saw while fn ran (forward and backward)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("aten::") and "conv" in e.name}


# (cin, cout, groups), kernel, stride, padding, dilation, bias: groups incl. depthwise, 1x1, 'same'/'valid'
GRID = [
    c for c in itertools.product([(4, 6, 1), (6, 6, 6), (6, 4, 2)], [1, 3, (2, 3)], [1, 2], [0, 1, "same", "valid"], [1, 2], [True, False])
    if not (c[3] == "same" and c[2] != 1)
]


def grads(fn, x, w, b, gy):
    out = fn(x, w, b)
    params = [x, w] + ([b] if b is not None else [])
    return [out, *torch.autograd.grad(out, params, gy)]


@pytest.mark.parametrize("groups_cfg,kernel,stride,padding,dilation,bias", GRID)
def test_fp32_forward_and_backward_equal_native(groups_cfg, kernel, stride, padding, dilation, bias):
    cin, cout, groups = groups_cfg
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    g = torch.Generator().manual_seed(hash((groups_cfg, kernel, stride, padding, dilation, bias)) % 2**31)
    x = torch.randn(2, cin, 11, 9, generator=g, requires_grad=True)
    w = torch.randn(cout, cin // groups, kh, kw, generator=g, requires_grad=True)
    b = torch.randn(cout, generator=g, requires_grad=True) if bias else None
    args = (stride, padding, dilation, groups)
    gy = torch.randn(F.conv2d(x, w, b, *args).shape, generator=g)
    expected = grads(lambda x, w, b: F.conv2d(x, w, b, *args), x, w, b, gy)
    got = grads(lambda x, w, b: fallback.conv2d(x, w, b, *args), x, w, b, gy)
    for name, e, o in zip(["out", "grad input", "grad weight", "grad bias"], expected, got):
        assert o.shape == e.shape, name
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("kernel,stride,padding,dilation,groups", [
    (3, 2, 1, 1, 1),  # YOLO's downsampling convolution
    (3, 2, 1, 1, 4),
    (3, 3, 1, 1, 1),  # 9 phases, some without a tap at a window place
    (5, 3, 2, 2, 2),
    (3, (2, 1), (0, 2), 1, 1),  # phases along one axis only
    (1, 2, 0, 1, 1),  # a phase without any tap: its input positions get no gradient
    (2, 1, 3, 1, 1),  # stride 1, padding beyond the kernel: not the flipped convolution's case
])
@pytest.mark.parametrize("size", [(12, 10), (13, 11)], ids=["even", "odd"])
def test_input_gradient_by_phases_equals_native_and_runs_no_col2im(kernel, stride, padding, dilation, groups, size):
    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, 8, *size, generator=g, requires_grad=True)
    w = torch.randn(12, 8 // groups, kernel, kernel, generator=g, requires_grad=True)
    args = (stride, padding, dilation, groups)
    gy = torch.randn(F.conv2d(x, w, None, *args).shape, generator=g)
    expected = grads(lambda x, w, b: F.conv2d(x, w, None, *args), x, w, None, gy)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = grads(lambda x, w, b: fallback.conv2d(x, w, None, *args), x, w, None, gy)
    assert not {e.name for e in prof.events()} & {"aten::col2im", "aten::im2col_backward"}
    for name, e, o in zip(["out", "grad input", "grad weight"], expected, got):
        assert o.shape == e.shape, name
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("kernel,stride,padding", [(1, [1, 1], [0, 0]), (3, [1, 1], [1, 1]), (3, [2, 2], [1, 1])])
def test_list_arguments_and_channels_last_tensors_equal_native(kernel, stride, padding):
    # Lists are not hashable (the geometry is worked out for the call alone); channels-last tensors are not
    # contiguous (the 1x1 path copies, the flipped weight is gathered from the logical layout).
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 9, 9, generator=g).to(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(6, 4, kernel, kernel, generator=g).to(memory_format=torch.channels_last).requires_grad_()
    b = torch.randn(6, generator=g, requires_grad=True)
    gy = torch.randn(F.conv2d(x, w, b, stride, padding).shape, generator=g)
    expected = grads(lambda x, w, b: F.conv2d(x, w, b, stride, padding), x, w, b, gy)
    got = grads(lambda x, w, b: fallback.conv2d(x, w, b, stride, padding), x, w, b, gy)
    for name, e, o in zip(["out", "grad input", "grad weight", "grad bias"], expected, got):
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("kernel,stride", [(3, 1), (3, 2), (1, 1)])
@pytest.mark.parametrize("frozen", ["input", "weight"])
def test_gradients_when_the_input_or_the_weight_needs_none(kernel, stride, frozen):
    # The first layer's input (the images) needs no gradient, a frozen layer's weight none: the backward
    # computes only what is asked for, each path on its own (the stride-1 path shares its columns otherwise).
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 4, 9, 9, generator=g, requires_grad=frozen != "input")
    w = torch.randn(6, 4, kernel, kernel, generator=g, requires_grad=frozen != "weight")
    b = torch.randn(6, generator=g, requires_grad=True)
    gy = torch.randn(F.conv2d(x, w, b, stride, kernel // 2).shape, generator=g)
    params = [t for t in (x, w, b) if t.requires_grad]
    expected = torch.autograd.grad(F.conv2d(x, w, b, stride, kernel // 2), params, gy)
    got = torch.autograd.grad(fallback.conv2d(x, w, b, stride, kernel // 2), params, gy)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4)


class CudaFloat32:
    """What the precision helpers read of a tensor, as a CUDA float32 tensor has it (no GPU here)."""

    is_cuda = True
    dtype = torch.float32


@pytest.fixture
def matmul_precision():
    saved = torch._C._get_fp32_precision_getter("cuda", "matmul"), torch._C._get_cudnn_allow_tf32()
    yield
    torch._C._set_fp32_precision_setter("cuda", "matmul", saved[0])
    torch._C._set_cudnn_allow_tf32(saved[1])


@pytest.mark.parametrize("cudnn_tf32,wanted", [(True, "tf32"), (False, "ieee")])
def test_float32_matmuls_on_cuda_follow_cudnns_tf32_flag(matmul_precision, cudnn_tf32, wanted):
    torch._C._set_cudnn_allow_tf32(cudnn_tf32)
    torch._C._set_fp32_precision_setter("cuda", "matmul", "none")
    assert not fallback._matmul_precision_is_cudnns(CudaFloat32())  # so a 1x1 conv takes the Function's path
    saved = fallback._tf32_like_cudnn(CudaFloat32())
    assert saved == "none" and torch._C._get_fp32_precision_getter("cuda", "matmul") == wanted
    assert fallback._matmul_precision_is_cudnns(CudaFloat32())  # already as cuDNN's: nothing to set
    assert fallback._tf32_like_cudnn(CudaFloat32()) is None
    # Nothing is set off CUDA or outside float32.
    assert fallback._tf32_like_cudnn(torch.ones(1)) is None
    assert fallback._tf32_like_cudnn(type("Half", (CudaFloat32,), {"dtype": torch.float16})()) is None
    assert fallback._matmul_precision_is_cudnns(torch.ones(1))


def cpu_conv_supports(dtype) -> bool:
    try:
        F.conv2d(torch.ones(1, 1, 3, 3, dtype=dtype), torch.ones(1, 1, 3, 3, dtype=dtype))
        torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)
        return True
    except RuntimeError:
        return False


# float16 where this CPU build supports it for both conv2d and matmul, bfloat16 otherwise.
HALF = torch.float16 if cpu_conv_supports(torch.float16) else torch.bfloat16


@pytest.mark.parametrize("stride,padding,kernel", [(1, 1, 3), (2, 1, 3), (1, 0, 1)])
def test_half_precision_equal_native(stride, padding, kernel):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 8, 12, 12, generator=g).to(HALF).requires_grad_()
    w = (torch.randn(16, 8, kernel, kernel, generator=g) / (8 * kernel * kernel) ** 0.5).to(HALF).requires_grad_()
    b = torch.randn(16, generator=g).to(HALF).requires_grad_()
    gy = torch.randn(F.conv2d(x, w, b, stride, padding).shape, generator=g).to(HALF)
    expected = grads(lambda x, w, b: F.conv2d(x, w, b, stride, padding), x, w, b, gy)
    got = grads(lambda x, w, b: fallback.conv2d(x, w, b, stride, padding), x, w, b, gy)
    for e, o in zip(expected, got):
        assert o.dtype == HALF
        torch.testing.assert_close(o.float(), e.float(), rtol=2e-2, atol=2e-2)


def test_autocast_output_dtype_matches_native():
    conv = torch.nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(1, 4, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = conv(x)
        fallback.enable()
        patched = conv(x)
    assert patched.dtype == native.dtype == torch.bfloat16
    torch.testing.assert_close(patched.float(), native.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
def test_padding_modes_through_the_module(padding_mode):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 5, 3, padding=2, dilation=2, padding_mode=padding_mode)
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    expected = conv(x)
    (gx_expected,) = torch.autograd.grad(expected.sum(), x)
    fallback.enable()
    got = conv(x)
    (gx,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gx, gx_expected, rtol=1e-4, atol=1e-4)


def test_unbatched_input():
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(3, 7, 7)
    expected = conv(x)
    fallback.enable()
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-5)


def train_step(module, x):
    out = module(x)
    out.float().square().mean().backward()


def test_no_native_convolution_runs_forward_or_backward_while_enabled():
    existing = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.SiLU(), torch.nn.Conv2d(8, 8, 1))
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    # Control: the probe does see native convolutions, forward and backward.
    seen = native_conv_ops(lambda: train_step(existing, x))
    assert {"aten::conv2d", "aten::convolution_backward"} <= seen

    fallback.enable()
    assert fallback.is_enabled()
    created_after = torch.nn.Conv2d(8, 4, 3, padding=1, groups=4)
    model = torch.nn.Sequential(existing, created_after)
    assert native_conv_ops(lambda: train_step(model, x)) == set()

    fallback.disable()
    assert not fallback.is_enabled()
    assert "aten::conv2d" in native_conv_ops(lambda: train_step(model, x))


def test_enabled_path_never_calls_functional_conv2d(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("native conv2d called")

    conv = torch.nn.Conv2d(3, 4, 3)
    fallback.enable()
    monkeypatch.setattr(torch.nn.functional, "conv2d", refuse)
    monkeypatch.setattr(torch, "conv2d", refuse)
    train_step(conv, torch.randn(1, 3, 8, 8))
    fallback.disable()
    with pytest.raises(AssertionError, match="native conv2d called"):
        conv(torch.randn(1, 3, 8, 8))


def test_enable_and_disable_are_idempotent():
    native = torch.nn.Conv2d._conv_forward
    fallback.enable()
    fallback.enable()
    fallback.disable()
    fallback.disable()
    assert torch.nn.Conv2d._conv_forward is native


def yolo_step(model, imgsz=64, batch=2):
    g = torch.Generator().manual_seed(3)
    data = {
        "img": torch.rand(batch, 3, imgsz, imgsz, generator=g),
        "batch_idx": torch.tensor([0.0, 0.0, 1.0]),
        "cls": torch.tensor([[1.0], [5.0], [2.0]]),
        "bboxes": torch.tensor([[0.5, 0.5, 0.3, 0.4], [0.3, 0.6, 0.2, 0.2], [0.6, 0.4, 0.5, 0.3]]),
    }
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    loss, _ = model.loss(data)
    loss.sum().backward()
    opt.step()
    assert torch.isfinite(loss).all()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def pickled_modules(checkpoint: Path) -> set[str]:
    """Modules of every class or function a torch.save checkpoint's pickle refers to."""
    modules = set()
    with zipfile.ZipFile(checkpoint) as zf:
        for name in (n for n in zf.namelist() if n.endswith(".pkl")):
            for op, arg, _ in pickletools.genops(zf.read(name)):
                if op.name == "GLOBAL":  # protocol 2, as torch.save writes: "module name"
                    modules.add(arg.split(" ")[0])
    return modules


def test_yolov8n_trains_with_fallback_and_its_checkpoint_trains_without(tmp_path):
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    fallback.enable()
    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    model.args = get_cfg()
    model.train()
    assert native_conv_ops(lambda: yolo_step(model)) == set()
    path = tmp_path / "last.pt"
    torch.save({"model": model}, path)  # what Ultralytics pickles: the module itself

    modules = pickled_modules(path)
    assert "torch.nn.modules.conv" in modules
    assert not [m for m in modules if m.startswith("worker")]

    fallback.disable()
    loaded = torch.load(path, weights_only=False)["model"]
    loaded.train()
    assert "aten::conv2d" in native_conv_ops(lambda: yolo_step(loaded))


# -- should_enable -------------------------------------------------------------------------------

def test_should_enable_explicit_modes_and_bad_mode():
    assert fallback.should_enable("on", {}, hip_version=None)[0] is True
    assert fallback.should_enable("off", {}, hip_version="6.2.41133")[0] is False
    with pytest.raises(ValueError, match="conv_fallback = 'maybe'"):
        fallback.should_enable("maybe", {})


def test_should_enable_auto_is_off_without_rocm():
    enabled, reason = fallback.should_enable("auto", {}, root=FIXTURES / "rx5700xt", hip_version=None)
    assert not enabled and "not a ROCm build" in reason


def test_should_enable_auto_off_when_the_kernel_database_exists():
    enabled, reason = fallback.should_enable("auto", {}, root=FIXTURES / "rx6900xt", hip_version="6.3.42131")
    assert not enabled and reason.endswith("gfx1030_40.kdb")


def test_should_enable_auto_on_for_an_overridden_gfx1010():
    # The RX 5700 XT runs as gfx1030 with 20 WGPs: MIOpen wants gfx1030_20.kdb, only _36 is there.
    env = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    enabled, reason = fallback.should_enable("auto", env, root=FIXTURES / "rx5700xt", hip_version="6.3.42131")
    assert enabled and "gfx1030, 20 CUs" in reason and "gfx1010" in reason


def test_should_enable_auto_on_without_any_database():
    enabled, reason = fallback.should_enable("auto", {}, root=FIXTURES / "rx7900xtx", hip_version="6.2.41133")
    assert enabled and "gfx1100, 48 CUs" in reason and "no MIOpen db directory" in reason


def test_miopen_names_follow_getdbbasename():
    assert arch_from_target_version(100300) == "gfx1030"
    assert arch_from_target_version(90010) == "gfx90a"
    assert arch_from_target_version(0) is None
    assert arch_from_override("10.3.0") == "gfx1030" and arch_from_override("junk") is None
    assert kernel_db_names("gfx1030", 40) == ["gfx1030_40.kdb", "gfx1030.kdb"]
    assert kernel_db_names("gfx90a", 110) == ["gfx90a6e.kdb", "gfx90a.kdb"]


def test_a_tiny_weight_gradient_over_a_long_k_is_split_and_equals_native():
    # The first layer's shape in small: a 4 x 27 weight gradient (3 -> 4 channels, 3x3, stride 2) over 128*128 positions
    # an image. Its weight gradient is cut into chunks of K, each a GEMM of its own, summed after.
    assert fallback._k_chunks(4, 27, 128 * 128) > 1
    assert fallback._k_chunks(64, 288, 128 * 128) == 1 and fallback._k_chunks(4, 27, 1000) == 1
    g = torch.Generator().manual_seed(17)
    x = torch.randn(2, 3, 256, 256, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    gy = torch.randn(2, 4, 128, 128, generator=g)
    (expected,) = torch.autograd.grad(F.conv2d(x, w, None, 2, 1), w, gy)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        (got,) = torch.autograd.grad(fallback.conv2d(x, w, None, 2, 1), w, gy)
    batches = {e.input_shapes[0][0] for e in prof.events() if e.name == "aten::bmm"}
    assert max(batches) > 2  # the forward's GEMM has one an image, the weight gradient's one a chunk
    # Each element sums 32,768 products in fp32, and how native sums them depends on its threads: both are held to
    # the float64 sum, within 8 float32 epsilons of the sum of the products' magnitudes (a chunk lost or taken twice
    # is off by thousands of times that).
    w64 = w.detach().double().requires_grad_()
    (exact,) = torch.autograd.grad(F.conv2d(x.double(), w64, None, 2, 1), w64, gy.double())
    (magnitude,) = torch.autograd.grad(F.conv2d(x.double().abs(), w64, None, 2, 1), w64, gy.double().abs())
    bound = 8 * torch.finfo(torch.float32).eps * magnitude
    assert ((expected.double() - exact).abs() <= bound).all()
    assert ((got.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("kernel,stride,padding", [(1, 1, 0), (3, 1, 1), (3, 2, 1)])
def test_the_function_path_equals_native_for_every_weight_layout(layout, kernel, stride, padding):
    # A 1x1 convolution takes the Function on a GPU whose float32 matmul precision is not cuDNN's (not on a CPU):
    # driven here directly, with a contiguous weight (one strided view of it) and a channels-last one (reshaped).
    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, 4, 9, 9, generator=g, requires_grad=True)
    w = torch.randn(6, 4, kernel, kernel, generator=g).to(memory_format=layout).requires_grad_()
    b = torch.randn(6, generator=g, requires_grad=True)
    gy = torch.randn(F.conv2d(x, w, b, stride, padding).shape, generator=g)
    geo = fallback._geometry(stride, padding, 1, w)
    expected = grads(lambda x, w, b: F.conv2d(x, w, b, stride, padding), x, w, b, gy)
    got = grads(lambda x, w, b: fallback._Conv2dMatmul.apply(x, w, b, geo, 1), x, w, b, gy)
    for name, e, o in zip(["out", "grad input", "grad weight", "grad bias"], expected, got):
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4, msg=name)
