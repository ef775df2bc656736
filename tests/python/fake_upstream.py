#!/usr/bin/env python3
"""A minimal MCP server over stdio (standard library only), used as an upstream
server in Loadout's tests.

Tools: `echo(text)`; `grow()` adds a tool `extra` and sends
`notifications/tools/list_changed`; `crash()` exits the process at once; `draw()`
answers with every kind of content block (image, audio, resource link, embedded
resource, text with annotations) and structured content, as `DRAWING`, which
tests compare with what Loadout passes on. Every start
appends a line to the file named by FAKE_UPSTREAM_LOG, so tests can count restarts.
"""

import json
import os
import sys

TOOLS = {
    "echo": {
        "name": "echo",
        "description": "Echoes the text back. Used by tests.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    "grow": {
        "name": "grow",
        "description": "Adds the tool `extra` and announces the new tool list.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    "crash": {
        "name": "crash",
        "description": "Exits the server process at once.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    "draw": {
        "name": "draw",
        "description": "Draws a one-pixel image and says so in every kind of content.",
        "inputSchema": {"type": "object", "properties": {}},
        "outputSchema": {
            "type": "object",
            "properties": {"width": {"type": "integer"}, "height": {"type": "integer"}},
        },
    },
}
# A 1x1 PNG.
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
DRAWING = {
    "content": [
        {"type": "image", "data": PIXEL, "mimeType": "image/png"},
        {"type": "audio", "data": "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=",
         "mimeType": "audio/wav"},
        {"type": "resource_link", "uri": "file:///drawings/pixel.png", "name": "pixel.png",
         "mimeType": "image/png", "description": "The drawing, as a file."},
        {"type": "resource", "resource": {"uri": "file:///drawings/pixel.txt",
                                          "mimeType": "text/plain", "text": "one black pixel"}},
        {"type": "text", "text": "drew 1x1", "annotations": {"audience": ["user"], "priority": 0.5}},
    ],
    "structuredContent": {"width": 1, "height": 1},
}
EXTRA = {
    "name": "extra",
    "description": "Exists only after `grow`.",
    "inputSchema": {"type": "object", "properties": {}},
}


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main():
    # Real servers announce themselves on stderr; Loadout must keep it out of its
    # own output (it goes to the log at debug level).
    sys.stderr.write("fake-upstream: serving on stdio\n")
    sys.stderr.flush()
    log = os.environ.get("FAKE_UPSTREAM_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"start {os.getpid()}\n")
    tools = dict(TOOLS)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "id" not in message or "method" not in message:
            continue  # a notification or a response
        request_id = message["id"]
        method = message["method"]
        params = message.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "fake-upstream", "version": "1.0.0"},
                "instructions": "A fake upstream server for tests.",
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": list(tools.values())}
        elif method == "tools/call":
            name = params.get("name")
            args = params.get("arguments") or {}
            if name == "crash":
                os._exit(3)
            elif name == "echo":
                result = {"content": [{"type": "text", "text": "echo: " + str(args.get("text"))}]}
            elif name == "grow":
                tools["extra"] = EXTRA
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
                result = {"content": [{"type": "text", "text": "grown"}]}
            elif name == "draw":
                result = DRAWING
            elif name == "extra" and "extra" in tools:
                result = {"content": [{"type": "text", "text": "extra works"}]}
            else:
                send({"jsonrpc": "2.0", "id": request_id,
                      "error": {"code": -32602, "message": f"unknown tool {name}"}})
                continue
        else:
            send({"jsonrpc": "2.0", "id": request_id,
                  "error": {"code": -32601, "message": f"method not found: {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
