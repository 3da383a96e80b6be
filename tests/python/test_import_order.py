"""`import torch_fl` works whenever it comes: after a CPU backward too.

torch's autograd engine makes its per-device queues at the process's first
backward, from the device types registered then; torch_fl gives an engine
that started before it was imported the queues for flagos's devices
(plugin/csrc/autograd_device_queues.h). Without them the first flagos
backward failed inside the engine (INTERNAL ASSERT FAILED ...
device_ready_queues_). PYTHONPATH=plugin, as these tests run, is a case
where torch's autoload does not import torch_fl with torch.
"""
from __future__ import annotations


def test_a_flagos_backward_after_a_cpu_backward_before_the_import(run_python) -> None:
    result = run_python("""
import torch
x = torch.ones(3, requires_grad=True)
(x * 2).sum().backward()           # the engine starts here, without flagos
import torch_fl
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
reference.load_state_dict(model.state_dict())
model.to("flagos")
data = torch.randn(16, 4)
for m, d in ((model, data.to("flagos")), (reference, data)):
    m(d).pow(2).mean().backward()
grads = [p.grad.cpu() for p in model.parameters()]
expected = [p.grad for p in reference.parameters()]
print(all(torch.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(grads, expected)))
# Both devices: each has its own queue.
y = torch.ones(2, device="flagos:1", requires_grad=True)
(y * 3).sum().backward()
print(y.grad.cpu().tolist(), x.grad.tolist())
""")
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout == "True\n[3.0, 3.0] [2.0, 2.0, 2.0]\n", (result.stdout, result.stderr)
    assert result.stderr == "", result.stderr


def test_a_flagos_backward_when_torch_fl_came_first(run_python) -> None:
    # The usual order still works: the engine counts flagos's devices itself.
    result = run_python("""
import torch, torch_fl
y = torch.ones(2, device="flagos:1", requires_grad=True)
(y * 3).sum().backward()
x = torch.ones(3, requires_grad=True)
(x * 2).sum().backward()
print(y.grad.cpu().tolist(), x.grad.tolist())
""")
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout == "[3.0, 3.0] [2.0, 2.0, 2.0]\n", (result.stdout, result.stderr)


def test_a_first_cpu_backward_that_opens_the_session_then_flagos_backwards(run_python) -> None:
    # torch_fl imported, no session yet, and the process's first backward is a
    # CPU one (a test's CPU reference): the engine counts flagos's devices as it
    # starts, which opens the session inside its start. Growing its queues
    # there made it wait forever for its device threads (their count then
    # exceeds the devices), intermittently. Several processes, as it was a race.
    program = """
import torch, torch_fl
x = torch.ones(3, requires_grad=True)
(x * 2).sum().backward()           # the engine starts here; its device count opens the session
y = torch.ones(2, device="flagos:0", requires_grad=True)
(y * 3).sum().backward()
z = torch.ones(2, device="flagos:1", requires_grad=True)
(z * 4).sum().backward()
print(x.grad.tolist(), y.grad.cpu().tolist(), z.grad.cpu().tolist())
"""
    for _ in range(6):
        result = run_python(program, timeout=120)
        assert result.returncode == 0, result.stderr[-4000:]
        assert result.stdout == "[2.0, 2.0, 2.0] [3.0, 3.0] [4.0, 4.0]\n", (result.stdout, result.stderr)
        assert result.stderr == "", result.stderr
