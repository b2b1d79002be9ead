"""Run Claude Code (`claude -p`) against the gateway, inside a loopback-only network namespace.

    unshare -n python tests/clients/claude_code_run.py OUT.json MODE "PROMPT"

``llama``: the gateway in front of a real llama.cpp server with the tiny model, Claude Code in
``--bare`` mode with no tools. Every other mode puts the gateway in front of the scripted stub
(tests/stub_upstream.py) and runs Claude Code in its full (non-bare) mode, so its requests carry
its usual ``role: "system"`` turns, tools (deferred ones behind ``ToolSearch``), thinking,
context_management, output_config, metadata and cache_control. The work directory holds
``hello.txt`` (``FILE_TEXT``) and ``doc.pdf`` (``PDF_LINES``, one page).

``tool``       alias ``tiny-demo`` (``ANTHROPIC_MODEL``) -> the stub's ``cc-tool``: a Read of
               hello.txt, then an answer holding the file's text.
``explore``    ``tiny-demo`` -> ``agent:Agent``: one Agent call starting an Explore subagent
               in the foreground with ``model: "haiku"`` (2.1.332's Explore inherits the main
               model unless asked for a tier); ``claude-*`` -> ``cc-tool`` on hello.txt, which
               serves the subagent's requests (named for Claude Code's own haiku id); the main
               model then answers with the subagent's report.
``limited``    ``--bare``, no tools; Claude Code's key is a client's with requests_per_minute =
               60, and the recorder spends that bucket just before Claude Code's first
               Messages request goes on: it is refused (429, retry-after 1) and Claude Code's
               own retry (CLAUDE_CODE_MAX_RETRIES 3 here) must get through.
``budget``     as ``limited``, the client's limit a ``tokens_per_day`` of 20: the recorder's
               first request spends it (the stub's reply uses 17), so Claude Code's request
               is refused with 429 ``billing_error``, ``x-should-retry: false`` and the
               unified headers of a spent budget, and it must stop at once (no retry,
               though CLAUDE_CODE_MAX_RETRIES is 3) printing the gateway's message.
``no-model``   no model variable at all; only a ``claude-*`` route -> ``cc-tool`` on hello.txt.
``websearch``  ``tiny-demo`` -> ``cc-steps``: ToolSearch loads the deferred WebSearch tool, then
               WebSearch is called (Claude Code sends a side request whose only tool is the
               ``web_search_20250305`` server tool, which the gateway refuses); then an answer
               holding the last tool result. ``claude-*`` -> ``ok``, in case the side request
               names another model.
``websearch-session``  as ``websearch``, but the gateway has a ``[web_search]`` table naming
               the SearXNG stand-in (tests/searxng_stub.py), so the side request is served:
               the stub model searches and answers citing the first URL it was shown; then
               two more turns with ``--continue`` (``Go on``, ``And then?``) in the same
               session, the search in its history. Output adds ``steps`` (as the sessions
               below) and ``searches``: the requests the SearXNG stand-in received.
``websearch-fail``  one run as ``websearch-session``'s first, the WebSearch query ending in
               ``#fail``: the SearXNG stand-in answers 500.
``webfetch-session``  ``tiny-demo`` -> ``cc-steps``: ToolSearch loads the deferred WebFetch
               tool, then WebFetch is called on ``PAGE_PATH`` of a page server inside the
               namespace (HTTPS on 127.0.0.1: 2.1.332 turns an ``http:`` URL into ``https:``
               before it fetches; its certificate signed by a throwaway CA that Claude Code
               trusts through ``NODE_EXTRA_CA_CERTS``) with ``FETCH_PROMPT``. The user settings
               carry ``skipWebFetchPreflight: true``: else Claude Code first asks
               api.anthropic.com's ``/api/web/domain_info`` for the host, which fails offline
               and fails the fetch. Claude Code fetches the page itself, then hands its text
               and the prompt to the small, fast model in a side request (``claude-*`` ->
               ``ok``); its answer is WebFetch's result, which the main model quotes. Then
               ``Go on`` and ``And then?`` with ``--continue``, as ``websearch-session``.
               Output adds ``pages``: the requests the page server received (path,
               user agent), and ``page_url``.
``webfetch-preflight``  one run as ``webfetch-session``'s first, without
               ``skipWebFetchPreflight``: the domain lookup fails offline, so does the fetch.
``pdf``        ``tiny-demo`` -> ``cc-tool`` on doc.pdf.
``think``      ``tiny-demo`` -> ``think-tool:Read``: reasoning with each turn (``REASONING_<n>``).
``llama-resume``  ``llama``'s turn, then ``Go on`` with ``--continue``: each step's result
               has the engine's usage (``cache_read_input_tokens``: the prompt it reused).
``resume``     ``think``'s turn (reasoning, Read, answer), then ``Go on`` with ``--continue``:
               the resumed session's first request must extend the last one's prompt.
``think-updates``  the same, with ``thinking.display: "updates"`` forced through
               ``CLAUDE_CODE_EXTRA_BODY`` (2.1.332 sends ``omitted`` unless an experiment is on).

Local engines without their parsers (the stub's ``LocalEngine`` scenarios), on hello.txt:

``text-tool``     ``tiny-demo`` -> ``text-tool``: the Read call written as text in content.
``broken-args``   ``tiny-demo`` -> ``broken-args``: a Read call with non-JSON arguments.
``inline-think``  ``tiny-demo`` -> ``inline-think``: ``<think>`` in content, then a text call.

Sessions (persisted; one ``claude -p`` per step, in the same work and home directories),
``tiny-demo`` and ``claude-*`` -> the stub's ``chat``:

``compact``         PROMPT; ``/compact`` with ``--continue``; ``Go on`` with ``--continue``.
``compact-effort``  the same, with ``CLAUDE_CODE_MODEL_CAPABILITIES=per_turn_effort``: only
                    for a model with that capability does 2.1.332 send the beta
                    ``per-turn-control-2026-07-01`` and put ``output_config`` on its
                    ``role: "system"`` turns (``tiny-demo`` is not a model it knows).
``compact-bare``    as ``compact-effort``, each step with ``--bare``: the ``output_config``
                    then rides on a control entry, ``{"role":"system","content":[],...}``.
Their output adds ``steps``: per step its arguments, exit code, result and stderr tail, and
``first_request``, the index in ``client_requests`` of its first request.

Claude Code talks to the gateway through a recording pass-through proxy (bytes relayed as
they come), so a test sees what Claude Code itself sent: model names, thinking, tools.
Writes one JSON object to OUT.json: exit code (None if Claude Code hung and was killed),
Claude Code's JSON result, the requests it sent (``client_requests``; a request carrying a
web search tool also keeps the reply it got, as text: ``response``), the gateway's
access-log lines and (stub modes) the requests the stub received.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gateway.http.managed_settings import TELEMETRY_ENV  # noqa: E402
from tests.conftest import llama_config  # noqa: E402
from tests.logs import access_lines  # noqa: E402
from tests.otlp_collector import Collector  # noqa: E402
from tests.pdfs import make_pdf  # noqa: E402
from tests.procs import Proc, free_port, start_gateway, wait_http  # noqa: E402

# CLAUDE_CODE_BIN: another Claude Code binary (an older version, e.g. 2.1.197's native one)
CLAUDE = Path(
    os.environ.get("CLAUDE_CODE_BIN")
    or REPO / "tests" / "clients" / "node_modules" / ".bin" / "claude"
)
FILE_TEXT = "hello from the file 42"
PDF_LINES = ["Quarterly report of the PDF 77", "Revenue rose by 12 percent."]
MODEL = "tiny-demo"
EXPLORE_PROMPT = "Read hello.txt and report what it says."
LOCAL_MODES = ("text-tool", "broken-args", "inline-think")
SESSION_MODES = ("compact", "compact-effort", "compact-bare")
WEBSEARCH_SESSION = "websearch-session"
RESUME = "resume"
LLAMA_RESUME = "llama-resume"
WEBSEARCH_MODES = ("websearch", WEBSEARCH_SESSION, "websearch-fail")
WEBFETCH_SESSION = "webfetch-session"
WEBFETCH_MODES = (WEBFETCH_SESSION, "webfetch-preflight")
PAGE_PATH = "/notes/release.html"
PAGE_SENTENCE = "The heron release ships on the ninth of Quintember."
PAGE_HTML = f"""<!doctype html>
<html><head><title>Release notes</title></head>
<body><h1>Release notes</h1><p>{PAGE_SENTENCE}</p><p>Nothing else changed.</p></body></html>
"""
FETCH_PROMPT = "When does the heron release ship?"
LIMITED_CLIENT = """
[[clients]]
name = "cc"
key_env = "CC_KEY"
requests_per_minute = 60
"""
BUDGET_CLIENT = """
[[clients]]
name = "cc"
key_env = "CC_KEY"
tokens_per_day = 20
"""
SPENDING = ("limited", "budget")


def _steps(mode: str, prompt: str, args: list[str]) -> list[list[str]]:
    """The ``claude`` argument lists to run, in order: one for a single-run mode."""
    out = ["--output-format", "json"]
    if mode in (RESUME, LLAMA_RESUME):
        return [["-p", prompt, *args, *out], ["-p", "Go on", "--continue", *args, *out]]
    if mode in (WEBSEARCH_SESSION, WEBFETCH_SESSION):
        return [
            ["-p", prompt, *args, *out],
            ["-p", "Go on", "--continue", *args, *out],
            ["-p", "And then?", "--continue", *args, *out],
        ]
    if mode not in SESSION_MODES:
        return [["-p", prompt, *args, *out, "--no-session-persistence"]]
    bare = ["--bare"] if mode == "compact-bare" else []
    return [
        ["-p", prompt, *args, *bare, *out],
        ["-p", "/compact", "--continue", *args, *bare, *out],
        ["-p", "Go on", "--continue", *args, *bare, *out],
    ]


_HOP_BY_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


class Recorder:
    """A pass-through proxy in front of the gateway, on its own thread and event loop, that
    keeps each request's method, path and JSON body and relays the reply as it comes."""

    def __init__(self, target: str, spend_first: bool = False, keep_if: str = "") -> None:
        self.target = target
        self._keep_if = keep_if  # a request whose body holds this text keeps its reply too
        self.requests: list[dict] = []
        # ``limited`` mode: before Claude Code's first Messages request goes on, spend its
        # client's requests_per_minute bucket, so that request is refused (429)
        self._spend_first = spend_first
        self.spent = 0
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the recording proxy did not start")

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        started.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _spend(self, headers: dict[str, str]) -> None:
        body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        for _ in range(200):
            async with self._session.post(
                self.target + "/llm/v1/messages",
                json=body,
                headers={"x-api-key": headers.get("x-api-key", "")},
            ) as resp:
                await resp.read()
                if resp.status == 429:
                    return
                self.spent += 1

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self._spend_first and request.method == "POST" and "/v1/messages" in request.path:
            self._spend_first = False
            await self._spend(dict(request.headers))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = {
            "method": request.method,
            "path": request.path_qs,
            "body": body,
            "beta": request.headers.get("anthropic-beta"),
        }
        self.requests.append(record)
        # a web search side request (or one holding keep_if): its reply is kept too (text)
        keep = isinstance(body, dict) and any(
            isinstance(t, dict) and str(t.get("type", "")).startswith("web_search_")
            for t in body.get("tools") or ()
        )
        keep = keep or bool(self._keep_if and self._keep_if in raw.decode("utf-8", "replace"))
        kept: list[bytes] = []
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method, self.target + request.path_qs, data=raw, headers=headers
        ) as up:
            resp = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP},
            )
            await resp.prepare(request)
            async for piece in up.content.iter_any():
                if keep:
                    kept.append(piece)
                await resp.write(piece)
            await resp.write_eof()
            if keep:
                record["response"] = b"".join(kept).decode("utf-8", "replace")
            return resp

    def stop(self) -> None:
        async def close() -> None:
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class PageServer:
    """``PAGE_HTML`` at ``PAGE_PATH`` over HTTPS on 127.0.0.1 (404 elsewhere), on a thread;
    ``requests`` keeps each request's path and user agent."""

    def __init__(self, folder: Path) -> None:
        from tests.certs import make_ca, make_leaf

        self.ca = make_ca(folder / "pki")
        leaf = make_leaf(folder / "pki")
        self.requests: list[dict] = []
        seen = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append({"path": self.path, "user_agent": self.headers.get("User-Agent")})
                found = self.path == PAGE_PATH
                data = PAGE_HTML.encode() if found else b"not found"
                self.send_response(200 if found else 404)
                kind = "text/html; charset=utf-8" if found else "text/plain"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(leaf.cert, leaf.key)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}{PAGE_PATH}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _routes(mode: str, work: Path, page_url: str = "") -> list[tuple[str, str]]:
    """(route name, stub scenario) per ``[[models]]`` entry, in config order."""
    hello, pdf = str(work / "hello.txt"), str(work / "doc.pdf")
    if mode in WEBFETCH_MODES:
        steps = [
            ["ToolSearch", {"query": "select:WebFetch"}],
            ["WebFetch", {"url": page_url, "prompt": FETCH_PROMPT}],
        ]
        return [(MODEL, "cc-steps:" + json.dumps(steps)), ("claude-*", "ok")]
    if mode == "explore":
        call = {
            "description": "Explore the file",
            "prompt": EXPLORE_PROMPT,
            "subagent_type": "Explore",
            "model": "haiku",
            "run_in_background": False,
        }
        return [(MODEL, "agent:Agent:" + json.dumps(call)), ("claude-*", f"cc-tool:{hello}")]
    if mode == "no-model":
        return [("claude-*", f"cc-tool:{hello}")]
    if mode in WEBSEARCH_MODES:
        query = "gateway release notes" + (" #fail" if mode == "websearch-fail" else "")
        steps = [["ToolSearch", {"query": "select:WebSearch"}], ["WebSearch", {"query": query}]]
        return [(MODEL, "cc-steps:" + json.dumps(steps)), ("claude-*", "ok")]
    if mode == "pdf":
        return [(MODEL, f"cc-tool:{pdf}")]
    if mode in ("think", "think-updates", RESUME):
        return [
            (MODEL, "think-tool:Read:" + json.dumps({"file_path": hello})),
            ("claude-*", "chat"),
        ]
    if mode in ("tool", "telemetry"):
        return [(MODEL, f"cc-tool:{hello}")]
    if mode in LOCAL_MODES:
        return [(MODEL, f"{mode}:{hello}")]
    if mode in SESSION_MODES:
        return [(MODEL, "chat"), ("claude-*", "chat")]
    if mode in SPENDING:
        return [(MODEL, "chat"), ("claude-*", "chat")]
    raise SystemExit(f"unknown mode {mode!r}")


