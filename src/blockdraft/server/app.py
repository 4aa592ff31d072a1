"""FastAPI app: /v1/completions, /v1/chat/completions (+SSE), /v1/models, /health, /metrics.

Validation happens before anything reaches the engine; a client that drops a
stream aborts its request (its cache blocks go back to the pool); shutdown aborts
whatever is still running.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..errors import BlockdraftError
from ..llm import LLM
from ..tokenizer import TextStream
from .driver import AsyncEngine
from .metrics import ServerMetrics
from .protocol import ApiError, chat_messages, check_fields, completion_prompt, sampling_params


def startup_line(llm: LLM, host: str, port: int) -> str:
    """What `serve` prints once it is ready: where, what, in which numerics, and how much."""
    n, plan = llm.numerics, llm.engine.plan
    numerics = n["dtype"] + ("" if n["quantization"] == "none" else f" {n['quantization']} weights")
    numerics += ", row-invariant" if n["row_invariant"] else ""
    drafter = "none" if llm.drafter is None else f"{llm.drafter.config.kind} ({llm.models.drafter_dir})"
    return (f"blockdraft serving http://{host}:{port}/v1 | target {llm.models.target_dir} | drafter {drafter} | "
            f"{numerics} | device {n['device']} | max batch {llm.max_batch} | cache {plan.total_bytes / 2**20:.0f} MiB "
            f"({plan.num_blocks} pages of {plan.page_size} tokens) | context {llm.max_model_len}")


def build_app(llm: LLM, model_name: str = "blockdraft", api_key: str | None = None,
              default_max_tokens: int = 16) -> FastAPI:
    metrics = ServerMetrics(max_al=(llm.drafter.config.num_draft_tokens + 1) if llm.drafter else 1)
    metrics.observe_prefix_caching(getattr(llm.engine, "prefix_caching_off", None))
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        driver = state["driver"] = AsyncEngine(llm.engine)
        driver.start()
        yield
        await driver.stop()

    app = FastAPI(title="blockdraft", lifespan=lifespan)
    tok = llm.tokenizer

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        metrics.requests.labels(endpoint=request.url.path, status=str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status)

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                metrics.requests.labels(endpoint=request.url.path, status="401").inc()
                return JSONResponse(ApiError(401, "invalid API key", None, "authentication_error",
                                             "invalid_api_key").body(), status_code=401)
        return await call_next(request)

    async def parse(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"malformed JSON body: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model is None:
            raise ApiError(400, "'model' is required", "model")
        if model != model_name:
            raise ApiError(404, f"model {model!r} not found (serving {model_name!r})", "model", "invalid_request_error",
                           "model_not_found")
        return body

    async def admit(prompt_ids: list[int], params):
        try:                      # the engine's admission checks the prompt, context and budget
            return await state["driver"].add(prompt_ids, params)
        except BlockdraftError as e:
            raise ApiError(400, str(e), getattr(e, "field", None) or "prompt") from None

    def spec_stats(out) -> dict:
        al = out.acceptance_lengths
        return {"acceptance_lengths": al, "mean_acceptance_length": sum(al) / len(al) if al else 0.0,
                "drafted": out.drafted, "accepted": out.accepted}

    def usage(prompt_ids, out) -> dict:
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out.token_ids),
                "total_tokens": len(prompt_ids) + len(out.token_ids)}

    def finished(endpoint: str, out, started: float) -> None:
        metrics.requests.labels(endpoint=endpoint, status="200").inc()
        metrics.latency.observe(time.perf_counter() - started)
        metrics.ttft.observe(out.prefill_s)
        metrics.generated.inc(len(out.token_ids))
        for a in out.acceptance_lengths:
            metrics.acceptance.observe(a)

    async def run(request: Request, endpoint: str, chat: bool):
        started = time.perf_counter()
        body = await parse(request)
        check_fields(body, chat)
        params = sampling_params(body, default_max_tokens)
        if chat:
            if tok is None:
                raise ApiError(400, "this model has no tokenizer; chat needs one", "messages")
            try:
                prompt_ids = tok.encode_chat(chat_messages(body))
            except BlockdraftError as e:
                raise ApiError(400, str(e), "messages") from None
        else:
            prompt = completion_prompt(body)
            if isinstance(prompt, str) and tok is None:
                raise ApiError(400, "this model has no tokenizer; send token ids", "prompt")
            prompt_ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
        stream = await admit(prompt_ids, params)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        text = TextStream(tok.decode if tok else None, params.stop)
        created = int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(sse(stream, rid, created, chat, text, prompt_ids, include_usage, endpoint,
                                         started), media_type="text/event-stream")
        out = None
        while out is None or not out.finished:
            out = await stream.queue.get()
            if isinstance(out, BaseException):
                raise ApiError(500, f"engine error: {out}", None, "server_error")
        finished(endpoint, out, started)
        content = text.text(out.token_ids)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if chat else
                  {"index": 0, "text": content, "logprobs": None})
        choice["finish_reason"] = out.finish_reason
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model_name, "choices": [choice], "usage": usage(prompt_ids, out),
                "blockdraft": spec_stats(out)}

    async def sse(stream, rid, created, chat, text, prompt_ids, include_usage, endpoint, started):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish, first=False, extra=None) -> str:
            if chat:
                d = {"role": "assistant", "content": delta} if first else ({"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            payload = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice]}
            payload.update(extra or {})
            return f"data: {json.dumps(payload)}\n\n"

        done = False
        try:
            if chat:
                yield chunk("", None, first=True)
            out = None
            while out is None or not out.finished:
                out = await stream.queue.get()
                if isinstance(out, BaseException):
                    yield f"data: {json.dumps(ApiError(500, f'engine error: {out}', None, 'server_error').body())}\n\n"
                    return
                delta = text.delta(out.token_ids, out.finished)
                if delta or out.finished:
                    yield chunk(delta, out.finish_reason if out.finished else None,
                                extra={"blockdraft": spec_stats(out)} if out.finished else None)
            done = True
            finished(endpoint, out, started)
            if include_usage:
                payload = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [],
                           "usage": usage(prompt_ids, out)}
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # client went away (or the stream broke): free its cache now
                metrics.requests.labels(endpoint=endpoint, status="499").inc()
                await state["driver"].abort(stream.request_id)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await run(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await run(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "blockdraft"}]}

    @app.get("/health")
    async def health():
        driver = state.get("driver")
        if driver is None or driver.task is None or driver.task.done():
            return JSONResponse({"status": "error", "detail": "the engine loop is not running"}, 503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        metrics.observe_engine(llm.engine.stats)
        return PlainTextResponse(generate_latest(metrics.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    return app
