"""`loadout mcp` driven by the official Python MCP SDK (`pip install mcp pytest`).

Over stdio and over streamable HTTP, with the SDK's default negotiation (`auto`:
`server/discover`, the 2026-07-28 protocol) and with the `initialize` handshake
(`legacy`): list, call, invalid arguments, unknown tool, not configured →
`set_setting` refused for the operator's key → the CLI sets it → works; dynamic mode
over HTTP.

The binary comes from `LOADOUT_BIN` (default: `target/debug/loadout` in the repo):

    LOADOUT_BIN=target/debug/loadout python -m pytest -q tests/python
"""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from mcp import Client, MCPError, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("LOADOUT_BIN") or str(REPO / "target" / "debug" / "loadout")
TIMEOUT = 30


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


@contextlib.contextmanager
def http_server(data_dir: str, *extra: str):
    """Starts `loadout mcp --http 127.0.0.1:0` and yields its URL."""
    env = dict(os.environ, LOADOUT_DATA_DIR=data_dir)
    env.pop("LOADOUT_DATABASE_URL", None)
    process = subprocess.Popen(
        [BIN, "mcp", "--http", "127.0.0.1:0", *extra],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        assert process.stderr is not None
        for line in process.stderr:
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, "loadout mcp --http printed no address"
        # Keep draining stderr so the server never blocks on a full pipe.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def server_target(transport: str, data_dir: str, *extra: str):
    if transport == "stdio":
        env = {"LOADOUT_DATA_DIR": data_dir}
        yield StdioServerParameters(command=BIN, args=["mcp", *extra], env=env)
    else:
        with http_server(data_dir, *extra) as url:
            yield url


TRANSPORTS = ["stdio", "http"]
MODES = ["auto", "legacy"]


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_list_call_errors_and_configuration(transport, mode, data_dir):
    files = tempfile.mkdtemp()
    note = Path(files) / "note.txt"
    note.write_text("hello from python")

    async def scenario():
        with server_target(transport, data_dir) as target:
            async with Client(target, mode=mode, read_timeout_seconds=TIMEOUT) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                for name in ["calculate", "query_data", "read_file", "set_setting"]:
                    assert name in tools, f"{name} not listed"
                    assert tools[name].input_schema.get("type") == "object"

                result = await client.call_tool("calculate", {"expression": "6 * 7"})
                assert not result.is_error, text_of(result)
                assert "42" in text_of(result)

                with pytest.raises(MCPError) as invalid:
                    await client.call_tool("calculate", {"expression": 12})
                assert invalid.value.code == -32602
                assert "`expression`" in invalid.value.error.message

                with pytest.raises(MCPError) as unknown:
                    await client.call_tool("no_such_tool", {})
                assert unknown.value.code == -32602
                assert "no_such_tool" in unknown.value.error.message

                result = await client.call_tool("read_file", {"path": str(note)})
                assert result.is_error
                assert "filesystem_roots" in text_of(result)
                assert "loadout settings set" in text_of(result)

                # The roots are the operator's: the model's tool is refused, the
                # CLI's write reaches the running server.
                result = await client.call_tool(
                    "set_setting", {"key": "filesystem_roots", "value": json.dumps([files])}
                )
                assert result.is_error
                assert "set by the operator" in text_of(result)
                env = dict(os.environ, LOADOUT_DATA_DIR=data_dir)
                env.pop("LOADOUT_DATABASE_URL", None)
                subprocess.run(
                    [BIN, "settings", "set", "filesystem_roots", json.dumps([files])],
                    env=env,
                    check=True,
                    capture_output=True,
                )
                result = await client.call_tool("read_file", {"path": str(note)})
                assert not result.is_error, text_of(result)
                assert "hello from python" in text_of(result)

    asyncio.run(asyncio.wait_for(scenario(), 120))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dynamic_mode_loads_tools(transport, data_dir):
    async def scenario():
        with server_target(transport, data_dir, "--dynamic") as target:
            async with Client(target, read_timeout_seconds=TIMEOUT) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert {"search_tools", "load_tools", "unload_tools", "calculate"} <= names
                assert "read_file" not in names

                found = await client.call_tool("search_tools", {"query": "read a file"})
                assert "read_file" in text_of(found)

                loaded = await client.call_tool("load_tools", {"names": ["filesystem"]})
                assert not loaded.is_error, text_of(loaded)
                names = {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}
                assert "read_file" in names

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_audit_log_records_python_calls(data_dir):
    async def scenario():
        with server_target("stdio", data_dir) as target:
            async with Client(target, read_timeout_seconds=TIMEOUT) as client:
                await client.call_tool("calculate", {"expression": "1 + 1"})

    asyncio.run(asyncio.wait_for(scenario(), 60))
    env = dict(os.environ, LOADOUT_DATA_DIR=data_dir)
    output = subprocess.run(
        [BIN, "audit", "--json"], env=env, capture_output=True, text=True, check=True
    )
    rows = [json.loads(line) for line in output.stdout.splitlines()]
    assert [(r["tool"], r["outcome"]) for r in rows] == [("calculate", "ok")]


def test_real_upstream_server_becomes_a_domain(data_dir):
    """`mcp-server-time` (installed by name from the package index) as an upstream:
    its tools are imported under `time__*`, validated and forwarded."""
    pytest.importorskip("mcp_server_time")
    import sys

    Path(data_dir, "loadout.toml").write_text(
        "[servers.time]\n"
        f"command = {json.dumps(sys.executable)}\n"
        'args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n'
        'keywords = ["time zone", "convert time"]\n'
    )

    async def scenario():
        with server_target("stdio", data_dir) as target:
            async with Client(target, read_timeout_seconds=TIMEOUT) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert "time__get_current_time" in tools, sorted(tools)
                result = await client.call_tool(
                    "time__get_current_time", {"timezone": "Asia/Seoul"}
                )
                assert not result.is_error, text_of(result)
                assert "Asia/Seoul" in text_of(result)
                with pytest.raises(MCPError) as invalid:
                    await client.call_tool("time__get_current_time", {"timezone": 9})
                assert invalid.value.code == -32602

    asyncio.run(asyncio.wait_for(scenario(), 120))
