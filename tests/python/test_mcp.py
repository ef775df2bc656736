"""`loadout mcp` driven by the official Python MCP SDK (`pip install mcp pytest`).

Over stdio and over streamable HTTP, with the SDK's default negotiation (`auto`:
`server/discover`, the 2026-07-28 protocol) and with the `initialize` handshake
(`legacy`): list, call, invalid arguments (a tool result naming the field), unknown
tool, not configured → `set_setting` refused for the operator's key → the CLI sets it
→ works; dynamic mode (a constant list, tools found with `search_tools` and run with
`call_tool`), `--max-tools`, `--domains` and `/mcp/domains/a,b`; an upstream server's
image passed through; and, on raw pipes and HTTP requests (no SDK sends them),
malformed input answered as JSON-RPC says.

The binary comes from `LOADOUT_BIN` (default: `target/debug/loadout` in the repo):

    LOADOUT_BIN=target/debug/loadout python -m pytest -q tests/python
"""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
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

                # Invalid arguments: a result the model reads, naming the field (SEP-1303).
                invalid = await client.call_tool("calculate", {"expression": 12})
                assert invalid.is_error
                assert "`expression`" in text_of(invalid)

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


def structured(result) -> dict:
    assert not result.is_error, text_of(result)
    return result.structured_content or json.loads(text_of(result))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dynamic_mode_reaches_every_tool_without_relisting(transport, mode, data_dir):
    """A client that lists once (as claude.ai and Claude Desktop do) finds a tool with
    search_tools and runs it with call_tool; the list is the same before and after."""

    async def scenario():
        with server_target(transport, data_dir, "--dynamic") as target:
            async with Client(target, mode=mode, read_timeout_seconds=TIMEOUT) as client:
                before = [t.name for t in (await client.list_tools()).tools]
                assert before[:2] == ["search_tools", "call_tool"], before
                assert "calculate" in before and "read_file" not in before
                assert "load_tools" not in before
                assert "call_tool" in (client.instructions or "")

                found = structured(
                    await client.call_tool("search_tools", {"query": "remember a fact about me"})
                )
                hit = next(r for r in found["results"] if r["name"] == "remember")
                assert hit["inputSchema"]["properties"]["content"]["type"] == "string"
                assert hit["configured"] is True and hit["needs_settings"] == []

                stored = await client.call_tool(
                    "call_tool",
                    {"name": "remember", "arguments": {"content": "Mina likes window seats"}},
                )
                assert not stored.is_error, text_of(stored)
                recalled = await client.call_tool(
                    "call_tool", {"name": "recall", "arguments": {"query": "window seats"}}
                )
                assert "Mina" in text_of(recalled)

                bad = await client.call_tool(
                    "call_tool", {"name": "calculate", "arguments": {"expression": 12}}
                )
                assert bad.is_error and "`expression`" in text_of(bad)
                unknown = await client.call_tool("call_tool", {"name": "no_such_tool"})
                assert unknown.is_error and "search_tools" in text_of(unknown)

                after = [t.name for t in (await client.list_tools(cache_mode="refresh")).tools]
                assert after == before

    asyncio.run(asyncio.wait_for(scenario(), 120))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_max_tools_and_domains_hold(transport, data_dir):
    async def names(*extra):
        with server_target(transport, data_dir, *extra) as target:
            async with Client(target, read_timeout_seconds=TIMEOUT) as client:
                return [t.name for t in (await client.list_tools()).tools]

    async def scenario():
        every = await names()
        assert "search_tools" not in every and "call_tool" not in every
        assert await names("--max-tools", "1000") == every
        limited = await names("--max-tools", "12")
        assert len(limited) <= 12 and limited[:2] == ["search_tools", "call_tool"]
        memory = await names("--domains", "memory")
        assert "recall" in memory and "calculate" in memory
        assert "read_file" not in memory and "create_table" not in memory

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_domain_set_endpoint_over_http(data_dir):
    async def scenario():
        with http_server(data_dir) as url:
            async with Client(f"{url}/domains/memory", read_timeout_seconds=TIMEOUT) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert "recall" in names and "read_file" not in names
                with pytest.raises(MCPError) as unknown:
                    await client.call_tool("read_file", {"path": "/x"})
                assert unknown.value.code == -32602
            status, body = post(f"{url}/domains/memory,calendar", INITIALIZE)
            assert status == 404
            assert "`calendar`" in body["error"]["message"], body

    asyncio.run(asyncio.wait_for(scenario(), 120))


INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
)


def post(url: str, body: str):
    """One raw POST: status and JSON body."""
    request = urllib.request.Request(
        url,
        data=body.encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        assert error.headers.get("content-type", "").startswith("application/json")
        return error.code, json.loads(error.read())


def test_malformed_input_gets_json_rpc_errors(data_dir):
    # HTTP: 400 with a JSON-RPC error, id null when unknown.
    with http_server(data_dir) as url:
        status, body = post(url, "{bad")
        assert (status, body["error"]["code"], body["id"]) == (400, -32700, None), body
        status, body = post(url, '{"jsonrpc":"2.0","id":5}')
        assert (status, body["error"]["code"], body["id"]) == (400, -32600, 5), body

    # stdio: a reply line for each bad line, the server still serving.
    env = dict(os.environ, LOADOUT_DATA_DIR=data_dir)
    env.pop("LOADOUT_DATABASE_URL", None)
    process = subprocess.Popen(
        [BIN, "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:

        def exchange(line: str) -> dict:
            process.stdin.write(line + "\n")
            process.stdin.flush()
            return json.loads(process.stdout.readline())

        reply = exchange("{bad")
        assert (reply["error"]["code"], reply["id"]) == (-32700, None), reply
        assert "result" in exchange(INITIALIZE)
        process.stdin.write('{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        for i, params in enumerate(
            [None, {}, {"name": 5}, {"name": "calculate", "arguments": "1+1"}]
        ):
            reply = exchange(
                json.dumps({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": params})
            )
            assert (reply["id"], reply["error"]["code"]) == (10 + i, -32602), reply
        huge = '{"jsonrpc":"2.0","id":30,"method":"ping","params":{"x":"' + "y" * (17 << 20) + '"}}'
        reply = exchange(huge)
        assert (reply["id"], reply["error"]["code"]) == (30, -32600), reply
        reply = exchange('{"jsonrpc":"2.0","id":31,"method":"ping"}')
        assert reply == {"jsonrpc": "2.0", "id": 31, "result": {}}
    finally:
        process.stdin.close()
        process.wait(timeout=10)


def test_an_upstream_image_passes_through(data_dir):
    """The fake upstream's `draw` answers with an image, audio, a resource link, an
    embedded resource and structured content: the client gets them as sent."""
    sys.path.insert(0, str(Path(__file__).parent))
    import fake_upstream

    Path(data_dir, "loadout.toml").write_text(
        "[servers.fake]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(Path(__file__).parent / 'fake_upstream.py'))}]\n"
    )

    async def scenario():
        with server_target("stdio", data_dir, "--dynamic") as target:
            async with Client(target, read_timeout_seconds=TIMEOUT) as client:
                for name, args in [("fake__draw", {}), ("call_tool", {"name": "fake__draw"})]:
                    result = await client.call_tool(name, args)
                    assert not result.is_error, text_of(result)
                    content = [
                        c.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for c in result.content
                    ]
                    assert content == fake_upstream.DRAWING["content"]
                    assert result.structured_content == fake_upstream.DRAWING["structuredContent"]

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
                invalid = await client.call_tool("time__get_current_time", {"timezone": 9})
                assert invalid.is_error and "`timezone`" in text_of(invalid)

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_closing_an_http_session_logs_no_warning(data_dir, caplog):
    """Issue 32: `DELETE /mcp` answered 202, and the SDK logged "Session termination
    failed: 202" on every close (it takes 200 and 204)."""

    async def scenario():
        with http_server(data_dir) as url:
            async with Client(url, mode="legacy", read_timeout_seconds=TIMEOUT) as client:
                await client.list_tools()

    with caplog.at_level("DEBUG"):
        asyncio.run(asyncio.wait_for(scenario(), 60))
    failures = [r.getMessage() for r in caplog.records if "termination failed" in r.getMessage()]
    assert not failures, failures
