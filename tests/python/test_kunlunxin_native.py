"""The kunlunxin backend's native route: xdnn_pytorch through flagosd's binding
module, over the fake libxpurt and the fake xdnn_pytorch (tests/fakes/xdnn).

Each test starts its own kunlunxin daemon (whatever backend the run uses)
with the binding module built against the fake, and checks results against
CPU torch: a calibration that routes what matched native and what lied
cpu_fallback; a training step that runs native; per-call fallback on
NOT_IMPLEMENT; vendor errors that name the op, the call and the code; and a
daemon without the module.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flagos_test_env import REPO, fake_xpu_env, on_kunlunxin

MODULE = REPO / "build" / "tests" / "fakes" / "xdnn" / "module" / "libflagos_kunlunxin_xdnn.so"
CALIBRATE = REPO / "scripts" / "kunlunxin-calibrate"

pytestmark = [
    pytest.mark.skipif(not MODULE.is_file(),
                       reason=f"the fake xdnn binding module is not built ({MODULE})"),
    # Its daemons are kunlunxin ones whatever the run's backend: the cpu
    # pass runs it, the kunlunxin pass would only repeat it.
    pytest.mark.skipif(on_kunlunxin(), reason="runs its own kunlunxin daemons in the cpu pass"),
]

# One training step of an MLP with Adam, as people write it; prints the loss
# of each step and the final weights' checksum, on flagos and on the CPU.
TRAINING = r"""
import torch, torch_fl, json
def run(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, generator=g).to(device)
    y = torch.randint(0, 4, (8,), generator=g).to(device)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]
