"""Checkpoints: a flagos model's (and optimizer's) state_dict saved with
torch.save loads back onto flagos or the CPU with the same values, and a CPU
checkpoint loads into a flagos model."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
from torch import nn

from models import FL, make_cnn, make_transformer, prefixed, transformer_data

STEPS = 3


def assert_state_equal(actual: dict, expected: dict, device: torch.device | str) -> None:
    """Same keys; every tensor on `device`, with the expected dtype, shape and values."""
    device = torch.device(device)
    assert list(actual) == list(expected)
    for key, value in expected.items():
        got = actual[key]
        assert got.device == device, f"{key}: on {got.device}, not {device}"
        assert got.dtype == value.dtype, key
        assert torch.equal(got.cpu(), value.cpu()), key


def save_load(obj: object, path: Path, **load_kwargs: object) -> object:
    torch.save(obj, path)
    return torch.load(path, **load_kwargs)


@pytest.fixture
def fl_model() -> nn.Module:
    # A CNN with batch_norm: float parameters, float buffers and an int64 counter.
    return make_cnn().to(FL)


def test_state_dict_of_flagos_model_lives_on_flagos(fl_model: nn.Module) -> None:
    state = fl_model.state_dict()
    assert "bn1.num_batches_tracked" in state
    for key, value in state.items():
        assert value.device == torch.device(FL, 0), key


def test_save_and_load_to_flagos(fl_model: nn.Module, tmp_path: Path) -> None:
    state = fl_model.state_dict()
    loaded = save_load(state, tmp_path / "model.pt", map_location=FL)
    assert_state_equal(loaded, state, torch.device(FL, 0))


def test_save_and_load_without_map_location_restores_flagos(
    fl_model: nn.Module, tmp_path: Path
) -> None:
    state = fl_model.state_dict()
    loaded = save_load(state, tmp_path / "model.pt")
    assert_state_equal(loaded, state, torch.device(FL, 0))


def test_save_and_load_to_cpu(fl_model: nn.Module, tmp_path: Path) -> None:
    state = fl_model.state_dict()
    loaded = save_load(state, tmp_path / "model.pt", map_location="cpu")
    assert_state_equal(loaded, make_cnn().state_dict(), "cpu")


def test_save_and_load_to_other_flagos_device(fl_model: nn.Module, tmp_path: Path) -> None:
    state = fl_model.state_dict()
    loaded = save_load(state, tmp_path / "model.pt", map_location=torch.device(FL, 1))
    assert_state_equal(loaded, state, torch.device(FL, 1))


def test_saved_tensor_from_second_device_loads_back_there(tmp_path: Path) -> None:
    t = torch.arange(5.0, device=torch.device(FL, 1))
    loaded = save_load(t, tmp_path / "t.pt")
    assert loaded.device == torch.device(FL, 1)
    assert torch.equal(loaded.cpu(), torch.arange(5.0))


def test_load_state_dict_from_flagos_checkpoint_into_new_flagos_model(
    fl_model: nn.Module, tmp_path: Path
) -> None:
    loaded = save_load(fl_model.state_dict(), tmp_path / "model.pt", map_location=FL)
    other = make_cnn(seed=99).to(FL)
    other.load_state_dict(loaded)
    assert_state_equal(other.state_dict(), make_cnn().state_dict(), torch.device(FL, 0))


def test_cpu_checkpoint_into_flagos_model(tmp_path: Path) -> None:
    cpu_state = make_cnn().state_dict()
    torch.save(cpu_state, tmp_path / "cpu.pt")
    model = make_cnn(seed=99).to(FL)
    model.load_state_dict(torch.load(tmp_path / "cpu.pt"))
    # load_state_dict copies into the existing flagos parameters.
    assert_state_equal(model.state_dict(), cpu_state, torch.device(FL, 0))
    assert all(p.device.type == FL for p in model.parameters())


def test_cpu_checkpoint_with_map_location_flagos(tmp_path: Path) -> None:
    cpu_state = make_cnn().state_dict()
    loaded = save_load(cpu_state, tmp_path / "cpu.pt", map_location=FL)
    assert_state_equal(loaded, cpu_state, torch.device(FL, 0))


def test_map_location_dict_moves_between_flagos_devices(tmp_path: Path) -> None:
    state = make_cnn().to(torch.device(FL, 1)).state_dict()
    loaded = save_load(state, tmp_path / "model.pt", map_location={"flagos:1": "flagos:0"})
    assert_state_equal(loaded, make_cnn().state_dict(), torch.device(FL, 0))


def test_mmap_load_of_cpu_checkpoint_to_flagos(tmp_path: Path) -> None:
    cpu_state = make_cnn().state_dict()
    loaded = save_load(cpu_state, tmp_path / "cpu.pt", mmap=True, map_location=FL)
    assert_state_equal(loaded, cpu_state, torch.device(FL, 0))


def test_whole_module_pickled(fl_model: nn.Module, tmp_path: Path) -> None:
    loaded = save_load(fl_model, tmp_path / "module.pt", weights_only=False)
    assert isinstance(loaded, type(fl_model))
    assert_state_equal(loaded.state_dict(), make_cnn().state_dict(), torch.device(FL, 0))


def test_deepcopy_of_flagos_model(fl_model: nn.Module) -> None:
    copied = copy.deepcopy(fl_model)
    assert_state_equal(copied.state_dict(), make_cnn().state_dict(), torch.device(FL, 0))
    next(copied.parameters()).data.zero_()
    assert_state_equal(fl_model.state_dict(), make_cnn().state_dict(), torch.device(FL, 0))


def test_meta_model_to_empty_then_load_cpu_checkpoint(tmp_path: Path) -> None:
    cpu_state = make_cnn().state_dict()
    torch.save(cpu_state, tmp_path / "cpu.pt")
    with torch.device("meta"):
        model = make_cnn()
    model = model.to_empty(device=FL)
    model.load_state_dict(torch.load(tmp_path / "cpu.pt", map_location=FL))
    assert_state_equal(model.state_dict(), cpu_state, torch.device(FL, 0))


def test_meta_model_load_state_dict_assign(tmp_path: Path) -> None:
    cpu_state = make_cnn().state_dict()
    loaded = save_load(cpu_state, tmp_path / "cpu.pt", map_location=FL)
    with torch.device("meta"):
        model = make_cnn()
    model.load_state_dict(loaded, assign=True)
    assert_state_equal(model.state_dict(), cpu_state, torch.device(FL, 0))


def test_tensors_of_many_dtypes_and_views_round_trip(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    cpu = {
        "f32": base,
        "f64": base.double() / 7,
        "f16": base.half() / 3,
        "bf16": base.bfloat16() / 3,
        "i64": base.long() - 10,
        "i32": base.int(),
        "u8": base.to(torch.uint8),
        "bool": base > 11,
        "transposed": base.t(),
        "slice": base[1:3, ::2],
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
    }
    on_fl = {k: v.to(FL) if k not in ("transposed", "slice") else v for k, v in cpu.items()}
    on_fl["transposed"] = on_fl["f32"].t()
    on_fl["slice"] = on_fl["f32"][1:3, ::2]
    loaded = save_load(on_fl, tmp_path / "t.pt", map_location=FL)
    for key, value in cpu.items():
        got = loaded[key]
        assert got.device.type == FL, key
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert got.stride() == value.stride(), key
        assert torch.equal(got.cpu(), value), key


def test_views_keep_sharing_storage_after_load(tmp_path: Path) -> None:
    a = torch.arange(6.0, device=FL)
    loaded = save_load({"a": a, "view": a[2:]}, tmp_path / "t.pt", map_location=FL)
    loaded["a"][3] = 100.0
    assert loaded["view"].cpu().tolist() == [2.0, 100.0, 4.0, 5.0]


def test_save_to_bytes_buffer() -> None:
    t = torch.randn(3, 4, device=FL)
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu")
    assert loaded.device.type == "cpu"
    assert torch.equal(loaded, t.cpu())


# ------------------------------------------------------------------ optimizer state


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, device: str,
                steps: int) -> list[float]:
    x, y = (t.to(device) for t in transformer_data())
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_resumes_like_cpu(trained: dict, model: nn.Module,
                            optimizer: torch.optim.Optimizer) -> None:
    """Training `model` on flagos from the checkpointed state continues exactly
    as training the CPU model that wrote the checkpoint."""
    cpu_model = copy.deepcopy(trained["cpu_model"])
    cpu_opt = adam(cpu_model)
    cpu_opt.load_state_dict(trained["cpu_opt"].state_dict())
    expected = train_steps(cpu_model, cpu_opt, "cpu", STEPS)
    got = train_steps(model, optimizer, FL, STEPS)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=0.0)


def adam(model: nn.Module) -> torch.optim.Optimizer:
    # eps 1e-5: see test_models.py (the attention's key bias has a zero gradient)
    return torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-5)


@pytest.fixture(scope="module")
def trained() -> dict[str, object]:
    """The transformer trained STEPS steps with Adam on the CPU and on flagos."""
    initial = make_transformer()
    cpu_model = copy.deepcopy(initial)
    cpu_opt = adam(cpu_model)
    train_steps(cpu_model, cpu_opt, "cpu", STEPS)
    fl_model = copy.deepcopy(initial).to(FL)
    fl_opt = adam(fl_model)
    train_steps(fl_model, fl_opt, FL, STEPS)
    return {"cpu_model": cpu_model, "cpu_opt": cpu_opt, "fl_model": fl_model, "fl_opt": fl_opt}


def test_optimizer_state_dict_round_trips_to_cpu(trained: dict, tmp_path: Path) -> None:
    saved = {"model": trained["fl_model"].state_dict(), "optim": trained["fl_opt"].state_dict()}
    loaded = save_load(saved, tmp_path / "ckpt.pt", map_location="cpu")
    expected = trained["cpu_opt"].state_dict()
    assert loaded["optim"]["param_groups"] == expected["param_groups"]
    assert loaded["optim"]["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():
        for key, value in state.items():
            got = loaded["optim"]["state"][index][key]
            assert got.device.type == "cpu", (index, key)
            torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-6,
                                       msg=prefixed(f"state[{index}][{key!r}]"))
    for key, value in trained["cpu_model"].state_dict().items():
        assert loaded["model"][key].device.type == "cpu", key
        torch.testing.assert_close(loaded["model"][key], value, rtol=1e-4, atol=1e-5,
                                   msg=prefixed(key))


def test_optimizer_state_dict_round_trips_to_flagos(trained: dict, tmp_path: Path) -> None:
    state = trained["fl_opt"].state_dict()
    loaded = save_load(state, tmp_path / "optim.pt", map_location=FL)
    assert loaded["param_groups"] == state["param_groups"]
    for index, entry in state["state"].items():
        for key, value in entry.items():
            got = loaded["state"][index][key]
            # map_location moves every tensor, the CPU "step" counters too
            assert got.device == torch.device(FL, 0), (index, key)
            assert torch.equal(got.cpu(), value.cpu()), (index, key)


def test_resumed_training_on_flagos_matches_cpu(trained: dict, tmp_path: Path) -> None:
    """Save after STEPS steps, load into a fresh flagos model and optimizer, train on:
    the losses follow the CPU run that never stopped."""
    torch.save(
        {"model": trained["fl_model"].state_dict(), "optim": trained["fl_opt"].state_dict()},
        tmp_path / "ckpt.pt",
    )
    ckpt = torch.load(tmp_path / "ckpt.pt", map_location=FL)
    model = make_transformer(seed=99).to(FL)
    model.load_state_dict(ckpt["model"])
    optimizer = adam(model)
    optimizer.load_state_dict(ckpt["optim"])
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step":
                assert value.device.type == FL, key
    assert_resumes_like_cpu(trained, model, optimizer)


def test_cpu_optimizer_checkpoint_into_flagos_optimizer(trained: dict, tmp_path: Path) -> None:
    torch.save(
        {"model": trained["cpu_model"].state_dict(), "optim": trained["cpu_opt"].state_dict()},
        tmp_path / "cpu.pt",
    )
    ckpt = torch.load(tmp_path / "cpu.pt")
    model = make_transformer(seed=99).to(FL)
    model.load_state_dict(ckpt["model"])
    optimizer = adam(model)
    optimizer.load_state_dict(ckpt["optim"])
    # Optimizer.load_state_dict moves the moments to the parameters' device.
    for index, param in enumerate(model.parameters()):
        for key, value in optimizer.state[param].items():
            if key != "step":
                assert value.device.type == FL, (index, key)
                assert torch.equal(value.cpu(), ckpt["optim"]["state"][index][key]), (index, key)
    assert_resumes_like_cpu(trained, model, optimizer)
