"""Generates the fuzzer's seed corpus from real sessions (scripts/fuzz).

Starts flagosd (cpu backend, 2 devices) with --record-client-messages=OUT
on a unix socket and on a loopback TCP port (--insecure-tcp), and runs
tests/fuzz/corpus_workload.py once over each. Over TCP every command
travels on the session stream, copies inline, and every file replays whole
(daemon/protocol/message_recorder.h says how it is rewritten). Over the unix socket
the client moves bytes through its staging region and sends its
synchronous commands (allocate among them) on the sync channel, which the
recorder does not see: those files name the session's segments by their
raw addresses, which a replay refuses, so they seed the commands only
that session sends (staged copies) and the refusals. Each message the
daemon received on a session stream is one file in OUT.

  python3 tests/fuzz/record_corpus.py OUT [--daemon build/bin/flagosd]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from conftest import Daemon  # noqa: E402
from flagos_test_env import free_tcp_port  # noqa: E402

WORKLOAD_TIMEOUT_S = 300


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the corpus directory (created)")
    parser.add_argument("--daemon", type=Path, default=REPO / "build" / "bin" / "flagosd")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tcp = f"127.0.0.1:{free_tcp_port()}"
    with tempfile.TemporaryDirectory(prefix="flagos-corpus-") as work:
        daemon = Daemon(args.daemon, Path(work), cpu_devices=2, device_memory="256MiB",
                        backend="cpu",
                        # Plaintext TCP, on loopback only, must be asked for.
                        extra_args=[f"--listen={tcp}", "--insecure-tcp",
                                    f"--record-client-messages={args.out.resolve()}"])
        daemon.start()
        try:
            for endpoint in (daemon.endpoint, tcp):
                env = dict(os.environ, FLAGOS_ENDPOINT=endpoint,
                           PYTHONPATH=os.pathsep.join(filter(None, [
                               str(REPO / "plugin"), os.environ.get("PYTHONPATH")])))
                run = subprocess.run([sys.executable, str(HERE / "corpus_workload.py")], env=env,
                                     timeout=WORKLOAD_TIMEOUT_S, capture_output=True, text=True)
                if run.returncode != 0:
                    print(f"record_corpus: the workload failed over {endpoint} "
                          f"(exit {run.returncode}):\n{run.stdout}{run.stderr}\n"
                          f"flagosd's log:\n{daemon.log()}", file=sys.stderr)
                    return 1
        finally:
            status = daemon.stop()
        if status != 0:
            print(f"record_corpus: flagosd exited with {status}:\n{daemon.log()}",
                  file=sys.stderr)
            return 1
    files = list(args.out.iterdir())
    if not files:
        print(f"record_corpus: flagosd recorded nothing into {args.out}", file=sys.stderr)
        return 1
    print(f"record_corpus: {len(files)} messages from 2 sessions in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
