"""The Ray Serve application that serves ptopt artifacts over the Open Inference Protocol.

Two deployments per application, built from a manifest (``ptopt_ray.json``, written by
``ptopt package --format ray`` and by ``ptopt serve --engine ray``):

- ``model_<name>`` (one per artifact, ``num_replicas`` or an autoscaling range, ``num_cpus`` each):
  each replica loads the artifact once through the format table (``serve.runtime.ServedModel``) and
  runs what it is sent, one call at a time (a lock: the runtime's threads are the replica's CPUs);
- ``ingress`` (no CPU reserved): the HTTP routes. It reads and checks every request against the
  sidecar's input specs (4xx naming the problem; a bad request never reaches a replica), gathers
  the good ones with Serve's dynamic batching (``@serve.batch``: up to ``max_batch_size`` rows or
  ``batch_wait_ms``) into one call of a model replica, and splits the answers. A model replica that
  dies while answering (killed, out of memory) fails that call with ``RayActorError`` (or, gone
  before the call left, Serve's ``ReplicaUnavailableError``): the ingress
  sends the same batch again, to a replica that is alive (up to ``RETRIES`` times, backing off), so
  the clients of a lost replica get their answer late rather than an error; only when every retry
  fails do they get 503 naming the lost replica. Serve's controller replaces the replica meanwhile.
  Told to drain (``RayServer.stop``, through Ray's key-value store), it answers every new request
  the protocol's JSON 503 and finishes those in flight; no failure is ever Serve's plain-text 500.

Routes (the Open Inference Protocol, KServe v2, as ``tritonclient.http`` calls them; ``serve.oip``):
``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/NAME[/versions/1]`` (metadata),
``.../ready``, ``.../config``, ``POST .../infer``; ``POST /v2/repository/index``; for language models
``POST .../generate`` (Triton's generate extension: ``{"text_input": ..., "parameters":
{"max_tokens": N, "temperature": T, "seed": S}}``; greedy without a temperature or at 0) and ``infer``
with a ``BYTES`` ``text_input`` (the same parameters). No streaming: ``.../generate_stream`` and any
other path under a model answer 404 naming the model's endpoints. Plus the .mar's plain JSON route,
``POST /predictions/NAME`` with ``{"inputs": ...}``, answered as the .mar's handler answers it.

This module imports Ray; the replicas import ptopt (the cluster's Python needs ``ptopt[ray]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from starlette.requests import Request
from starlette.responses import Response

from ptopt.serve import oip
from ptopt.serve.ray_config import GRACEFUL_WAIT_LOOP_S, INGRESS_MAX_ONGOING
from ptopt.serve.ray_package import INGRESS, read_manifest

logger = logging.getLogger("ray.serve")
#: Serve's errors for a model deployment that cannot take a call now (overloaded, no replica): a 503
_UNAVAILABLE = (BackPressureError, DeploymentUnavailableError)
#: a model replica gone: the call died with it (``RayActorError``, ``ActorUnavailableError`` among them)
#: or never reached it (Serve's ``ReplicaUnavailableError``: the replica it chose left the routing table
#: before the call was sent). Either way the call is sent again, to a replica that is alive
_REPLICA_LOST = (RayActorError, ReplicaUnavailableError)
#: times the ingress sends a batch again when the replica answering it died
RETRIES = 4
_MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/([^/]+))?/?$")
#: what may follow /v2/models/NAME[/versions/1]: "" (metadata) and the actions (generate: a language
#: model's; a tensor model answers it 400, naming infer)
_ACTIONS = ("", "ready", "config", "infer", "generate")


#: Ray's key-value store (the GCS) carries ``RayServer.stop``'s word to every ingress replica: ``drain/APP``
#: written (a fresh token each time) means "answer every new request 503"; each replica answers under
#: ``drain/APP/REPLICA`` with the number of requests it still has in flight and a beat, rewritten at every
#: poll (``"COUNT BEAT"``; ``stop`` waits for every live replica's 0, and takes a key whose value stopped
#: changing for ``DRAIN_STALE_S`` for a dead replica's, left behind: ignored). A token a replica finds when
#: it starts is not for it while it stays the same: a server that died stopping left it on the cluster, and
#: it would have made every later application of that name answer 503 for ever. A live drain rewrites its
#: token every ``DRAIN_REFRESH_S``, so a replica started during one (replacing a dead one) drains too
DRAIN_NAMESPACE = "ptopt"
#: how often an ingress replica looks for that word, and once draining rewrites its count (seconds)
DRAIN_POLL_S = 0.1
#: a replica's count unchanged for this long (20 polls missed) is a dead replica's: ``stop`` ignores it
DRAIN_STALE_S = 2.0
#: how often a live drain rewrites its token (a replica started during it sees the change)
DRAIN_REFRESH_S = 0.25
SHUTTING_DOWN = (
    "the server is shutting down: it takes no new request (those in flight finish); send it again to "
    "another server, or to this one once it is back"
)


def drain_key(app: str, replica: str | None = None) -> str:
    return f"drain/{app}" if replica is None else f"drain/{app}/{replica}"


def model_deployment_name(model: str) -> str:
    return f"model_{model}"


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4)
class PtoptModel:
    """One artifact, loaded once per replica (module docstring)."""

    def __init__(self, root: str, entry: dict[str, Any], threads: int | None, max_tokens: int):
        from ptopt.serve.runtime import ServedModel

        self.model = ServedModel(
            _resolve(root) / entry["path"],
            name=entry["name"],
            allow_pickle=bool(entry.get("allow_pickle")),
            threads=threads,
            max_tokens=max_tokens,
        )
        self._lock: asyncio.Lock | None = None

    async def _one_at_a_time(self, fn: Any, *args: Any) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # the event loop stays free for health checks while the model runs
            return await asyncio.to_thread(fn, *args)

    async def infer(self, requests: list[dict[str, Any]]) -> list[Any]:
        return await self._one_at_a_time(self.model.run_requests, requests)

    async def generate(
        self, prompts: list[str], max_tokens: int, sampling: dict[str, Any] | None = None
    ) -> list[Any]:
        from ptopt.core.errors import PtoptError

        def run() -> list[Any]:
            out: list[Any] = []
            for p in prompts:
                try:
                    out.append(self.model.generate(p, max_tokens, **(sampling or {})))
                except PtoptError as e:  # the request's fault (too long, too many tokens): 400
                    out.append({"error": str(e)})
            return out

        return await self._one_at_a_time(run)

    def metadata(self) -> dict[str, Any]:
        return self.model.metadata()


def _resolve(root: str) -> Path:
    """The package folder: as given, or (relative) under this process's working directory, which Ray
    sets to the application's ``working_dir`` on whichever node a replica runs."""
    path = Path(root)
    return path if path.is_absolute() else Path(os.getcwd()) / path


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX_ONGOING)
class PtoptIngress:
    """The HTTP routes (module docstring)."""

    def __init__(self, handles: dict[str, Any], manifest: dict[str, Any], root: str = "."):
        from ptopt.serve.text_inputs import TextInputs

        self.handles = handles
        self.models = {m["name"]: m for m in manifest["models"]}
        #: the models that take text as well as tensors: their tokenizers (``serve.text_inputs``)
        self.texts: dict[str, TextInputs] = {}
        #: why a model packaged with a tokenizer takes no text here (its tokenizer cannot be read here)
        self.no_text: dict[str, str] = {}
        for name, m in self.models.items():
            if m.get("tokenizer"):
                try:
                    self.texts[name] = TextInputs(_resolve(root) / m["tokenizer"], m["inputs"])
                except Exception as e:  # noqa: BLE001 - tensors still served; text requests told why
                    self.no_text[name] = (
                        f"its tokenizer cannot be loaded here ({str(e).splitlines()[0][:200]})"
                    )
                    logger.warning("model %s: no text input: %s", name, self.no_text[name])
        self.limit = int(manifest["max_request_bytes"])
        self.max_tokens = int(manifest.get("max_tokens", 256))
        self.meta: dict[str, dict[str, Any]] = {}
        self.max_rows = {
            name: max(1, min(int(manifest["max_batch_size"]), int(m["max_batch"])))
            for name, m in self.models.items()
        }
        self.batchers = {
            name: self._batcher(name, m, manifest) for name, m in self.models.items() if m["kind"] == "tensor"
        }
        #: set once ``stop`` asked this application to drain: every new request is a JSON 503
        self.draining = False
        self.inflight = 0  # requests being answered (not those refused while draining)
        self._watcher: asyncio.Task | None = None
        self._watch()

    # -- draining ------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Look for ``stop``'s word to drain, from this replica's event loop (Serve runs the constructor
        in it; a direct call without a loop, as the tests make, starts the watch at its first request)."""
        if self._watcher is None:
            with contextlib.suppress(RuntimeError):  # no running loop
                self._watcher = asyncio.get_running_loop().create_task(self._watch_drain())

    async def _watch_drain(self) -> None:
        """Every :data:`DRAIN_POLL_S`: whether ``drain/APP`` holds a token other than the one found at
        this replica's start (:data:`DRAIN_NAMESPACE`; a live drain rewrites its own); once it does, this
        replica's requests in flight and a beat under ``drain/APP/REPLICA`` at every poll (a live
        replica's key keeps changing)."""
        from ray.experimental import internal_kv as kv

        try:
            context = serve.get_replica_context()
        except Exception:  # noqa: BLE001 - not in a Serve replica (the class called directly): no word comes
            return
        app, me, beat, stale = context.app_name, context.replica_id.unique_id, 0, None
        with contextlib.suppress(Exception):  # the GCS out of reach: no stale word to ignore
            stale = await asyncio.to_thread(kv._internal_kv_get, drain_key(app), namespace=DRAIN_NAMESPACE)
        while True:
            await asyncio.sleep(DRAIN_POLL_S)
            try:
                if not self.draining:
                    found = await asyncio.to_thread(
                        kv._internal_kv_get, drain_key(app), namespace=DRAIN_NAMESPACE
                    )
                    self.draining = found is not None and found != stale
                if self.draining:
                    beat += 1
                    said = f"{self.inflight} {beat}"
                    await asyncio.to_thread(
                        kv._internal_kv_put, drain_key(app, me), said, True, namespace=DRAIN_NAMESPACE
                    )
            except Exception as e:  # noqa: BLE001 - the GCS out of reach a moment: look again
                logger.warning("ingress: cannot read the drain flag (%s); trying again", e)

    async def _batched(self, name: str, arrays: dict[str, Any]) -> Any:
        """The model's answer to one request: through Serve's batcher, or alone when the request has more
        rows than a batch holds (Serve refuses such an item with a RuntimeError: an HTTP 500)."""
        if int(next(iter(arrays.values())).shape[0]) > self.max_rows[name]:
            return (await self._call(name, "infer", [arrays]))[0]
        return await self.batchers[name](arrays)

    def _batcher(self, name: str, model: dict[str, Any], manifest: dict[str, Any]) -> Any:
        max_rows = self.max_rows[name]

        @serve.batch(
            max_batch_size=max_rows,
            batch_wait_timeout_s=float(manifest["batch_wait_ms"]) / 1000.0,
            max_concurrent_batches=int(manifest["concurrent_batches"]),
            batch_size_fn=lambda items: sum(int(next(iter(i.values())).shape[0]) for i in items),
        )
        async def run(items: list[dict[str, Any]]) -> list[Any]:
            return await self._call(name, "infer", items)

        return run

    async def _call(self, name: str, method: str, *args: Any) -> Any:
        """A model replica's answer; sent again when the replica died answering (module docstring)."""
        delay = 0.05
        for attempt in range(RETRIES + 1):
            try:
                return await getattr(self.handles[name], method).remote(*args)
            except _REPLICA_LOST as e:
                if attempt == RETRIES:
                    raise oip.ProtocolError(
                        503,
                        f"model {name!r}: the replica answering this request was lost and {RETRIES} "
                        f"retries on other replicas failed ({type(e).__name__}); try again",
                    ) from None
                logger.warning("model %s: replica lost (%s); sending the batch again", name, type(e).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    # -- HTTP --------------------------------------------------------------------------------
    async def __call__(self, request: Request) -> Response:
        self._watch()
        if self.draining:
            status, content, headers = _json(503, {"error": SHUTTING_DOWN})
        else:
            self.inflight += 1
            try:
                status, content, headers = await self._answer(request)
            finally:
                self.inflight -= 1
        content = oip.compress(content, headers, request.headers.get("accept-encoding"))
        return Response(content, status_code=status, headers=headers)

    async def _answer(self, request: Request) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers), a failure included: the protocol's JSON error, never Serve's plain
        500 (an unexpected one is logged with its traceback, and is a 503 while the server stops)."""
        path = request.scope.get("path", "")[len(request.scope.get("root_path", "")) :] or "/"
        try:
            body = await self._body(request) if request.method == "POST" else b""
            return await self.respond(request.method, path, dict(request.headers), body)
        except oip.ProtocolError as e:
            return e.status, e.body(), {"Content-Type": "application/json"}
        except Exception as e:  # noqa: BLE001 - a bug or a lost model deployment: said in JSON, logged whole
            logger.exception("ingress: %s %s failed", request.method, path)
            if self.draining:
                return _json(503, {"error": f"{SHUTTING_DOWN} ({type(e).__name__} while stopping)"})
            if isinstance(e, _UNAVAILABLE):  # Serve's own word that a model deployment cannot take it now
                return _json(
                    503, {"error": f"model deployment unavailable ({type(e).__name__}: {e}); try again"[:500]}
                )
            return _json(500, {"error": f"internal error: {type(e).__name__}: {e}"[:500]})

    async def _body(self, request: Request) -> bytes:
        """The request body, refused (413) past the limit without reading the rest."""
        declared = request.headers.get("content-length")
        too_big = oip.ProtocolError(
            413,
            f"the request body is over the limit of {self.limit} bytes (ptopt serve --max-request-size)",
            limit_bytes=self.limit,
        )
        if declared and declared.isdigit() and int(declared) > self.limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.limit:
                raise too_big
            chunks.append(chunk)
        return oip.decode_content(b"".join(chunks), request.headers.get("content-encoding"), self.limit)

    async def respond(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        """(status, body, headers) for one request: the route table."""
        if path.rstrip("/") == "/v2":
            return _json(
                200,
                {"name": "ptopt", "version": _version(), "extensions": ["binary_tensor_data", "generate"]},
            )
        if path.startswith("/v2/health/"):
            return await self._health(path)
        if path.rstrip("/") == "/v2/repository/index":
            index = [{"name": n, "version": oip.MODEL_VERSION, "state": "READY"} for n in self.models]
            return _json(200, index)
        if path.startswith("/predictions/"):
            _method(method, "POST", path)
            return await self._predict(path[len("/predictions/") :].strip("/"), body)
        m = _MODEL_ROUTE.match(path)
        if not m:
            raise oip.ProtocolError(404, _no_route(method, path))
        name, version, action = m.group(1), m.group(2), m.group(3) or ""
        self._model(name, version)
        self._action(name, action)
        if action in ("infer", "generate"):
            _method(method, "POST", path)
            if action == "generate" or self.models[name]["kind"] == "text":
                return await self._text(name, body, headers, action)
            return await self._infer(name, body, headers)
        _method(method, "GET", path)
        if action == "ready":
            return (
                (200, b"", {})
                if await self._ready(name)
                else _json(503, {"error": f"model {name!r} is not ready"})
            )
        meta = await self._metadata(name)
        if action == "config":
            return _json(200, _config(meta, self.models[name], optional=name in self.texts))
        return _json(200, meta)

    def _model(self, name: str, version: str | None) -> None:
        if name not in self.models:
            known = ", ".join(sorted(self.models))
            raise oip.ProtocolError(404, f"unknown model {name!r}; this server serves: {known}")
        if version not in (None, "", oip.MODEL_VERSION):
            raise oip.ProtocolError(
                404, f"model {name!r} has version {oip.MODEL_VERSION} only, not {version!r}"
            )

    def _action(self, name: str, action: str) -> None:
        """An endpoint this model does not have (``generate_stream``: no streaming here) is a 404 naming
        the model and the endpoints it has."""
        if action in _ACTIONS:
            return
        kind = self.models[name]["kind"]
        base = f"/v2/models/{name}"
        have = [f"GET {base}", f"GET {base}/ready", f"GET {base}/config", f"POST {base}/infer"]
        have += [f"POST {base}/generate"] if kind == "text" else []
        if action != "generate_stream":
            why = "no such endpoint"
        elif kind == "text":
            why = "this server does not stream tokens: POST .../generate answers the whole text at once"
        else:
            why = "this server streams nothing, and this model takes tensors, not text"
        raise oip.ProtocolError(
            404, f"model {name!r} has no {action!r} endpoint ({why}); its endpoints: {', '.join(have)}"
        )

    async def _health(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        which = path[len("/v2/health/") :].strip("/")
        if which == "live":
            return 200, b"", {}
        if which == "ready":
            ready = all(await asyncio.gather(*(self._ready(n) for n in self.models)))
            return (200, b"", {}) if ready else _json(503, {"error": "not every model has a replica ready"})
        raise oip.ProtocolError(404, f"no route /v2/health/{which} (live or ready)")

    async def _ready(self, name: str) -> bool:
        try:
            await asyncio.wait_for(self._metadata(name), timeout=5.0)
        except (asyncio.TimeoutError, *_REPLICA_LOST, oip.ProtocolError):
            return False
        return True

    async def _metadata(self, name: str) -> dict[str, Any]:
        if name not in self.meta:
            from ptopt.serve.labels import with_label_output
            from ptopt.serve.pooling import with_pooled_output
            from ptopt.serve.text_inputs import with_text_input

            meta = await self._call(name, "metadata")
            meta = with_text_input(meta, self.texts[name]) if name in self.texts else meta
            meta = with_pooled_output(meta, self.models[name].get("pooling"))
            self.meta[name] = with_label_output(meta, self.models[name].get("labels"))
        return self.meta[name]

    async def _infer(
        self, name: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, dict[str, str]]:
        request = oip.parse_infer_request(body, oip.header(headers, oip.HEADER_LENGTH))
        arrays, parameters = self._arrays(name, request)
        answer = await self._batched(name, arrays)
        if isinstance(answer, str):
            raise oip.ProtocolError(422, answer)
        answer = self._added_outputs(name, arrays, answer)
        content, out_headers = oip.encode_infer_response(name, request, answer, parameters)
        return 200, content, out_headers

    def _added_outputs(self, name: str, arrays: dict[str, Any], answer: list) -> list:
        """The answer with what the server adds to it: a sentence encoder's ``sentence_embedding``
        (``serve.pooling``), a classifier's ``label`` and ``score`` (``serve.labels``)."""
        from ptopt.serve import labels, pooling

        model = self.models[name]
        outputs = dict(answer)
        hidden, logits = outputs.get(pooling.HIDDEN), outputs.get(labels.LOGITS)
        extra = []
        if model.get("pooling") and hidden is not None and hidden.ndim == 3 and "attention_mask" in arrays:
            extra.append(
                (
                    pooling.OUTPUT,
                    pooling.sentence_embedding(hidden, arrays["attention_mask"], model["pooling"]),
                )
            )
        if model.get("labels") and logits is not None:
            extra += labels.label_output(logits, model["labels"])
        return [*answer, *extra]

    def _arrays(self, name: str, request: oip.InferRequest) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """A tensor model's checked inputs: the request's tensors, or its ``text_input`` tokenized."""
        from ptopt.serve.text_inputs import TEXT_INPUT, request_arrays

        if TEXT_INPUT not in request.inputs:
            return oip.checked_inputs(request, self.models[name]["inputs"]), None
        if name not in self.texts:
            takes = ", ".join(s["name"] for s in self.models[name]["inputs"])
            why = self.no_text.get(name) or (
                "it was packaged without a tokenizer (only an encoder or classifier made from a Hugging Face "
                "folder with one takes text)"
            )
            raise oip.ProtocolError(400, f"model {name!r} takes tensors ({takes}), not {TEXT_INPUT}: {why}")
        return request_arrays(self.texts[name], request)

    async def _text(
        self, name: str, body: bytes, headers: dict[str, str], action: str
    ) -> tuple[int, bytes, dict[str, str]]:
        if self.models[name]["kind"] != "text":
            what = (
                "encodes text_input, it generates no text"
                if name in self.texts
                else "takes tensors, not text"
            )
            raise oip.ProtocolError(400, f"model {name!r} {what}: POST .../infer")
        if action == "generate":
            (prompts, params), request = _generate_request(body), None
        else:
            request = oip.parse_infer_request(body, oip.header(headers, oip.HEADER_LENGTH))
            prompts, params = _text_inputs(request), request.parameters
        params = _parameters(params)
        max_tokens, sampling = _max_tokens(params, self.max_tokens), _sampling(params)
        texts = await self._call(name, "generate", prompts, max_tokens, sampling)
        bad = next((t["error"] for t in texts if isinstance(t, dict)), None)
        if bad is not None:
            raise oip.ProtocolError(400, bad)
        if action == "generate":
            return _json(
                200, {"model_name": name, "model_version": oip.MODEL_VERSION, "text_output": texts[0]}
            )
        import numpy as np

        shape = request.inputs["text_input"].shape  # a [1, 1] prompt (TensorRT-LLM's clients) keeps its shape
        out = np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(shape)
        content, out_headers = oip.encode_infer_response(name, request, [("text_output", out)])
        return 200, content, out_headers

    async def _predict(self, name: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        """The .mar's plain JSON route: ``{"inputs": X}`` (one sample or a batch) -> ``{"outputs": Y}``;
        a model that takes text also takes ``{"inputs": "a text"}``, a list of texts, or of pairs."""
        self._model(name, None)
        if self.models[name]["kind"] != "tensor":
            raise oip.ProtocolError(400, f"model {name!r} generates text: POST /v2/models/{name}/generate")
        checked, one = self._payload_arrays(name, body)
        return await self._predicted(name, checked, one)

    def _payload_arrays(self, name: str, body: bytes) -> tuple[dict[str, Any], bool]:
        """A plain JSON request's checked inputs, and whether it was one sample (no batch dimension)."""
        from ptopt.serve.handler import _arrays_from_payload, _check_array, _decode_body, _expected
        from ptopt.serve.text_inputs import TEXT_INPUT, payload_texts, request_arrays

        model = self.models[name]
        specs = model["inputs"]
        try:
            payload = _decode_body({"body": body})
            texts = payload_texts(payload) if name in self.texts else None
            if texts is not None:
                request = oip.InferRequest({TEXT_INPUT: texts}, {TEXT_INPUT: "BYTES"})
                return request_arrays(self.texts[name], request)[0], isinstance(payload["inputs"], str)
            arrays = _arrays_from_payload(payload, specs, model["input_style"])
            checked, ones = {}, set()
            for spec in specs:
                checked[spec["name"]], one = _check_array(arrays[spec["name"]], spec)
                ones.add(one)
            if len(ones) != 1 or len({a.shape[0] for a in checked.values()}) != 1:
                raise ValueError("inputs disagree on the batch size")
        except ValueError as e:
            raise oip.ProtocolError(400, str(e), expected=_expected(specs)) from None
        return checked, ones.pop()

    async def _predicted(
        self, name: str, checked: dict[str, Any], one: bool
    ) -> tuple[int, bytes, dict[str, str]]:
        from ptopt.serve.handler import _expected

        answer = await self._batched(name, checked)
        if isinstance(answer, str):
            raise oip.ProtocolError(422, answer, expected=_expected(self.models[name]["inputs"]))
        answer = self._added_outputs(name, checked, answer)
        values = {n: _plain(a[0] if one else a) for n, a in answer}
        outputs = next(iter(values.values())) if len(values) == 1 else values
        try:
            return (
                200,
                json.dumps({"outputs": outputs}, allow_nan=False).encode(),
                {"Content-Type": "application/json"},
            )
        except ValueError:
            raise oip.ProtocolError(
                422, "the model's output for this input has NaN or infinite values, which JSON cannot carry"
            ) from None


def _plain(value: Any) -> Any:
    """An output as JSON carries it: numbers as lists, ``BYTES`` (a label) as strings, as the protocol's
    JSON answer writes them (``oip._to_json``), in the output's shape."""
    import numpy as np

    if isinstance(value, np.ndarray) and value.dtype == np.dtype(object):
        return np.array(oip._to_json(value, "BYTES"), dtype=object).reshape(value.shape).tolist()
    if isinstance(value, bytes):
        return oip._to_json(np.array([value], dtype=object), "BYTES")[0]
    return value.tolist()


def _json(status: int, value: Any) -> tuple[int, bytes, dict[str, str]]:
    return status, json.dumps(value).encode(), {"Content-Type": "application/json"}


def _method(got: str, want: str, path: str) -> None:
    if got != want:
        raise oip.ProtocolError(405, f"{path} takes {want}, not {got}")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ptopt")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source tree)
        return "unknown"


def _config(meta: dict[str, Any], model: dict[str, Any], optional: bool = False) -> dict[str, Any]:
    """Triton's model configuration (``GET .../config``), as far as it describes this model, by the rules
    ``package --format triton`` follows (``serve/triton.py``): a batch dimension dynamic in every input
    gives ``max_batch_size`` (the model's max batch) and dims without it, inputs' and outputs' alike;
    otherwise ``max_batch_size: 0`` and whole dims (a language model's too). ``optional``: a model that
    takes ``text_input`` or its tensors (``serve.text_inputs``): every input is optional, and
    ``text_input``'s dims are ``[-1]`` (a text, or a pair, per row)."""
    specs = model.get("inputs") or []
    batched = (
        model.get("kind", "tensor") == "tensor"
        and bool(specs)
        and all(s["min_shape"] and s["min_shape"][0] != s["max_shape"][0] for s in specs)
    )

    def tensors(meta_tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "name": t["name"],
                "data_type": "TYPE_" + t["datatype"].replace("BYTES", "STRING"),
                "dims": list(t["shape"][1:] if batched else t["shape"]),
            }
            for t in meta_tensors
        ]

    inputs = tensors(meta["inputs"])
    for t in inputs if optional else []:
        t["optional"] = True
        if t["data_type"] == "TYPE_STRING":
            t["dims"] = [-1]
    return {
        "name": meta["name"],
        "platform": meta["platform"],
        "max_batch_size": int(model.get("max_batch", 0)) if batched else 0,
        "input": inputs,
        "output": tensors(meta["outputs"]),
    }


