#!/usr/bin/env python3
"""Process start → first complete `tools/list` answer, for MCP servers over stdio.

Each run spawns the server, sends `initialize`, `notifications/initialized` and
`tools/list`, and stops the clock when the `tools/list` response has arrived (every
tool in it). Standard library only.

    python3 scripts/bench_mcp_startup.py                       # loadout only
    python3 scripts/bench_mcp_startup.py --runs 30 \\
        --catalog ../shared/eval/catalog \\
        --everything "npx -y @modelcontextprotocol/server-everything"

LOADOUT_BIN overrides the binary (default: target/release/loadout, else target/debug/loadout).
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def default_bin() -> str:
    if os.environ.get("LOADOUT_BIN"):
        return os.environ["LOADOUT_BIN"]
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "loadout"
        if candidate.exists():
            return str(candidate)
    raise SystemExit("no loadout binary: build it or set LOADOUT_BIN")


def one_run(command: list[str], env: dict) -> tuple[float, int]:
    """Seconds from spawn to the tools/list answer, and the number of tools."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert process.stdin and process.stdout

    def send(message: dict) -> None:
        process.stdin.write((json.dumps(message) + "\n").encode())
        process.stdin.flush()

    def answer(request_id: int) -> dict:
        while True:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"{command[0]} exited before answering")
            message = json.loads(line)
            if message.get("id") == request_id:
                return message

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}})
        answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = answer(2)["result"]["tools"]
        elapsed = time.perf_counter() - started
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return elapsed, len(tools)


def bench(label: str, command: list[str], env: dict, runs: int) -> None:
    one_run(command, env)  # warm the page cache (and npx's)
    times = []
    n_tools = 0
    for _ in range(runs):
        elapsed, n_tools = one_run(command, env)
        times.append(elapsed * 1000)
    times.sort()
    p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
    print(f"{label:<44} {n_tools:>5} tools  median {statistics.median(times):8.1f} ms"
          f"  p90 {p90:8.1f} ms  min {times[0]:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--catalog", help="toolkit directory to also load (e.g. ../shared/eval/catalog)")
    parser.add_argument("--everything", help="command line of another server to compare, e.g. "
                        "'npx -y @modelcontextprotocol/server-everything'")
    args = parser.parse_args()
    binary = default_bin()
    with tempfile.TemporaryDirectory() as data_dir:
        env = dict(os.environ, LOADOUT_DATA_DIR=data_dir)
        env.pop("LOADOUT_DATABASE_URL", None)
        print(f"binary: {binary}")
        bench("loadout mcp", [binary, "mcp"], env, args.runs)
        if args.catalog:
            bench("loadout mcp --catalog", [binary, "mcp", "--catalog", args.catalog], env, args.runs)
        if args.everything:
            bench(args.everything, shlex.split(args.everything), dict(os.environ), args.runs)


if __name__ == "__main__":
    main()
