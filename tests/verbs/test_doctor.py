"""`yolo-train doctor` checks, on fixture trees built from real AMD machines' layouts (tests/fixtures/doctor)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.verbs import doctor
from supervisor.verbs.doctor import Status, TorchProbe

FIXTURES = Path(__file__).parents[1] / "fixtures" / "doctor"
REPO = Path(__file__).parents[2]

ROCM_62 = TorchProbe(version="2.5.1+rocm6.2", hip="6.2.41133-dd7f95766", gpu_available=True, gpu_names=["AMD Radeon RX 7900 XTX"], gpu_archs=["gfx1100"])
ROCM_63 = TorchProbe(version="2.5.1+rocm6.3", hip="6.3.42131-fa1d09cbd", gpu_available=True, gpu_names=["AMD Radeon RX 6900 XT"], gpu_archs=["gfx1030"])
CUDA = TorchProbe(version="2.5.1+cu124", cuda="12.4", gpu_available=True, gpu_names=["NVIDIA H100"])
CPU = TorchProbe(version="2.5.1+cpu")


def tree(tmp_path, name, devices=("dev/kfd", "dev/dri/renderD128")):
    """A copy of a fixture tree; device nodes cannot live in git, so regular files stand in for them."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    for dev in devices:
        (root / dev).parent.mkdir(parents=True, exist_ok=True)
        (root / dev).write_text("")
    return root


# -- torch ----------------------------------------------------------------------------------------

def test_probe_torch_reads_the_real_venv_torch():
    import torch

    probe = doctor.probe_torch(sys.executable)
    assert probe.error is None
    assert probe.version == torch.__version__ and probe.hip == torch.version.hip
    assert doctor.check_torch_build(probe).status in (Status.PASS, Status.WARN)


