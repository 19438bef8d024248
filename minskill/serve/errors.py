"""What every endpoint of minskill.serve.server answers a bad request with, and the check each
makes first.

`BackendError(status, message, type, code, param)` is the error a request is answered with (the
server writes it as OpenAI's {"error": {...}} body); `bad_request(message, param)` is its 400
invalid_request_error, naming the field at fault; `check_body_and_model(payload, backend)` is the
check every endpoint (minskill.serve.backends' chat completions, minskill.serve.embeddings) makes
before reading its own fields. """
from __future__ import annotations


class BackendError(Exception):
    """Raised by a backend (or a scripted fn) to answer a request with this HTTP status."""

    def __init__(self, status: int, message: str, type: str = "server_error",
                 code: str | None = None, param: str | None = None,
                 retry_after: float | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code
        self.param, self.retry_after, self.headers = param, retry_after, headers or {}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> BackendError:
    return BackendError(400, message, "invalid_request_error", code, param)


def check_body_and_model(payload, backend) -> None:
    """The body is a JSON object and its `model`, if given, is `backend.name`, the one served (else
    400 / 404)."""
    if not isinstance(payload, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(payload).__name__}")
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {type(model).__name__}", "model")
    if model is not None and model != backend.name:  # as OpenAI and vLLM answer it
        raise BackendError(404, f"the model {model!r} does not exist: this server serves "
                                f"{backend.name!r} (GET /v1/models lists it)",
                                "invalid_request_error", "model_not_found", "model")