def _stub_config(
    stub_url: str, routes: list[tuple[str, str]], searxng_url: str | None = None
) -> str:
    text = f"""
[server]
host = "127.0.0.1"
port = 8080
prefix = "/llm"

[upstreams.stub]
base_url = "{stub_url}/v1"
connect_timeout = 2
header_timeout = 3
idle_timeout = 3
"""
    for name, scenario in routes:  # json.dumps quotes as a TOML basic string does
        text += (
            f'\n[[models]]\nname = {json.dumps(name)}\nupstream = "stub"\n'
            f"upstream_model = {json.dumps(scenario)}\n"
        )
    if searxng_url is not None:
        text += f'\n[web_search]\nsearxng_url = "{searxng_url}"\n'
    return text


def main() -> int:
    out_path, mode, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="cc-"))
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    stopper = []
    collector = None
    if mode == "telemetry":  # a collector for the gateway's OTLP and the OTLP it forwards
        collector = Collector()
        collector.start()
        stopper.append(collector.stop)
    stub_url = searxng_url = None
    searches = None
    pages: PageServer | None = None
    model: str | None = MODEL
    if mode in ("llama", LLAMA_RESUME):
        from gateway.demo.llama import LlamaServer
        from gateway.demo.tinymodel import ensure_model

        model_path, _ = ensure_model(str(tmp / "model"))
        # a resumed session: Claude Code's whole prompt (its tools, its system prompt), as used
        ctx = 131072 if mode == LLAMA_RESUME else 16384
        llama = LlamaServer(model_path, ctx_size=ctx, parallel=1, threads=1, alias="demo")
        cfg = llama_config(llama.start(timeout=60), name=MODEL)
        stopper.append(llama.stop)
        args = ["--max-turns", "8"] if mode == LLAMA_RESUME else ["--bare", "--tools", ""]
    else:
        (work / "hello.txt").write_text(FILE_TEXT + "\n")
        (work / "doc.pdf").write_bytes(make_pdf([PDF_LINES]))
        port = free_port()
        stub = Proc([sys.executable, str(REPO / "tests" / "stub_upstream.py"), str(port)])
        stopper.append(stub.stop)
        wait_http(f"http://127.0.0.1:{port}/health")
        stub_url = f"http://127.0.0.1:{port}"
        if mode in (WEBSEARCH_SESSION, "websearch-fail"):
            sport = free_port()
            searx = Proc([sys.executable, str(REPO / "tests" / "searxng_stub.py"), str(sport)])
            stopper.append(searx.stop)
            wait_http(f"http://127.0.0.1:{sport}/healthz")
            searxng_url = f"http://127.0.0.1:{sport}"
        if mode in WEBFETCH_MODES:
            pages = PageServer(tmp)
            stopper.append(pages.stop)
        if mode == WEBFETCH_SESSION:
            # no preflight: the domain lookup on api.anthropic.com cannot work offline
            (home / ".claude").mkdir()
            settings = {"skipWebFetchPreflight": True}
            (home / ".claude" / "settings.json").write_text(json.dumps(settings))
        page_url = pages.url if pages is not None else ""
        cfg = _stub_config(stub_url, _routes(mode, work, page_url), searxng_url)
        if mode == "limited":  # Claude Code's key is a client's, one request a second
            cfg += LIMITED_CLIENT
        if mode == "budget":  # ... with a daily budget the recorder spends
            cfg += BUDGET_CLIENT
        if mode == "no-model":
            model = None
        if collector is not None:
            cfg += f'\n[telemetry]\notlp_endpoint = "{collector.url}"\nexport_interval = 1\n'
        allowed = "Read,WebSearch" if mode in WEBSEARCH_MODES else "Read"
        if mode in WEBFETCH_MODES:
            allowed = "Read,WebFetch"
        args = ["--allowedTools", allowed, "--max-turns", "4"]
        if mode in SPENDING:
            args = ["--bare", "--tools", ""]
    # the thinking-signature key lives in the gateway's state directory: keep it in tmp
    gateway, url = start_gateway(
        cfg, tmp, env={"STATE_DIRECTORY": str(tmp / "state"), "CC_KEY": "test-key"}
    )
    recorder = Recorder(
        url, spend_first=mode in SPENDING, keep_if=PAGE_SENTENCE if pages is not None else ""
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{recorder.port}/llm",
        "ANTHROPIC_API_KEY": "test-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    if model is not None:
        env["ANTHROPIC_MODEL"] = model
    if pages is not None:  # the page server's certificate: signed by this CA
        env["NODE_EXTRA_CA_CERTS"] = str(pages.ca)
        # the small, fast model (its side request): else it is the main model, tiny-demo
        env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = "claude-haiku-4-5"
    if mode in SPENDING:  # its own retry, honouring retry-after (none for a spent budget)
        env["CLAUDE_CODE_MAX_RETRIES"] = "3"
    if collector is not None:  # what the gateway's managed settings push (docs/telemetry.md)
        del env["DISABLE_TELEMETRY"]
        env.update(TELEMETRY_ENV)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"{url}/llm"
        env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        env["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"
        env["OTEL_LOGS_EXPORT_INTERVAL"] = "200"
    if mode in ("compact-effort", "compact-bare"):  # a model that takes per-turn effort
        env["CLAUDE_CODE_MODEL_CAPABILITIES"] = "per_turn_effort"
    if mode == "think-updates":  # what 2.1.332 sends when its connector-text experiment is on
        env["CLAUDE_CODE_EXTRA_BODY"] = json.dumps(
            {"thinking": {"type": "adaptive", "display": "updates"}}
        )
    seen = None
    steps = []
    try:
        for step in _steps(mode, prompt, args):
            first_request = len(recorder.requests)
            claude = subprocess.Popen(
                [str(CLAUDE), *step],
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:  # a hung run still reports what it sent (exit_code None)
                stdout, stderr = claude.communicate(
                    timeout=150 if mode in ("llama", LLAMA_RESUME) else 90
                )
            except subprocess.TimeoutExpired:
                claude.kill()
                stdout, stderr = claude.communicate()
                stderr += "\n[claude_code_run: Claude Code timed out and was killed]"
            exit_code = None if claude.returncode < 0 else claude.returncode
            result = None
            for line in stdout.splitlines():
                if line.startswith("{"):
                    result = json.loads(line)
            steps.append(
                {
                    "args": step,
                    "exit_code": exit_code,
                    "result": result,
                    "stdout": stdout[-2000:],
                    "stderr": stderr[-2000:],
                    "first_request": first_request,
                }
            )
            if exit_code != 0:
                break
        if stub_url:
            with urllib.request.urlopen(stub_url + "/_requests", timeout=5) as resp:
                seen = json.loads(resp.read())
        if searxng_url:
            with urllib.request.urlopen(searxng_url + "/_requests", timeout=5) as resp:
                searches = json.loads(resp.read())
    finally:
        recorder.stop()
        gateway.stop()
        for stop in stopper:
            stop()
    spans = []
    if collector is not None:  # the gateway's spans flushed as it stopped
        spans = [vars(span) for span in collector.spans()]
    access = access_lines(gateway.output())
    shutil.rmtree(tmp, ignore_errors=True)
    Path(out_path).write_text(
        json.dumps(
            {
                "exit_code": exit_code,
                "result": result,
                "stdout": stdout[-2000:],
                "stderr": stderr[-2000:],
                "access": access,
                "upstream_requests": seen,
                "client_requests": recorder.requests,
                "file_path": str(work / "hello.txt"),
                "file_text": FILE_TEXT,
                "pdf_path": str(work / "doc.pdf"),
                "pdf_lines": PDF_LINES,
                "explore_prompt": EXPLORE_PROMPT,
                "steps": steps,
                "searches": searches,
                "pages": pages.requests if pages is not None else None,
                "page_url": pages.url if pages is not None else None,
                "page_sentence": PAGE_SENTENCE,
                "fetch_prompt": FETCH_PROMPT,
                "spent": recorder.spent,
                "spans": spans,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