l_dev, p_dev = run("flagos")
l_cpu, p_cpu = run("cpu")
err = max((a - b).abs().max().item() for a, b in zip(p_dev, p_cpu))
print(json.dumps({"flagos": l_dev, "cpu": l_cpu, "param_err": err}))
"""


# A CNN with batch norm and a small transformer (embedding, attention,
# layer norm, gelu), trained with SGD + momentum on flagos and on the CPU.
# (Adam would turn the exactly-zero gradients of a conv bias before batch
# norm, or of attention's key bias, into steps of either sign on rounding
# noise: any two correct kernels disagree there.)
MODELS = r"""
import torch, torch_fl, json
def run(device, kind):
    torch.manual_seed(0)
    if kind == "cnn":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                    torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                    torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(8, 4)).to(device)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(4, 3, 8, 8, generator=g).to(device)
        y = torch.randint(0, 4, (4,), generator=g).to(device)
        fwd = lambda: torch.nn.functional.cross_entropy(model(x), y)
    else:
        emb = torch.nn.Embedding(20, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True,
                                                 activation="gelu")
        head = torch.nn.Linear(16, 20)
        model = torch.nn.ModuleList([emb, layer, head]).to(device)
        g = torch.Generator().manual_seed(1)
        tok = torch.randint(0, 20, (2, 5), generator=g).to(device)
        fwd = lambda: torch.nn.functional.cross_entropy(head(layer(emb(tok))).reshape(-1, 20), tok.reshape(-1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(3):
        opt.zero_grad(); loss = fwd(); loss.backward(); opt.step(); losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]
out = {}
for kind in ("cnn", "transformer"):
    l_dev, p_dev = run("flagos", kind); l_cpu, p_cpu = run("cpu", kind)
    out[kind] = {"flagos": l_dev, "cpu": l_cpu,
                 "param_err": max((a - b).abs().max().item() for a, b in zip(p_dev, p_cpu))}
print(json.dumps(out))
"""


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of `name`'s series whose labels include `labels`."""
    total = 0.0
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def native_conf(tmp_path: Path, overloads: list[str]) -> Path:
    conf = tmp_path / "ops.conf"
    conf.write_text("default = cpu_fallback\n" + "".join(f"{o} = native\n" for o in overloads))
    return conf


# The overloads one MLP + Adam step issues (the calibration must route them
# native over the fakes).
TRAINING_OVERLOADS = [
    "aten::addmm", "aten::mm", "aten::relu", "aten::threshold_backward",
    "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
    "aten::nll_loss_backward", "aten::sum.dim_IntList", "aten::fill_.Scalar", "aten::zero_",
    "aten::copy_", "aten::add_.Tensor", "aten::add.Tensor", "aten::mul.Tensor",
    "aten::_foreach_add_.Scalar", "aten::_foreach_lerp_.Scalar", "aten::_foreach_mul_.Scalar",
    "aten::_foreach_addcmul_.Scalar", "aten::_foreach_sqrt", "aten::_foreach_div_.ScalarList",
    "aten::_foreach_addcdiv_.ScalarList",
    # What the client sends when it runs a _foreach_ op element by element.
    "aten::addcdiv_", "aten::addcmul_", "aten::div_.Tensor", "aten::lerp_.Scalar", "aten::sqrt",
    "aten::mul.out", "aten::mul_.Scalar", "aten::add_.Scalar",
]


def start_native(start_daemon, conf: Path | None, **fake_xdnn: str):
    env = {f"FAKE_XDNN_{k.upper()}": v for k, v in fake_xdnn.items()}
    env.update(fake_xpu_env(delay_us="300"))
    args = ["--metrics-listen=127.0.0.1:0", f"--xdnn-module={MODULE}"]
    if conf is not None:
        args.append(f"--ops-conf={conf}")
    return start_daemon(backend="kunlunxin", extra_args=args, env=env)


def py(run_python, daemon, code: str) -> str:
    """`code`'s stdout, run against `daemon`; the run must exit 0."""
    done = run_python(code, env={"FLAGOS_ENDPOINT": daemon.endpoint})
    assert done.returncode == 0, done.stdout + done.stderr + daemon.log()
    return done.stdout


def train(run_python, daemon, steps: int = 4) -> dict:
    out = py(run_python, daemon, TRAINING.replace("STEPS", str(steps)))
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    """The route file scripts/kunlunxin-calibrate writes over the fakes (every sample)."""
    import os
    out = tmp_path_factory.mktemp("calibrated") / "ops.conf"
    done = subprocess.run(
        [sys.executable, str(CALIBRATE), f"--out={out}", f"--xdnn-module={MODULE}"],
        env=dict(os.environ, **fake_xpu_env(delay_us="50")), capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_calibrated_routes_cover_the_training_step(calibrated):
    routes = dict(re.findall(r"^(aten::\S+) = (\w+)", calibrated.read_text(), re.M))
    missing = [o for o in TRAINING_OVERLOADS if routes.get(o) != "native"]
    assert not missing, calibrated.read_text()


def test_training_step_runs_native_and_matches_cpu(start_daemon, run_python, calibrated):
    daemon = start_native(start_daemon, calibrated)
    assert "native route: xdnn_pytorch through" in daemon.log()
    url = daemon.metrics_url()
    result = train(run_python, daemon)
    assert result["flagos"] == pytest.approx(result["cpu"], abs=1e-5)
    assert result["param_err"] < 1e-5
    native = metric(url, "flagosd_ops_total", route="native")
    fallback = metric(url, "flagosd_ops_total", route="cpu_fallback")
    assert metric(url, "flagosd_native_route_available") == 1
    # Every op of the step but the few with host scalars (Adam's step count
    # lives on the CPU) runs native.
    assert native / (native + fallback) >= 0.9, (native, fallback)


def test_a_cnn_with_batch_norm_and_a_transformer_train_native(start_daemon, run_python,
                                                              calibrated):
    daemon = start_native(start_daemon, calibrated)
    url = daemon.metrics_url()
    result = json.loads(py(run_python, daemon, MODELS).strip().splitlines()[-1])
    for kind in ("cnn", "transformer"):
        assert result[kind]["flagos"] == pytest.approx(result[kind]["cpu"], abs=1e-5), result
        assert result[kind]["param_err"] < 1e-5, result
    native = metric(url, "flagosd_ops_total", route="native")
    fallback = metric(url, "flagosd_ops_total", route="cpu_fallback")
    declined = metric(url, "flagosd_native_declined_total")
    print(f"native {native:.0f}, cpu_fallback {fallback:.0f} (declined {declined:.0f})")
    # Every call the routes send native runs native (the embedding lookup
    # too: a composite operator forwarded whole, since the daemon reports
    # it runs it), but for the ones the library declines at run time: batch
    # norm's int64 step count (the fake's add refuses int64). Besides:
    # loss.item(), 2 models x 3 steps, a value read back (_local_scalar_dense,
    # the host copy of 4 bytes).
    assert fallback == declined + 6, (native, fallback, declined)
    assert re.findall(r"native kernels declined (\S+) \(", daemon.log()) == ["aten::add_.Tensor"], \
        daemon.log()
    assert native / (native + fallback) >= 0.9, (native, fallback)


def test_native_moves_a_small_share_of_the_all_fallback_bytes(start_daemon, run_python,
                                                              calibrated):
    native_daemon = start_native(start_daemon, calibrated)
    all_fallback = start_native(start_daemon, None)
    train(run_python, native_daemon)
    train(run_python, all_fallback)
    moved = [metric(d.metrics_url(), "flagosd_cpu_fallback_bytes_total")
             for d in (native_daemon, all_fallback)]
    assert moved[1] > 0
    assert moved[0] <= 0.02 * moved[1], moved


def test_not_implement_runs_that_call_on_cpu_fallback(start_daemon, run_python, tmp_path):
    daemon = start_native(start_daemon, native_conf(tmp_path, TRAINING_OVERLOADS),
                          not_implement="mm:float32,relu:*")
    url = daemon.metrics_url()
    result = train(run_python, daemon, steps=2)
    assert result["flagos"] == pytest.approx(result["cpu"], abs=1e-5)
    declined = metric(url, "flagosd_native_declined_total")
    assert declined > 0
    # Refused once, then remembered: xdnn is asked once per (op, dtype).
    out = py(run_python, daemon,
             "import torch, torch_fl\n"
             "a = torch.ones(3, 3, device='flagos')\n"
             "for _ in range(5): b = torch.mm(a, a)\n"
             "print(b.cpu().sum().item())\n")
    assert out.strip().splitlines()[-1] == "27.0"
    assert metric(url, "flagosd_native_declined_total") >= declined + 5
    # xdnn said NOT_IMPLEMENT once; later calls (this session's, the next
    # session's) were declined without asking it.
    assert daemon.log().count("through xdnn_pytorch::mm (NOT_IMPLEMENT)") == 1, daemon.log()
    assert "xdnn_pytorch refused aten::mm.out for Float before" in daemon.log()


@pytest.mark.parametrize("code", ["RUNTIME_ERROR", "INVALID_PARAM"])
def test_vendor_error_names_op_call_and_code_and_session_goes_on(start_daemon, run_python,
                                                                 tmp_path, code):
    daemon = start_native(start_daemon, native_conf(tmp_path, ["aten::mm", "aten::add.Tensor"]),
                          fail=f"mm:{code}")
    out = py(run_python, daemon,
             "import torch, torch_fl\n"
             "a = torch.ones(2, 2, device='flagos')\n"
             "try:\n"
             "    torch.mm(a, a).cpu()\n"
             "    print('no error')\n"
             "except RuntimeError as e:\n"
             "    print('ERROR', ' '.join(str(e).split()))\n"
             "print('after', (a + a).cpu().tolist())\n")
    error = next(line for line in out.splitlines() if line.startswith(("ERROR", "no error")))
    assert "aten::mm" in error and "xdnn_pytorch::mm" in error and code in error, out
    assert "after [[2.0, 2.0], [2.0, 2.0]]" in out


def test_without_the_module_every_op_takes_cpu_fallback(start_daemon, run_python, tmp_path):
    env = fake_xpu_env()
    env["FLAGOS_KUNLUNXIN_XDNN_MODULE"] = None
    daemon = start_daemon(backend="kunlunxin", env=env,
                          extra_args=["--metrics-listen=127.0.0.1:0",
                                      f"--ops-conf={native_conf(tmp_path, ['aten::mm'])}"])
    log = daemon.log()
    assert "the native (xdnn) route is absent, so every operator takes cpu_fallback" in log, log
    url = daemon.metrics_url()
    assert metric(url, "flagosd_native_route_available") == 0
    out = py(run_python, daemon,
             "import torch, torch_fl\n"
             "a = torch.ones(2, 2, device='flagos')\n"
             "print(torch.mm(a, a).cpu().sum().item())\n")
    assert out.strip().splitlines()[-1] == "8.0"
    assert metric(url, "flagosd_ops_total", route="native") == 0


def test_a_module_that_does_not_load_fails_the_start_naming_file_and_variable(flagosd_binary,
                                                                            tmp_path):
    import os
    not_a_module = REPO / "build" / "tests" / "fakes" / "xpu" / "so" / "libxpurt.so.2"
    missing = tmp_path / "libflagos_kunlunxin_xdnn.so"
    for module, expected in ((not_a_module, "has no flagos_xdnn_module_v1()"),
                             (missing, "does not exist")):
        done = subprocess.run(
            [str(flagosd_binary), f"--listen=unix://{tmp_path}/s.sock", "--backend=kunlunxin",
             "--metrics-listen=", f"--xdnn-module={module}"],
            env=dict(os.environ, **fake_xpu_env()), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert str(module) in done.stderr and expected in done.stderr, done.stderr
        assert "--xdnn-module" in done.stderr or "FLAGOS_KUNLUNXIN_XDNN" in done.stderr


def calibrate(tmp_path: Path, **fake_xdnn: str) -> tuple[str, dict]:
    import os
    env = dict(os.environ, **fake_xpu_env(delay_us="100"),
               **{f"FAKE_XDNN_{k.upper()}": v for k, v in fake_xdnn.items()})
    out = tmp_path / "ops.conf"
    done = subprocess.run(
        [sys.executable, str(CALIBRATE), f"--out={out}", f"--xdnn-module={MODULE}",
         "--only=aten::mm,aten::mul.Tensor,aten::add_.Tensor,aten::_log_softmax,aten::relu,"
         "aten::fill_.Scalar"],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out.read_text(), json.loads(Path(f"{out}.json").read_text())


def test_calibration_routes_what_matched_native_and_a_lying_op_cpu_fallback(tmp_path):
    conf, evidence = calibrate(tmp_path, lie="mul_tensor", not_implement="relu:bfloat16")
    routes = dict(re.findall(r"^(aten::\S+) = (\w+)", conf, re.M))
    assert routes["aten::mm"] == "native"
    assert routes["aten::add_.Tensor"] == "native"
    assert routes["aten::_log_softmax"] == "native"
    assert routes["aten::fill_.Scalar"] == "native"
    # relu refuses bfloat16: that dtype falls back per call, the rest is native.
    assert routes["aten::relu"] == "native"
    assert evidence["overloads"]["aten::relu"]["dtypes"]["bfloat16"]["declined_calls"] > 0
    # The lying op: routed cpu_fallback, and the file says why.
    assert routes["aten::mul.Tensor"] == "cpu_fallback"
    assert re.search(r"aten::mul.Tensor = cpu_fallback  # \w+: results differ from ATen CPU",
                     conf), conf
    mm = evidence["overloads"]["aten::mm"]["dtypes"]["float32"]
    assert mm["max_error"] <= 1e-4 and mm["seconds"] > 0 and mm["cpu_fallback_seconds"] > 0
    assert "xdnn_pytorch through" in evidence["native_route"]
    assert evidence["date"] and evidence["devices"]


def test_the_smoke_script_covers_the_native_route_and_writes_its_report(flagosd_binary,
                                                                       calibrated, tmp_path):
    import os
    env = dict(os.environ, **fake_xpu_env(devices="2"))
    env.pop("FLAGOS_ENDPOINT", None)
    report = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "kunlunxin-smoke"), f"--flagosd={flagosd_binary}",
         f"--xdnn-module={MODULE}", f"--ops-conf={calibrated}", f"--report={report}"],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "native route: xdnn_pytorch through" in done.stdout
    checks = {c["check"].split(" against")[0]: c for c in json.loads(report.read_text())["checks"]}
    for name in ("mm 256x128 @ 128x64", "softmax 64x100", "conv2d 2x3x16x16 * 8x3x3x3",
                 "3 Adam steps of an MLP"):
        assert checks[name]["ok"] and checks[name]["native_ops"] > 0, checks[name]
    # The MLP's Adam steps run native whole (their step counts live on the CPU).
    assert checks["3 Adam steps of an MLP"]["cpu_fallback_ops"] == 0, checks