def test_a_broken_torch_is_reported_not_crashed_on(tmp_path):
    (tmp_path / "torch.py").write_text("raise ImportError('libamdhip64.so: cannot open shared object file')\n")
    probe = doctor.probe_torch(sys.executable, {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    check = doctor.check_torch_build(probe)
    assert check.status is Status.FAIL and "libamdhip64.so" in check.detail and "make install" in check.fix
    assert doctor.probe_torch(str(tmp_path / "no-python")).error


def test_torch_build_kinds():
    assert doctor.check_torch_build(ROCM_63).status is Status.PASS and "ROCm build" in doctor.check_torch_build(ROCM_63).detail
    assert doctor.check_torch_build(CUDA).status is Status.PASS
    cpu = doctor.check_torch_build(CPU)
    assert cpu.status is Status.WARN and "rocm" in cpu.fix


def test_gpus_visible(tmp_path):
    root = FIXTURES / "rx6900xt"
    assert doctor.check_gpus_visible(ROCM_63, root).status is Status.PASS
    blind = TorchProbe(version="2.5.1+rocm6.3", hip="6.3.1", gpu_available=False)
    check = doctor.check_gpus_visible(blind, root)
    assert check.status is Status.FAIL and "1 AMD GPU" in check.detail


# -- architecture, versions, MIOpen -----------------------------------------------------------------

def test_supported_card_needs_no_override():
    assert doctor.check_architecture(FIXTURES / "rx6900xt", {}).status is Status.PASS


def test_gfx1010_without_override_fails_with_the_value_to_set():
    check = doctor.check_architecture(FIXTURES / "rx5700xt", {})
    assert check.status is Status.FAIL and 'HSA_OVERRIDE_GFX_VERSION = "10.3.0"' in check.fix


def test_gfx1010_overridden_to_gfx1030_is_a_warning():
    check = doctor.check_architecture(FIXTURES / "rx5700xt", {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert check.status is Status.WARN and "gfx1010 runs as gfx1030" in check.detail


def test_override_into_another_family_fails():
    check = doctor.check_architecture(FIXTURES / "rx7900xtx", {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert check.status is Status.FAIL and "the card is gfx1100" in check.detail
    junk = doctor.check_architecture(FIXTURES / "rx7900xtx", {"HSA_OVERRIDE_GFX_VERSION": "gfx1100"})
    assert junk.status is Status.FAIL and "major.minor.stepping" in junk.detail


def test_rocminfo_is_read_when_there_is_no_kfd_topology(tmp_path):
    # rocminfo's agent block, as it prints it.
    text = "*******\nAgent 2\n*******\n  Name:                    gfx1030\n  Uuid:                    GPU-XX\n  Marketing Name:          AMD Radeon RX 6800 XT\n"
    assert doctor.parse_rocminfo(text) == "gfx1030"
    assert doctor.check_architecture(tmp_path, {}, text).status is Status.PASS


def test_known_incompatible_torch_and_rocm_pair():
    bad = doctor.check_torch_rocm_pair(ROCM_62, "gfx1100")
    assert bad.status is Status.FAIL and "HIPBLAS_STATUS_ALLOC_FAILED" in bad.detail and "rocm6.3" in bad.fix
    assert doctor.check_torch_rocm_pair(ROCM_63, "gfx1100").status is Status.PASS
    assert doctor.check_torch_rocm_pair(ROCM_62, "gfx1030").status is Status.PASS
    assert doctor.check_torch_rocm_pair(CUDA, None).status is Status.PASS


def test_miopen_database_found_or_missing():
    found = doctor.check_miopen_db(FIXTURES / "rx6900xt", {}, ROCM_63)
    assert found.status is Status.PASS and found.detail.endswith("gfx1030, 40 CUs")
    missing = doctor.check_miopen_db(FIXTURES / "rx5700xt", {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}, ROCM_63)
    assert missing.status is Status.WARN and "gfx1030_20.kdb" in missing.detail and "conv_fallback" in missing.fix
    assert doctor.check_miopen_db(FIXTURES / "rx5700xt", {}, CUDA).status is Status.PASS


# -- devices, logs, services, disk, dataset --------------------------------------------------------

def test_device_access(tmp_path):
    root = tree(tmp_path, "rx6900xt")
    assert doctor.check_device_access(root, "alice", {"video", "render"}, ROCM_63).status is Status.PASS
    no_groups = doctor.check_device_access(root, "alice", {"users"}, ROCM_63)
    assert no_groups.status is Status.WARN and "usermod -aG video,render alice" in no_groups.fix
    denied = doctor.check_device_access(root, "alice", {"users"}, ROCM_63, can_open=lambda p: p.name != "kfd")
    assert denied.status is Status.FAIL and "dev/kfd" in denied.detail and "render, video" in denied.detail


def test_missing_driver_devices_fail(tmp_path):
    no_kfd = tree(tmp_path, "rx6900xt", devices=())
    assert doctor.check_device_access(no_kfd, "alice", {"video", "render"}, ROCM_63).status is Status.FAIL
    no_render = tree(tmp_path, "rx7900xtx", devices=("dev/kfd",))
    assert doctor.check_device_access(no_render, "alice", {"video", "render"}, ROCM_62).status is Status.FAIL
    assert doctor.check_device_access(tmp_path / "empty", "alice", set(), CUDA).status is Status.PASS


def test_kernel_log_real_and_missing(tmp_path):
    real = doctor.check_kernel_log(Path("/"), None)
    if real.status is Status.PASS:  # readable here (root); the fallback paths below run everywhere
        assert "/dev/kmsg readable" in real.detail
    journal = doctor.check_kernel_log(tmp_path, "/usr/bin/journalctl")
    assert journal.status is Status.WARN and "journalctl -k" in journal.detail
    blind = doctor.check_kernel_log(tmp_path, None)
    assert blind.status is Status.WARN and "heartbeats alone" in blind.detail


def test_systemd(tmp_path):
    assert doctor.check_systemd(tmp_path).status is Status.WARN
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    assert doctor.check_systemd(tmp_path).status is Status.PASS


def test_free_disk(tmp_path):
    assert doctor.check_free_disk(tmp_path / "runs/not/yet", 0.001).status is Status.PASS
    short = doctor.check_free_disk(tmp_path, 1e9)
    assert short.status is Status.FAIL and "need 1e+09 GiB" in short.detail


def write_dataset(tmp_path, text, dirs=("images/train", "images/val")):
    for d in dirs:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    path = tmp_path / "data.yaml"
    path.write_text(text)
    return path


def test_dataset_yaml(tmp_path):
    good = write_dataset(tmp_path, "path: .\ntrain: images/train\nval: images/val\nnames: {0: cat, 1: dog}\n")
    check = doctor.check_dataset_yaml(good)
    assert check.status is Status.PASS and "2 classes" in check.detail
    assert doctor.check_dataset_yaml(None).status is Status.WARN
    assert doctor.check_dataset_yaml(tmp_path / "absent.yaml").status is Status.FAIL
    broken = write_dataset(tmp_path, "train: [unclosed\n")
    assert doctor.check_dataset_yaml(broken).status is Status.FAIL
    partial = write_dataset(tmp_path, "train: images/train\nnames: [a]\n")
    assert "missing keys val" in doctor.check_dataset_yaml(partial).detail
    elsewhere = write_dataset(tmp_path, "path: /nonexistent\ntrain: t\nval: v\nnames: [a]\n")
    assert doctor.check_dataset_yaml(elsewhere).status is Status.WARN


# -- the command ------------------------------------------------------------------------------------

def test_exit_status_is_the_worst_result_and_torch_stays_out_of_the_process(tmp_path):
    root = tree(tmp_path, "rx5700xt")
    (root / "run/systemd/system").mkdir(parents=True)
    data = write_dataset(tmp_path, "path: .\ntrain: images/train\nval: images/val\nnames: [a]\n")
    script = (
        "import sys; from supervisor.verbs.doctor import doctor_main; "
        f"rc = doctor_main(['--root', {str(root)!r}, '--checkpoints', {str(tmp_path)!r}, '--data', {str(data)!r}, '--need-gib', '0.001']); "
        "assert 'torch' not in sys.modules, 'doctor imported torch'; sys.exit(rc)"
    )
    env = {k: v for k, v in os.environ.items() if k != "HSA_OVERRIDE_GFX_VERSION"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.stderr == "" or "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    # The gfx1010 card has no HSA_OVERRIDE_GFX_VERSION in this environment: a failure, so exit 2.
    assert any(line.startswith("[fail] GPU architecture: gfx1010") for line in lines), done.stdout
    assert done.returncode == 2
    assert lines[-1].startswith("doctor: fail")


@pytest.mark.parametrize("statuses,expected", [((Status.PASS,), 0), ((Status.PASS, Status.WARN), 1), ((Status.WARN, Status.FAIL), 2)])
def test_exit_code_mapping(monkeypatch, statuses, expected):
    monkeypatch.setattr(doctor, "run_checks", lambda *a, **k: [doctor.Check(f"c{i}", s, "d", "f") for i, s in enumerate(statuses)])
    monkeypatch.setattr(doctor, "probe_torch", lambda *a, **k: CPU)
    assert doctor.doctor_main([]) == expected


# -- the 2026 ROCm: Core SDK installs, package names, the wheel for the card ------------------------

GFX1010_NATIVE = TorchProbe(version="2.11.0+rocm7.14.0", hip="7.14.0", gpu_available=True,
                            gpu_names=["AMD Radeon RX 5700 XT"], gpu_archs=["gfx1010"])


def test_a_rocm_core_sdk_install_is_found_once_through_its_link_with_its_amdrocm_packages():
    root = FIXTURES / "rx5700xt-core714"
    installs = doctor.find_rocm_installs(root)
    assert [(str(i.path), i.version, i.kind, i.has_runtime) for i in installs] == [
        ("/opt/rocm/core-7.14", "7.14", "ROCm Core SDK", True)]  # /opt/rocm/core links to it: not listed again
    packages = doctor.parse_package_list((root / "dpkg-query-W.txt").read_text())
    assert ("amdrocm7.14-gfx1010", "7.14.0-28484694006") in packages and ("amdrocm-dnn7.14-gfx1010", "7.14.0-28484694006") in packages
    assert not any(n in ("bash", "libc6", "python3") for n, _ in packages)
    check = doctor.check_rocm_install(installs, packages)
    assert check.status is Status.PASS
    assert check.detail.startswith("ROCm Core SDK 7.14 at /opt/rocm/core-7.14;") and "8 amdrocm-* (ROCm Core SDK) package(s)" in check.detail


def test_a_legacy_rocm_install_and_its_rocm_and_hip_packages():
    root = FIXTURES / "rx6900xt"
    installs = doctor.find_rocm_installs(root)
    assert [(str(i.path), i.version, i.kind) for i in installs] == [("/opt/rocm", "6.3.1", "ROCm")]
    packages = doctor.parse_package_list((root / "dpkg-query-W.txt").read_text())
    assert ("miopen-hip-gfx1030kdb", "3.3.0.60301-48~24.04") in packages and ("hip-runtime-amd", "6.3.42131.60301-48~24.04") in packages
    detail = doctor.check_rocm_install(installs, packages).detail
    assert "rocm-*/hip-* package(s)" in detail and "and 2 more" in detail


def test_a_core_sdk_tree_without_the_hsa_runtime_is_a_warning_and_none_at_all_is_fine(tmp_path):
    (tmp_path / "opt/rocm/core-10.0/bin").mkdir(parents=True)
    installs = doctor.find_rocm_installs(tmp_path)
    check = doctor.check_rocm_install(installs, None)
    assert check.status is Status.WARN and "no lib/libhsa-runtime64.so.1" in check.detail and "packages not read" in check.detail
    none = doctor.check_rocm_install(doctor.find_rocm_installs(tmp_path / "empty"), [])
    assert none.status is Status.PASS and "bring their own ROCm" in none.detail


def test_the_wheel_for_an_rx_5700_is_the_gfx1010_device_wheel_of_the_multi_arch_index():
    root = FIXTURES / "rx5700xt-core714"
    overridden = doctor.check_torch_wheel(root, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}, ROCM_63)
    assert overridden.status is Status.WARN and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in overridden.detail
    assert overridden.fix.startswith("make install TORCH_REQ='\"torch[device-gfx1010]\" \"torchvision[device-gfx1010]\" "
                                     "--index-url https://repo.amd.com/rocm/whl-multi-arch/'")
    assert "unset HSA_OVERRIDE_GFX_VERSION" in overridden.fix
    native = doctor.check_torch_wheel(root, {}, GFX1010_NATIVE)
    assert native.status is Status.PASS and "runs on gfx1010 natively" in native.detail
    assert "torch[device-gfx1010]" in native.detail and "https://rocm.nightlies.amd.com/whl-multi-arch/" in native.detail
    assert doctor.check_torch_wheel(root, {}, CPU).status is Status.WARN
    assert doctor.check_torch_wheel(FIXTURES / "rx7900xtx", {}, CPU).fix.count("device-gfx1100") == 2
    assert doctor.check_torch_wheel(tmp_nothing := FIXTURES / "no-such-tree", {}, CPU).status is Status.PASS, tmp_nothing


def test_the_miopen_database_of_a_core_sdk_install_is_found_by_the_shared_lookup(tmp_path):
    root = tree(tmp_path, "rx5700xt-core714")
    missing = doctor.check_miopen_db(root, {}, GFX1010_NATIVE)
    assert missing.status is Status.WARN and "gfx1010_20.kdb or gfx1010.kdb" in missing.detail
    db = root / "opt/rocm/core-7.14/share/miopen/db"
    db.mkdir(parents=True)
    (db / "gfx1010_20.kdb").write_text("")
    found = doctor.check_miopen_db(root, {}, GFX1010_NATIVE)
    assert found.status is Status.PASS and found.detail.startswith(f"{db}/gfx1010_20.kdb")


def test_the_readme_install_line_is_the_one_doctor_prints():
    readme = (REPO / "README.md").read_text()
    assert doctor.wheel_install_line("gfx1010") in readme


# -- the MIOpen mode (issue 55) --------------------------------------------------------------------

def test_the_doctor_says_which_miopen_mode_ultralytics_training_gets():
    nightly = TorchProbe(version="2.14.1+rocm7.14.0", hip="7.14.26071-1f2c3b4d5", gpu_available=True)
    check = doctor.check_miopen_mode(nightly, {})
    assert check.status is Status.PASS
    assert "deterministic = true (its default): normal find (MIOPEN_FIND_MODE unset: DYNAMIC_HYBRID" in check.detail
    assert "no kernel search" in check.detail and "with deterministic = false" not in check.detail
    two_eight = TorchProbe(version="2.8.0+rocm6.4", hip="6.4.43482-0f2d60242", gpu_available=True)
    check = doctor.check_miopen_mode(two_eight, {"MIOPEN_FIND_MODE": "TRUST_VERIFY"})
    assert "(its default): immediate (no find: MIOPEN_FIND_MODE and MIOPEN_FIND_ENFORCE change nothing)" in check.detail
    assert "with deterministic = false: normal find (MIOPEN_FIND_MODE=TRUST_VERIFY" in check.detail
    assert check.detail.endswith("a kernel search can happen")
    assert "not applicable" in doctor.check_miopen_mode(CUDA, {}).detail


# -- the 2026 runtimes and the cards with a named workaround (issue 55.5) ---------------------------------------

ROCM_714 = TorchProbe(version="2.12.0+rocm7.14.0", hip="7.14.26071-1f2c3b4d5", gpu_available=True,
                      gpu_names=["AMD Radeon RX 9070 XT"], gpu_archs=["gfx1201"])
ROCM_72 = TorchProbe(version="2.9.1+rocm7.2.1", hip="7.2.53211-e4fa5a4d4", gpu_available=True,
                     gpu_names=["AMD Radeon 780M Graphics"], gpu_archs=["gfx1103"])


def test_a_runtime_whose_hip_thread_spins_is_warned_of_with_its_source():
    root = FIXTURES / "rx9070xt"  # the ROCm Core SDK 7.14 layout, /opt/rocm/core-7.14
    installs = doctor.find_rocm_installs(root)
    assert [(str(i.path), i.version) for i in installs] == [("/opt/rocm/core-7.14", "7.14")]
    check = doctor.check_rocm_runtime(ROCM_714, installs)
    assert check.status is Status.WARN
    assert check.detail.startswith("torch's 7.14.26071-1f2c3b4d5, /opt/rocm/core-7.14 7.14: ROCr's AsyncEventsLoop")
    assert "ROCm/TheRock#7051, legacy-rocm-build#6634" in check.detail and "ROCm 7.2" in check.fix
    nightly = TorchProbe(version="2.13.0+rocm10.0.0", hip="10.0.26111-6b0e43f3a")
    assert doctor.check_rocm_runtime(nightly, []).status is Status.WARN


def test_a_runtime_not_known_to_spin_passes():
    root = FIXTURES / "radeon780m"  # /opt/rocm-7.2.1 and rocm-core's .info/version "7.2.1-81", /opt/rocm linked to it
    installs = doctor.find_rocm_installs(root)
    assert [(str(i.path), i.version) for i in installs] == [("/opt/rocm-7.2.1", "7.2.1")]
    check = doctor.check_rocm_runtime(ROCM_72, installs)
    assert check.status is Status.PASS and "not a runtime whose HIP thread is known to spin" in check.detail
    assert doctor.check_rocm_runtime(ROCM_63, doctor.find_rocm_installs(FIXTURES / "rx6900xt")).status is Status.PASS
    assert "not applicable" in doctor.check_rocm_runtime(CUDA, []).detail


def test_a_gfx12_card_is_told_of_hipblaslt_and_an_apu_of_sdma_each_with_its_source():
    gfx12 = doctor.check_card_workarounds(FIXTURES / "rx9070xt", {})
    assert gfx12.status is Status.WARN
    assert gfx12.detail.startswith("gfx1201 is gfx12 (RX 9060/9070, Radeon AI PRO R9700): training with hipBLASLt")
    assert "TORCH_BLAS_PREFER_HIPBLASLT=0 (ROCm/TheRock#7699" in gfx12.detail
    assert "the default ladder sets it at its rung after a GPU reset or page fault in training" in gfx12.detail
    assert gfx12.fix == 'to train with it from the start: [worker] env = { TORCH_BLAS_PREFER_HIPBLASLT = "0" }'
    assert doctor.check_card_workarounds(FIXTURES / "rx9070xt", {"TORCH_BLAS_PREFER_HIPBLASLT": "0"}).status \
        is Status.PASS
    apu = doctor.check_card_workarounds(FIXTURES / "radeon780m", {})
    assert apu.status is Status.WARN and apu.detail.startswith("gfx1103 is an APU: lost SDMA copy completions")
    assert "HSA_ENABLE_SDMA=0 (legacy-rocm-build#6386: a Radeon 780M had 5 hangs and 9 resets in one night" in apu.detail
    assert "the default ladder sets it at its first rung" in apu.detail
    dgpu = doctor.check_card_workarounds(FIXTURES / "rx6900xt", {})
    assert dgpu.status is Status.PASS and dgpu.detail == "gfx1030: no workaround named for it"


def test_the_doctor_prints_the_new_lines(tmp_path):
    root = tree(tmp_path, "rx9070xt")
    checks = doctor.run_checks(root, {}, ROCM_714, "trainer", {"video", "render"}, tmp_path, None, 0.001)
    names = [c.name for c in checks]
    assert {"MIOpen mode", "ROCm runtime", "workarounds for this GPU"} <= set(names)
    text = "\n".join(doctor.format_check(c) for c in checks)
    assert "[warn] workarounds for this GPU: gfx1201 is gfx12" in text and "[warn] ROCm runtime: torch's 7.14" in text
