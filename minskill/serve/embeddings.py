"""Text embeddings from a minskill model, and the /v1/embeddings endpoint of minskill.serve.server.

A text's embedding is the mean of its tokens' final hidden states (the output of the last RMSNorm,
what the LM head reads), scaled to unit length:

    m = (1/T) · Σ_t h_t,      e = m / ||m||_2,      h_t = norm(x_t^(L)) for the T tokens of the text

so the cosine similarity of two texts is the dot product of their vectors. The text is encoded as
plain characters (special-token text in it is no control token, as in chat contents), without a
chat template and without a BOS token: the vector is of the text alone. A causal LM's pooled states
are a weak but usable embedding, enough for retrieving skills offline with the embedded default; a
real embedding model behind another OpenAI-compatible URL does better. Texts are batched
`batch_size` at a time, sorted by length and left padded; the attention mask is also the pooling
weight, so pads never count.

Request, as OpenAI's API has it: {"input": "text" | ["text", ...], "model"?: name,
"encoding_format"?:
"float" | "base64", "dimensions"?: the model's hidden size only, "user"?: ignored}. Reply:
{"object":
"list", "data": [{"object": "embedding", "index": i, "embedding": [floats] | base64}], "model",
"usage": {"prompt_tokens", "total_tokens"}}. base64 is the little-endian float32 bytes, as OpenAI
sends them (the official Python client asks for base64 unless told otherwise). Refused with a 400
naming the field: an input that is not a string or a non-empty list of strings (token-id arrays
included: send text), an empty string, more than MAX_INPUTS inputs, an input longer than the
model's context, another encoding_format or dimensions.
"""
from __future__ import annotations

import base64
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from minskill.serve.errors import bad_request, check_body_and_model

MAX_INPUTS = 2048        # inputs in one request, as OpenAI allows
ENCODINGS = ("float", "base64")


@dataclass
class EmbeddingRequest:
    """A validated /v1/embeddings request: the texts, each one's tokens (as its backend counts
    them)."""
    texts: list[str]
    tokens: list[list]
    encoding_format: str = "float"
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def mean_pooled_embeddings(model, token_lists: list[list[int]], pad_id: int = 0,
                           batch_size: int = 16, should_stop=None) -> torch.Tensor:
    """(N, H) float32 unit vectors: e = normalise(mean_t h_t) per token list (see the module
    docstring). should_stop() is asked before each batch; True raises RuntimeError (the client has
    gone)."""
    # similar lengths pad less
    order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))
    out = torch.empty(len(token_lists), model.config.hidden_size, dtype=torch.float32)
    for start in range(0, len(order), batch_size):
        if should_stop is not None and should_stop():
            raise RuntimeError("embedding cancelled: the client has gone")
        rows = order[start:start + batch_size]
        width = max(len(token_lists[i]) for i in rows)
        ids = torch.tensor(
            [[pad_id] * (width - len(token_lists[i])) + list(token_lists[i]) for i in rows],
            device=model.device,
        )
        mask = torch.tensor(
            [[0] * (width - len(token_lists[i])) + [1] * len(token_lists[i]) for i in rows],
            device=model.device,
        )
        hidden = model.hidden_states(ids, mask).float()                           # (B, T, H)
        weight = mask[..., None].float()
        mean = (hidden * weight).sum(1) / weight.sum(1)                            # pads weigh 0
        out[torch.tensor(rows)] = F.normalize(mean, dim=-1).cpu()
    return out


def parse_embeddings_request(payload, backend) -> EmbeddingRequest:
    """Validate a decoded /v1/embeddings body for `backend`; BackendError(400/404) naming the
    problem."""
    check_body_and_model(payload, backend)
    if getattr(backend, "embedding_tokens", None) is None:
        raise bad_request(f"the model {backend.name!r} serves no embeddings", "model",
                          "embeddings_not_supported")
    texts = payload.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts:
        raise bad_request(f"'input' must be a string or a non-empty list of strings, got "
                           f"{payload.get('input')!r:.100}", "input")
    if len(texts) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(texts)} entries; at most {MAX_INPUTS} per request",
                          "input")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            hint = " (token-id arrays are not accepted: send text)" if isinstance(text,
                    (int, list)) else ""
            raise bad_request(f"input[{i}] must be a string, got {type(text).__name__}{hint}",
                              f"input[{i}]")
        if not text:
            raise bad_request(f"input[{i}] is an empty string: there is nothing to embed",
                              f"input[{i}]")
    encoding = payload.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise bad_request(f"'encoding_format' must be one of {', '.join(ENCODINGS)}, got "
                          f"{encoding!r:.100}",
                           "encoding_format")
    tokens = [backend.embedding_tokens(text) for text in texts]
    for i, ids in enumerate(tokens):
        if not ids:
            raise bad_request(f"input[{i}] has no tokens: there is nothing to embed", f"input[{i}]")
        if len(ids) > backend.max_context:
            raise bad_request(f"input[{i}] has {len(ids)} tokens but the model's context is "
                               f"{backend.max_context}", f"input[{i}]", "context_length_exceeded")
    dimensions = payload.get("dimensions")
    if dimensions is not None:
        size = getattr(getattr(getattr(backend, "model", None), "config", None), "hidden_size",
                       None)
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions != size:
            raise bad_request(f"'dimensions' can only be this model's embedding size ({size}), got "
                               f"{dimensions!r:.50}", "dimensions")
    return EmbeddingRequest(texts, tokens, encoding)


def embeddings_reply(request: EmbeddingRequest, vectors, model_name: str) -> dict:
    """OpenAI's /v1/embeddings reply body for `vectors` (one per input, a tensor or lists of
    floats)."""
    if len(vectors) != len(request.texts):
        raise RuntimeError(f"backend returned {len(vectors)} embeddings for {len(request.texts)} "
                           f"inputs")
    data = []
    for i, vector in enumerate(vectors):
        array = np.asarray(vector.tolist() if torch.is_tensor(vector) else vector, dtype="<f4")
        embedding = (base64.b64encode(array.tobytes()).decode("ascii") if request.encoding_format
                     == "base64"
                     else array.tolist())
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    tokens = request.prompt_tokens
    return {"object": "list", "data": data, "model": model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
