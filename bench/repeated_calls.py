"""10. Eager op calls sent again byte for byte, run as prepared (--reuse-op-calls).

flagosd keeps the calls it decoded once (sessions/repeated_op_calls.h): a
call a session sends again byte for byte — the same op, tensors at the
same addresses, the same scalars — runs as the prepared call, with no
parse, decoding or checks. How often that happens is the program's: a
loop whose tensors land at the same addresses each step repeats nearly
every call; one whose allocator hands out other blocks each step repeats
few.

Each loop runs eagerly in fresh processes against two private daemons
(cpu backend, metrics on) that differ only in --reuse-op-calls, the
processes interleaved. A figure is µs per step over K steps after a
warm-up, ending with a synchronize; the median over repetitions. The
baseline is the same loop against the daemon with --reuse-op-calls=false
(every call parsed and checked). The note gives the share of the loop's op
calls that ran prepared (flagosd_ops_repeated_total against
flagosd_ops_total over the timed steps). The loops:

- MLP 4x64, batch 8, SGD (momentum) and Adam: the model of section 9, one
  batch kept on the device (the loop of a captured step, run eagerly);
- the same SGD loop fed a new batch from the host each step;
- a GPT-2 of 2 layers (Hugging Face transformers, from its config, 64-wide,
  context 32, batch 4): a training step with AdamW, and an eval forward
  (skipped when transformers does not import);
- loops of many distinct calls: in-place adds into 3,000 and into 12,000
  tensors that stay put. The first is run prepared whole from its third
  step; the second sends more calls than a session keeps (8192): the calls
  kept run prepared each step, the rest as sent (the table keeps the calls
  it has rather than starting over).

On a 2-core machine the times move with scheduling more than with the
daemon's work: four busy threads (the client, flagosd's reading thread, its
stream worker and ATen's OpenMP team there, which spins after each parallel
region) share two cores, and the same pair of loops has come out anywhere
from 0.84x to 1.7x from run to run (docs/performance.md). The share of
calls run prepared is the stable figure; scripts/instructions-per-op counts
what a repeated call costs the daemon.

Run alone: python3 bench/repeated_calls.py [--quick] (starts its own daemons).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from common import REPO, Context, PrivateDaemon, Row, median, standalone

SECTION = "10. repeated op calls (--reuse-op-calls)"

# One process: runs each loop named in argv ("name:warmup:steps") for its
# warm-up then its steps, scraping the daemon's counters around the timed
# steps; prints a JSON line per loop.
WORKER = r"""
import json, sys, time, urllib.request, re
import torch, torch_fl
url = sys.argv[1]

def counters():
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = lambda metric: sum(float(v) for v in re.findall(
        r"^" + metric + r"\{[^}]*\} (\S+)", text, re.M))
    return total("flagosd_ops_total"), total("flagosd_ops_repeated_total")

def mlp_loop(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("flagos")
    if "adam" in name:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = [(torch.randn(8, 64), torch.randint(0, 4, (8,))) for _ in range(16)]
    kept = (batches[0][0].to("flagos"), batches[0][1].to("flagos"))
    count = [0]
    def step():
        if "host" in name:
            x, y = batches[count[0] % len(batches)]
            x, y = x.to("flagos"), y.to("flagos")
        else:
            x, y = kept
        count[0] += 1
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step

def gpt2_loop(name):
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).to("flagos")
    ids = torch.randint(0, 512, (4, 32))
    if name == "gpt2_train":
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        def step():
            batch = ids.to("flagos")
            out = model(input_ids=batch, labels=batch)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    else:
        model.eval()
        def step():
            with torch.no_grad():
                model(input_ids=ids.to("flagos"))
    return step

def wide_loop(name):
    # An in-place add into each of N tensors whose addresses stay: N
    # distinct calls per step ("wide_N").
    b = torch.ones(16, device="flagos")
    tensors = [torch.zeros(16, device="flagos") for _ in range(int(name.split("_")[1]))]
    def step():
        for t in tensors:
            t.add_(b)
    return step

LOOP_KINDS = {"mlp": mlp_loop, "gpt2": gpt2_loop, "wide": wide_loop}