def _max_tokens(params: Any, limit: int) -> int:
    value = (params or {}).get("max_tokens", min(16, limit))  # the default never above the server's limit
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise oip.ProtocolError(400, f"max_tokens {value!r}: give an integer from 1 to {limit}")
    return value


def _parameters(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise oip.ProtocolError(400, f'"parameters" must be a JSON object, got {type(params).__name__}')
    return params


def _sampling(params: dict[str, Any]) -> dict[str, Any]:
    """The request's temperature and seed (``serve.runtime.sampling_options``), checked here: a bad
    value is a 400 naming the field, and never reaches a replica."""
    from ptopt.core.errors import UsageError
    from ptopt.serve.runtime import sampling_options

    try:
        return sampling_options(params)
    except UsageError as e:
        raise oip.ProtocolError(400, str(e)) from None


#: prompts one infer request may hold (a language model generates them one after the other)
def _no_route(method: str, path: str) -> str:
    """A 404's message: a path under /v2 is an endpoint this server lacks (Triton's model control,
    logging, trace or statistics extensions), any other is outside the protocol."""
    if path.rstrip("/") == "/v2" or path.startswith("/v2/"):
        return (
            f"no route {method} {path}: this server answers the Open Inference Protocol's health, "
            "metadata, repository index, infer and generate (GET /v2 lists its extensions), not Triton's "
            "model control, logging, trace or statistics"
        )
    return f"no route {method} {path} (the Open Inference Protocol's are under /v2)"


MAX_PROMPTS = 32


def _generate_request(body: bytes) -> tuple[list[str], Any]:
    """(prompts, parameters) of a generate request's JSON body."""
    req = oip.json_body(body, '{"text_input": "..."}')
    if not isinstance(req, dict) or not isinstance(req.get("text_input"), str):
        raise oip.ProtocolError(400, 'the generate request must be a JSON object with a "text_input" string')
    return [req["text_input"]], req.get("parameters")


def _text_inputs(request: oip.InferRequest) -> list[str]:
    if set(request.inputs) != {"text_input"} or request.datatypes["text_input"] != "BYTES":
        got = ", ".join(f"{n} ({request.datatypes[n]})" for n in request.inputs)
        raise oip.ProtocolError(400, f"a language model takes one input text_input (BYTES), got {got}")
    prompts = [v.decode("utf-8", "replace") for v in request.inputs["text_input"].reshape(-1).tolist()]
    if not prompts:
        raise oip.ProtocolError(400, "text_input holds no text")
    if len(prompts) > MAX_PROMPTS:  # each is generated in turn while the replica is held
        raise oip.ProtocolError(
            400, f"text_input holds {len(prompts)} prompts: send at most {MAX_PROMPTS} a request"
        )
    return prompts


# -- the application ---------------------------------------------------------------------------


def build_app(manifest: dict[str, Any], root: str) -> Any:
    """The Serve application for ``manifest`` (the package folder's ``ptopt_ray.json``) whose files lie
    under ``root`` (absolute, or relative to each replica's working directory)."""
    replica_options: dict[str, Any] = {"num_cpus": float(manifest["cpus_per_replica"])}
    handles = {}
    for entry in manifest["models"]:
        scaling = manifest["replicas"]
        options: dict[str, Any] = {
            "name": model_deployment_name(entry["name"]),
            "ray_actor_options": replica_options,
            "max_ongoing_requests": int(manifest["model_max_ongoing"]),
            "graceful_shutdown_wait_loop_s": GRACEFUL_WAIT_LOOP_S,
        }
        if isinstance(scaling, dict):
            options["autoscaling_config"] = {
                "min_replicas": int(scaling["min"]),
                "max_replicas": int(scaling["max"]),
                "target_ongoing_requests": float(scaling["target_ongoing_requests"]),
            }
        else:
            options["num_replicas"] = int(scaling)
        handles[entry["name"]] = PtoptModel.options(**options).bind(
            root, entry, manifest.get("threads"), int(manifest.get("max_tokens", 256))
        )
    return PtoptIngress.options(
        name=INGRESS,
        num_replicas=int(manifest.get("ingress_replicas", 1)),
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_wait_loop_s=GRACEFUL_WAIT_LOOP_S,
    ).bind(handles, manifest, root)


def app_from_folder(folder: str | os.PathLike = ".") -> Any:
    """The application of a package folder (``ptopt package --format ray``), read from its manifest."""
    folder = Path(folder).resolve()
    # in a replica of a cluster, the folder is the working_dir Ray unpacked, under another path per node
    root = "." if folder == Path(os.getcwd()).resolve() else str(folder)
    return build_app(read_manifest(folder), root)