for spec in sys.argv[2:]:
    name, warmup, steps = spec.split(":")
    step = LOOP_KINDS[name.split("_")[0]](name)
    for _ in range(int(warmup)):
        step()
    torch.flagos.synchronize()
    ops0, repeated0 = counters()
    start = time.perf_counter()
    for _ in range(int(steps)):
        step()
    torch.flagos.synchronize()
    elapsed = time.perf_counter() - start
    ops1, repeated1 = counters()
    print(json.dumps({"name": name, "us": elapsed / int(steps) * 1e6, "ops": ops1 - ops0,
                      "repeated": repeated1 - repeated0}), flush=True)
"""

# (name, label, warm-up steps, timed steps full / quick)
LOOPS = [
    ("mlp_sgd", "MLP 4x64 SGD step, batch on the device", 5, (200, 40)),
    ("mlp_adam", "MLP 4x64 Adam step, batch on the device", 5, (200, 40)),
    ("mlp_sgd_host", "MLP 4x64 SGD step, batch from the host", 5, (200, 40)),
    ("gpt2_train", "GPT-2 (2 layers) AdamW training step", 5, (30, 8)),
    ("gpt2_eval", "GPT-2 (2 layers) eval forward", 5, (60, 12)),
    ("wide_3000", "3,000 distinct in-place adds per step", 5, (20, 5)),
    ("wide_12000", "12,000 distinct in-place adds per step (more than a session keeps)", 5,
     (10, 3)),
]


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except Exception:  # noqa: BLE001  any import failure: the loops are skipped
        return False
    return True


def _metrics_url(daemon: PrivateDaemon) -> str:
    match = re.search(r"metrics on (\S+)", daemon.log.read_text(errors="replace"))
    if not match:
        raise RuntimeError(f"the daemon did not report its metrics address ({daemon.log})")
    return match.group(1)


def _run_loops(specs: list[str], daemon: PrivateDaemon, url: str) -> dict[str, dict]:
    import os

    env = dict(os.environ, FLAGOS_ENDPOINT=daemon.endpoint)
    plugin = str(REPO / "plugin")  # torch_fl from the source tree unless installed
    env["PYTHONPATH"] = plugin + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, "-c", WORKER, url, *specs],
                         capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"the loops failed:\n{out.stderr[-3000:]}")
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in results}


def run(ctx: Context) -> list[Row]:
    repeats = ctx.scale(3, 1)
    loops = [loop for loop in LOOPS if not loop[0].startswith("gpt2") or _has_transformers()]
    if len(loops) < len(LOOPS):
        ctx.log("transformers does not import: the GPT-2 loops are skipped")
    specs = [f"{name}:{warmup}:{ctx.scale(*steps)}" for name, _, warmup, steps in loops]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="flagos-bench-repeat.") as tmp:
        daemons = {}
        try:
            for reuse in ("true", "false"):
                daemons[reuse] = PrivateDaemon(
                    f"unix://{tmp}/{reuse}.sock", Path(tmp) / f"{reuse}.log",
                    "--metrics-listen=127.0.0.1:0", f"--reuse-op-calls={reuse}")
            urls = {reuse: _metrics_url(d) for reuse, d in daemons.items()}
            results: dict[str, list[dict]] = {"true": [], "false": []}
            for _ in range(repeats):  # one process per daemon, interleaved
                for reuse in ("true", "false"):
                    results[reuse].append(_run_loops(specs, daemons[reuse], urls[reuse]))
        finally:
            for daemon in daemons.values():
                daemon.stop()
    for name, label, _, steps in loops:
        on = median([r[name]["us"] for r in results["true"]])
        off = median([r[name]["us"] for r in results["false"]])
        ops = sum(r[name]["ops"] for r in results["true"])
        repeated = sum(r[name]["repeated"] for r in results["true"])
        share = repeated / ops if ops else 0.0
        per_step = ops / len(results["true"]) / ctx.scale(*steps)
        ctx.log(f"{label}: {on:.0f} µs/step reused, {off:.0f} µs/step not; {share:.0%} of "
                f"{per_step:.0f} op calls/step ran prepared")
        rows.append(Row(SECTION, label, "µs/step", on, off,
                        "the same loop, --reuse-op-calls=false", lower_is_better=True,
                        note=f"{share:.0%} of its {per_step:.0f} op calls/step ran prepared"))
    return rows


if __name__ == "__main__":
    standalone(run, __doc__.splitlines()[0])
